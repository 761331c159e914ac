"""Interop: the Helm chart's renderings applied to a real kube-apiserver 1.37 (dry run).

``helm template`` (the real helm v4.3.2, ``tests/conftest.py``) renders the chart for
release ``kdh-interop`` in namespace ``kdh-helm``; every object is sent as a server-side
apply with ``dryRun=All`` through the official client's ``DynamicClient``, so the API
server decodes, defaults, validates and admits it (RBAC escalation checks, the
ValidatingAdmissionPolicy's CEL) without storing it. Only the
namespace is created for real, since namespaced objects cannot be dry-run into a namespace
that does not exist. (Priority classes are resolved for pods, not for a DaemonSet's template.)

Last, a rendering for another release is created for real (all but the DaemonSet): with
a token of the chart's service account bound to a pod on a node, a status write to a pod
on another node is denied by the chart's policy and one on its own node is allowed by the
chart's RBAC.

And the real ``helm install``, ``upgrade`` and ``uninstall`` against that API server, as
docs/helm.md tells users (``--create-namespace``; an existing namespace with
``namespace.create=false``).

The ServiceMonitor and PrometheusRule need the Prometheus Operator's CRDs: the real ones of
a pinned operator release, fetched from the Go module proxy at test time
(``_operator_crds``; skipped with the reason without Go or the proxy), are created on the API
server. The chart's renderings of both are then validated against those schemas (a dry
run, then one real create read back), and so is ``deploy/monitoring/prometheusrule.yaml``;
objects with one wrong field (a type, a pattern, an enum, an unknown name) are refused.
"""

from __future__ import annotations

import contextlib
import copy
import json
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from kubelet_dra.status.podjson import MutableObj as Obj
from tests.deploy._chart import CHART, HelmError, render, run_helm
from tests.deploy._monitoring import PROMETHEUS_RULE

from . import _operator_crds
from ._apiserver import KubeApiServer
from ._build import BuildUnavailable
from ._cluster import RealCluster, poll
from .test_interop_vap import workloads, write_condition

pytestmark = [pytest.mark.interop, pytest.mark.timeout(180)]

RELEASE = "kdh-interop"
NAMESPACE = "kdh-helm"
MANAGER = "kdh-chart-test"
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}

EVERY_OPTION: Obj = {
    "image": {"repository": "registry.example.com/kdh", "digest": "sha256:" + "0f" * 32},
    "imagePullSecrets": [{"name": "regcred"}],
    "serviceAccount": {"annotations": {"example.com/owner": "gpu-team"}},
    "admissionPolicy": {"validationActions": ["Warn", "Audit"]},
    "sidecar": {
        "containerStatus": "off",
        "podConditionType": "GpuHealthy",
        "healthTimeout": 45,
        "logFormat": "json",
        "verbosity": 1,
        "extraEnv": [{"name": "KUBELET_DRA_API_QPS", "value": "20"}],
    },
    "paths": {
        "pluginsRegistry": "/var/lib/k0s/kubelet/plugins_registry",
        "plugins": "/var/lib/k0s/kubelet/plugins",
        "state": "/var/lib/k0s/kubelet-dra-health",
    },
    "taint": {
        "effect": "NoExecute",
        "after": 10,
        "unknownAfter": 300,
        "untaintAfter": 60,
        "key": "example.com/broken",
    },
    "metrics": {"host": "0.0.0.0", "port": 9500, "service": {"enabled": True}},
    "nodeSelector": {"example.com/gpu": "true"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["yes"]}]}
                ]
            }
        }
    },
    "priorityClassName": "system-cluster-critical",
    "maxUnavailable": "10%",
    "resources": {"requests": {"cpu": "50m", "memory": "200Mi"}, "limits": {"memory": "400Mi"}},
    "podSecurityContext": {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "supplementalGroups": [2000],
        "seccompProfile": {"type": "RuntimeDefault"},
    },
    "podAnnotations": {"example.com/team": "gpu"},
    "podLabels": {"example.com/team": "gpu"},
}


@pytest.fixture
def dynamic(kube_apiserver: KubeApiServer) -> Iterator[DynamicClient]:
    with kube_apiserver.api_client() as api:
        yield DynamicClient(api)


def _apply(dynamic: DynamicClient, obj: Obj, *, dry_run: bool = True) -> Obj:
    resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    kwargs: dict[str, Any] = {"field_manager": MANAGER, "force_conflicts": True}
    if dry_run:
        kwargs["dry_run"] = "All"
    answer = dynamic.server_side_apply(
        resource, body=obj, namespace=obj["metadata"].get("namespace"), **kwargs
    )
    result: Obj = answer.to_dict()
    return result


def _exists(dynamic: DynamicClient, obj: Obj) -> bool:
    resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    try:
        resource.get(name=obj["metadata"]["name"], namespace=obj["metadata"].get("namespace"))
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def _apply_rendering(dynamic: DynamicClient, objects: list[Obj]) -> dict[str, Obj]:
    """Dry-run every object (the namespace for real first); kind -> the server's answer."""
    answers: dict[str, Obj] = {}
    for obj in objects:
        if obj["kind"] == "Namespace":
            answers["Namespace"] = _apply(dynamic, obj)
            _apply(dynamic, obj, dry_run=False)
    for obj in objects:
        if obj["kind"] in CRD_KINDS or obj["kind"] == "Namespace":
            continue
        assert not _exists(dynamic, obj), f"{obj['kind']} {obj['metadata']['name']} exists"
        answer = _apply(dynamic, obj)
        assert (answer["kind"], answer["metadata"]["name"]) == (
            obj["kind"],
            obj["metadata"]["name"],
        )
        managers = {m["manager"] for m in answer["metadata"].get("managedFields", [])}
        assert MANAGER in managers, answer["metadata"]
        # A dry run stores nothing.
        assert not _exists(dynamic, obj), f"dry run stored {obj['kind']}"
        answers[obj["kind"]] = answer
    return answers


def _kinds(objects: list[Obj]) -> set[str]:
    return {o["kind"] for o in objects}


def test_default_rendering_is_accepted(helm_bin: Path, dynamic: DynamicClient) -> None:
    objects = render(helm_bin, release=RELEASE, namespace=NAMESPACE)
    answers = _apply_rendering(dynamic, objects)
    assert (
        set(answers)
        == _kinds(objects)
        == {
            "Namespace",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "DaemonSet",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        }
    )
    daemonset = answers["DaemonSet"]
    # Defaulted by the server: it decoded and processed the object.
    assert daemonset["spec"]["revisionHistoryLimit"] == 10
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert daemonset["spec"]["template"]["spec"]["priorityClassName"] == "system-node-critical"
    subject = answers["ClusterRoleBinding"]["subjects"][0]
    assert (subject["name"], subject["namespace"]) == (f"{RELEASE}-kubelet-dra-health", NAMESPACE)


def test_every_option_rendering_is_accepted(helm_bin: Path, dynamic: DynamicClient) -> None:
    objects = render(helm_bin, EVERY_OPTION, release=RELEASE, namespace=NAMESPACE)
    answers = _apply_rendering(dynamic, objects)
    assert {"Service", "DaemonSet", "ClusterRole"} <= set(answers)
    rules = answers["ClusterRole"]["rules"]
    assert any("devicetaintrules" in r["resources"] for r in rules)
    spec = answers["DaemonSet"]["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "system-cluster-critical"
    assert spec["securityContext"]["runAsUser"] == 65532
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["KUBELET_DRA_TAINT_EFFECT"] == "NoExecute"
    assert answers["Service"]["spec"]["clusterIP"] == "None"


def test_server_refuses_an_invalid_rendering(helm_bin: Path, dynamic: DynamicClient) -> None:
    """The dry run validates: a label key the schema lets through is refused by the server."""
    objects = render(
        helm_bin, {"nodeSelector": {"not a valid key!": "x"}}, release=RELEASE, namespace=NAMESPACE
    )
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    with pytest.raises(ApiException) as refused:
        _apply(dynamic, daemonset)
    assert refused.value.status == 422
    assert "nodeSelector" in (refused.value.body or "")


# -- the ServiceMonitor and PrometheusRule against the Prometheus Operator's real CRDs ---

MONITORING_VALUES: Obj = {
    "metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}
}


def _established(dynamic: DynamicClient, name: str) -> bool:
    crds = dynamic.resources.get(
        api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition"
    )
    conditions = crds.get(name=name).to_dict().get("status", {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def _served(dynamic: DynamicClient, kind: str) -> bool:
    try:
        dynamic.resources.get(api_version="monitoring.coreos.com/v1", kind=kind)
    except ResourceNotFoundError:
        return False  # not yet in discovery (the lookup refreshes its cache on a miss)
    return True


@pytest.fixture
def operator_crds(dynamic: DynamicClient) -> dict[str, Obj]:
    """The operator's ServiceMonitor and PrometheusRule CRDs, created on the API server.

    Fetched from the Go module proxy at a pinned release (``_operator_crds``; skips without
    Go or the proxy). Created for real and left in place: cluster-wide, but nothing else in
    the session uses monitoring.coreos.com, and a second apply of the same CRD is a no-op.
    """
    try:
        crds = _operator_crds.operator_crds()
    except BuildUnavailable as exc:
        pytest.skip(f"interop: the Prometheus Operator's CRDs unavailable: {exc.reason}")
    for kind, crd in crds.items():
        _apply(dynamic, crd, dry_run=False)
        name = crd["metadata"]["name"]
        poll(partial(_established, dynamic, name), 30, f"CRD {name} Established")
        poll(partial(_served, dynamic, kind), 30, f"monitoring.coreos.com/v1 {kind} in discovery")
    return crds


def _contains(actual: Any, expected: Any) -> bool:
    """Everything in ``expected`` is in ``actual`` (which may have server defaults on top)."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            k in actual and _contains(actual[k], v) for k, v in expected.items()
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(expected)
            and all(_contains(a, e) for a, e in zip(actual, expected, strict=True))
        )
    return bool(actual == expected)


def _alerts(rule: Obj) -> list[str]:
    return [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]


def test_monitoring_objects_are_accepted_by_the_operator_crds(
    helm_bin: Path, dynamic: DynamicClient, operator_crds: dict[str, Obj]
) -> None:
    """The chart's ServiceMonitor and PrometheusRule, validated by the API server against
    the operator's real CRD schemas: a dry run, then one real create read back."""
    objects = render(helm_bin, MONITORING_VALUES, release=RELEASE, namespace=NAMESPACE)
    monitoring = [o for o in objects if o["kind"] in CRD_KINDS]
    assert _kinds(monitoring) == CRD_KINDS == set(operator_crds)
    answers = _apply_rendering(dynamic, objects)
    assert "Service" in answers
    for obj in monitoring:
        assert not _exists(dynamic, obj), f"{obj['kind']} {obj['metadata']['name']} exists"
        answer = _apply(dynamic, obj)
        assert (answer["kind"], answer["metadata"]["name"]) == (
            obj["kind"],
            obj["metadata"]["name"],
        )
        # Unknown fields would have been refused; what we sent comes back unpruned.
        assert _contains(answer["spec"], obj["spec"]), answer["spec"]
        assert not _exists(dynamic, obj), f"dry run stored {obj['kind']}"
    # The PrometheusRule sent carries the alerts of deploy/monitoring, every one of them.
    rule = next(o for o in monitoring if o["kind"] == "PrometheusRule")
    deployed = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert _alerts(rule) == _alerts(deployed) != []

    resources = {
        o["kind"]: dynamic.resources.get(api_version=o["apiVersion"], kind=o["kind"])
        for o in monitoring
    }
    try:
        for obj in monitoring:
            _apply(dynamic, obj, dry_run=False)
            stored = (
                resources[obj["kind"]]
                .get(name=obj["metadata"]["name"], namespace=NAMESPACE)
                .to_dict()
            )
            assert _contains(stored["spec"], obj["spec"]), stored["spec"]
            assert _contains(stored["metadata"]["labels"], obj["metadata"]["labels"])
    finally:
        for obj in monitoring:
            with contextlib.suppress(ApiException):
                resources[obj["kind"]].delete(name=obj["metadata"]["name"], namespace=NAMESPACE)


def test_deploy_prometheusrule_is_accepted(
    dynamic: DynamicClient, operator_crds: dict[str, Obj]
) -> None:
    """deploy/monitoring/prometheusrule.yaml, as `kubectl apply` would send it (dry run)."""
    rule: Obj = yaml.safe_load(PROMETHEUS_RULE.read_text())
    namespace = rule["metadata"]["namespace"]
    core = dynamic.resources.get(api_version="v1", kind="Namespace")
    try:
        core.create(body={"metadata": {"name": namespace}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    answer = _apply(dynamic, rule)
    assert answer["metadata"]["name"] == rule["metadata"]["name"]
    assert _contains(answer["spec"], rule["spec"]), answer["spec"]
    assert not _exists(dynamic, rule), "dry run stored the PrometheusRule"


def _message(exc: ApiException) -> str:
    """The message of the API server's Status in an error answer."""
    try:
        status = json.loads(exc.body or "")
    except json.JSONDecodeError:
        return str(exc.body)
    return str(status.get("message", ""))


def _with(obj: Obj, path: tuple[str | int, ...], value: Any) -> Obj:
    """A copy of ``obj`` with the field at ``path`` set to ``value``."""
    changed = copy.deepcopy(obj)
    parent: Any = changed
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return changed


@pytest.mark.parametrize(
    ("kind", "path", "value", "message"),
    [
        # A wrong type: the port is named, a string.
        (
            "ServiceMonitor",
            ("spec", "endpoints", 0, "port"),
            9500,
            "spec.endpoints[0].port in body must be of type string",
        ),
        # A duration outside the CRD's pattern.
        (
            "ServiceMonitor",
            ("spec", "endpoints", 0, "interval"),
            "often",
            "spec.endpoints[0].interval in body should match",
        ),
        # An enum: relabel actions are a closed set.
        (
            "ServiceMonitor",
            ("spec", "endpoints", 0, "relabelings", 0, "action"),
            "rename",
            "spec.endpoints[0].relabelings[0].action: Unsupported value",
        ),
        # A rule's `for` is a duration, by the CRD's pattern.
        (
            "PrometheusRule",
            ("spec", "groups", 0, "rules", 0, "for"),
            "five minutes",
            "spec.groups[0].rules[0].for in body should match",
        ),
    ],
    ids=["port-type", "interval-pattern", "relabel-action", "for-pattern"],
)
def test_operator_crds_refuse_an_invalid_object(
    helm_bin: Path,
    dynamic: DynamicClient,
    operator_crds: dict[str, Obj],
    kind: str,
    path: tuple[str | int, ...],
    value: Any,
    message: str,
) -> None:
    """The CRDs' schemas bite: a field the chart could get wrong is refused.

    Sent as a dry-run create (``kubectl create --dry-run=server``), which reaches the CRD's
    OpenAPI validation and its 422. A server-side apply of a wrongly typed field is refused
    earlier, while building the typed patch, with a 500 that says less; checked too.
    """
    objects = render(helm_bin, MONITORING_VALUES, release=RELEASE, namespace=NAMESPACE)
    _apply_rendering(dynamic, [o for o in objects if o["kind"] == "Namespace"])
    (obj,) = [o for o in objects if o["kind"] == kind]
    resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=kind)
    # The rendering itself is accepted ...
    resource.create(body=obj, namespace=NAMESPACE, dry_run="All")
    _apply(dynamic, obj)
    # ... and with the one changed field it is not.
    invalid = _with(obj, path, value)
    with pytest.raises(ApiException) as refused:
        resource.create(body=invalid, namespace=NAMESPACE, dry_run="All")
    assert refused.value.status == 422, refused.value.body
    assert message in _message(refused.value), refused.value.body
    with pytest.raises(ApiException) as refused:
        _apply(dynamic, invalid)
    assert refused.value.status in (422, 500), refused.value.body
    assert ".".join(str(p) for p in path[:2]) in _message(refused.value), refused.value.body


def test_operator_crds_refuse_an_unknown_field(
    helm_bin: Path, dynamic: DynamicClient, operator_crds: dict[str, Obj]
) -> None:
    """A misspelt field is refused, not pruned away in silence (server-side apply)."""
    objects = render(helm_bin, MONITORING_VALUES, release=RELEASE, namespace=NAMESPACE)
    _apply_rendering(dynamic, [o for o in objects if o["kind"] == "Namespace"])
    (monitor,) = [o for o in objects if o["kind"] == "ServiceMonitor"]
    misspelt = _with(monitor, ("spec", "endpoints", 0, "scrapeInterval"), "30s")
    with pytest.raises(ApiException) as refused:
        _apply(dynamic, misspelt)
    assert refused.value.status in (400, 422, 500), refused.value.body
    assert ".spec.endpoints[0].scrapeInterval: field not declared in schema" in _message(
        refused.value
    )
    # kubectl create's default (--validate=strict) refuses it too.
    resource = dynamic.resources.get(api_version=monitor["apiVersion"], kind="ServiceMonitor")
    strict = [("fieldValidation", "Strict")]  # a parameter the dynamic client has no name for
    with pytest.raises(ApiException) as refused:
        resource.create(body=misspelt, namespace=NAMESPACE, dry_run="All", query_params=strict)
    assert refused.value.status in (400, 422), refused.value.body
    assert 'unknown field "spec.endpoints[0].scrapeInterval"' in _message(refused.value)


# -- a rendering installed for real: its RBAC and admission policy at work ------------

REAL_RELEASE = REAL_NAMESPACE = "kdh-real"
REAL_ACCOUNT = f"{REAL_RELEASE}-kubelet-dra-health"


def _node_bound_token(cluster: RealCluster, node: str) -> str:
    """A token of the chart's service account bound to a (new) sidecar pod on ``node``."""
    pod = cluster.create_pod(
        {
            "metadata": {"name": f"sidecar-{node}", "namespace": REAL_NAMESPACE},
            "spec": {
                "nodeName": node,
                "serviceAccountName": REAL_ACCOUNT,
                "containers": [{"name": "sidecar", "image": "registry.invalid/sidecar:1"}],
            },
        }
    )
    bound = {"kind": "Pod", "apiVersion": "v1", "name": pod["metadata"]["name"]}
    request = {"spec": {"audiences": [], "boundObjectRef": bound | {"uid": pod["metadata"]["uid"]}}}
    answer = cluster.core.create_namespaced_service_account_token(
        REAL_ACCOUNT, REAL_NAMESPACE, request
    )
    return str(answer.status.token)


def test_installed_rendering_limits_status_writes_to_own_node(
    helm_bin: Path, dynamic: DynamicClient, kube_apiserver: KubeApiServer
) -> None:
    """The chart's ClusterRole, binding and policy for release "kdh-real" (names and the
    account the policy matches all derived from the release), created for real: the
    sidecar's node-bound token may write the status of its own node's pods only."""
    objects = render(helm_bin, release=REAL_RELEASE, namespace=REAL_NAMESPACE)
    for obj in objects:
        if obj["kind"] != "DaemonSet":  # nothing runs pods here; the rest is what matters
            _apply(dynamic, obj, dry_run=False)
    cluster = RealCluster(kube_apiserver)
    try:
        own, other = f"node-{uuid.uuid4().hex[:8]}", f"node-{uuid.uuid4().hex[:8]}"
        namespace = workloads(cluster, own, other)
        token = _node_bound_token(cluster, own)
        # The policy takes effect once the API server's policy informer has seen it.
        _, denied = poll(
            lambda: (
                (r := write_condition(cluster, token, namespace, "on-other-node"))[0] == 403 and r
            ),
            15,
            "the chart's policy to deny a write to another node's pod",
        )
        assert f"ValidatingAdmissionPolicy '{REAL_ACCOUNT}-own-node'" in denied["message"]
        assert (
            f"may write the status only of pods on its own node; pod {namespace}/on-other-node"
            in (denied["message"])
        )
        # RBAC from the chart's ClusterRole and binding lets the own-node write through.
        assert write_condition(cluster, token, namespace, "on-own-node") == (200, {})
    finally:
        cluster.close()


# -- helm install, upgrade and uninstall against the real API server ----------------


def test_helm_install_upgrade_uninstall(
    helm_bin: Path, dynamic: DynamicClient, kube_apiserver: KubeApiServer
) -> None:
    """The real helm against the real API server, as docs/helm.md tells users to.

    Without --create-namespace the install fails (Helm stores its release record in the
    namespace before creating anything); with it, the chart's Namespace object takes the
    namespace over and labels it for Pod Security.
    """
    release, namespace = "kdh-cli", "kdh-cli"
    chart = str(CHART)
    config = kube_apiserver.kubeconfig

    def helm(*args: str) -> str:
        return run_helm(helm_bin, *args, "--namespace", namespace, kubeconfig=config)

    with pytest.raises(HelmError, match=f'namespaces "{namespace}" not found'):
        helm("install", release, chart)
    out = helm("install", release, chart, "--create-namespace", "--set", "image.tag=0.1.0")
    assert "STATUS: deployed" in out
    core = dynamic.resources.get(api_version="v1", kind="Namespace")
    labels = core.get(name=namespace).metadata.labels
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels["app.kubernetes.io/managed-by"] == "Helm"
    daemonsets = dynamic.resources.get(api_version="apps/v1", kind="DaemonSet")
    name = f"{release}-kubelet-dra-health"
    assert daemonsets.get(name=name, namespace=namespace).metadata.name == name

    out = helm("upgrade", release, chart, "--reuse-values", "--set", "sidecar.healthTimeout=45")
    assert "REVISION: 2" in out
    container = daemonsets.get(name=name, namespace=namespace).spec.template.spec.containers[0]
    env = {e.name: e.value for e in container.env}
    assert env["KUBELET_DRA_HEALTH_TIMEOUT"] == "45"

    assert f'release "{release}" uninstalled' in helm("uninstall", release)
    roles = dynamic.resources.get(api_version="rbac.authorization.k8s.io/v1", kind="ClusterRole")
    for resource, obj_name, obj_namespace in (
        (daemonsets, name, namespace),
        (roles, name, None),
    ):
        with pytest.raises(ApiException) as gone:
            resource.get(name=obj_name, namespace=obj_namespace)
        assert gone.value.status == 404


def test_helm_install_into_an_existing_namespace(
    helm_bin: Path, kube_apiserver: KubeApiServer
) -> None:
    """A namespace made by someone else is not taken over; namespace.create=false works."""
    namespace = f"kdh-own-{uuid.uuid4().hex[:6]}"
    cluster = RealCluster(kube_apiserver)
    try:
        cluster.ensure_namespace(namespace)
    finally:
        cluster.close()

    def helm(*args: str) -> str:
        return run_helm(
            helm_bin, *args, "--namespace", namespace, kubeconfig=kube_apiserver.kubeconfig
        )

    with pytest.raises(HelmError, match="invalid ownership metadata"):
        helm("install", "kdh-a", str(CHART))
    out = helm(
        "install", "kdh-b", str(CHART), "--set", "namespace.create=false",
        "--set", "fullnameOverride=kdh-b",
    )  # fmt: skip
    assert "STATUS: deployed" in out
    helm("uninstall", "kdh-b")
