"""The Helm chart ``deploy/helm/kubelet-dra-health``, checked with the real ``helm``.

Every test that runs ``helm`` runs twice, with Helm 4 (v4.3.2) and Helm 3 (v3.22.0), both
built from the Go module proxy (``tests/deploy/conftest.py``); without Go they skip. Both
get ``--kube-version`` (``_chart.KUBE_VERSION``): a Helm 3 built from source assumes
Kubernetes 1.20. Checked here:

- ``helm lint --strict`` passes, with the defaults and with every option on;
- the default rendering is the objects of ``deploy/`` plus exactly Helm's standard labels on
  each object's metadata (docs/deploy.md, "Helm chart");
- every value in values.yaml has an effect on the rendering, asserted per value, and a test
  fails when values.yaml gains a value no case covers;
- values.schema.json refuses wrong values with helm's error;
- what the sidecar reads from a rendered environment (through ``Settings`` and the CLI
  parser), the admission policy's CEL for another release name, and the PrometheusRule the
  chart renders from ``deploy/monitoring/rules.yaml``.

The rendering applied to a real kube-apiserver is ``tests/interop/test_interop_helm.py``.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubelet_dra import cli
from kubelet_dra.settings import Settings
from kubelet_dra.status.podjson import MutableObj as Obj
from tests.interop import _build
from tests.unit import test_deploy

from ._chart import (
    CHART,
    HELM_LABELS,
    HELMS,
    KUBE_VERSION,
    MONITORING,
    HelmError,
    by_kind,
    deploy_objects,
    one,
    render,
    run_helm,
)

Check = Callable[[list[Obj]], None]


@pytest.fixture(scope="module")
def default(helm_bin: Path) -> list[Obj]:
    return render(helm_bin)


def _key(obj: Obj) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def _daemonset(objects: list[Obj]) -> Obj:
    return one(objects, "DaemonSet")


def _pod_spec(objects: list[Obj]) -> Obj:
    spec: Obj = _daemonset(objects)["spec"]["template"]["spec"]
    return spec


def _container(objects: list[Obj]) -> Obj:
    (container,) = _pod_spec(objects)["containers"]
    c: Obj = container
    return c


def _env(objects: list[Obj]) -> dict[str, Any]:
    """Environment variable -> its literal value (or its valueFrom)."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in _container(objects)["env"]}


# -- lint ---------------------------------------------------------------------------

ALL_ON: Obj = {
    "taint": {"effect": "NoExecute", "after": 10, "unknownAfter": 300, "untaintAfter": 60},
    "metrics": {
        "service": {"enabled": True},
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
        "prometheusRule": {"enabled": True, "runbookBaseURL": "https://git.example.com/kdh"},
    },
    "sidecar": {"containerStatus": "off", "logFormat": "json", "verbosity": 1},
}


@pytest.mark.parametrize("values", [{}, ALL_ON], ids=["defaults", "all-on"])
def test_helm_lint_strict(helm_bin: Path, values: Obj, tmp_path: Path) -> None:
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump(values))
    out = run_helm(
        helm_bin, "lint", "--strict", "--kube-version", KUBE_VERSION, str(CHART), "-f", str(file)
    )
    assert "1 chart(s) linted, 0 chart(s) failed" in out
    assert "[ERROR]" not in out and "[WARNING]" not in out, out


def test_helm_is_the_pinned_release(helm_bin: Path, helm_tool: str) -> None:
    out = run_helm(helm_bin, "version", "--short")
    if not helm_bin.is_relative_to(_build.cache_root()):
        pytest.skip(f"helm from PATH ({out.strip()}), not the pinned build")
    assert out.strip() == HELMS[helm_tool], out


def test_kubernetes_version_without_a_cluster(helm_bin: Path, helm_tool: str) -> None:
    """What the chart's README says: without ``--kube-version``, our source-built Helm 3
    assumes Kubernetes 1.20 and refuses the chart; Helm 4 takes the version of the
    client-go it was built with (v0.37.2: Kubernetes 1.37)."""
    if not helm_bin.is_relative_to(_build.cache_root()):
        pytest.skip("helm from PATH: its built-in Kubernetes version is its own")
    args = ("template", "x", str(CHART))
    if helm_tool == "helm3":
        with pytest.raises(HelmError, match=r"incompatible with Kubernetes v1\.20\.0"):
            run_helm(helm_bin, *args)
        return
    out = run_helm(helm_bin, *args, "--show-only", "templates/namespace.yaml")
    assert "kind: Namespace" in out


def test_chart_requires_kubernetes_1_30(helm_bin: Path) -> None:
    """The admission policy needs ValidatingAdmissionPolicy v1 and node-bound tokens."""
    args = ["template", "x", str(CHART), "--kube-version"]
    assert "kind: DaemonSet" in run_helm(helm_bin, *args, "1.30.0")
    with pytest.raises(HelmError, match=r"requires kubeVersion: >=1\.30\.0-0"):
        run_helm(helm_bin, *args, "1.29.5")


# -- the default rendering is deploy/ ------------------------------------------------


def _is_taint_policy(obj: Obj) -> bool:
    rules = obj.get("spec", {}).get("matchConstraints", {}).get("resourceRules", [])
    return any("devicetaintrules" in r.get("resources", []) for r in rules)


def _without_taint_bridge(objects: list[Obj]) -> list[Obj]:
    """``objects`` less the taint bridge's permissions: the ClusterRole's rule on
    devicetaintrules and the admission policy (and binding) on them. deploy/ carries them
    whether or not the bridge is on (issue 13); the chart only with taint.effect set."""
    objects = copy.deepcopy(objects)
    policies = {o["metadata"]["name"] for o in objects if _is_taint_policy(o)}
    kept = []
    for obj in objects:
        if obj["metadata"]["name"] in policies:
            continue
        if obj["kind"] == "ValidatingAdmissionPolicyBinding" and (
            obj["spec"]["policyName"] in policies
        ):
            continue
        if obj["kind"] == "ClusterRole":
            obj["rules"] = [r for r in obj["rules"] if "devicetaintrules" not in r["resources"]]
        kept.append(obj)
    return kept


def _assert_equal_but_helm_labels(rendered_objects: list[Obj], expected_objects: list[Obj]) -> None:
    rendered = {_key(o): o for o in rendered_objects}
    expected = {_key(o): o for o in expected_objects}
    assert sorted(rendered) == sorted(expected)
    for key, obj in rendered.items():
        want = expected[key]
        labels = dict(obj["metadata"]["labels"])
        extra = {k: v for k, v in labels.items() if k not in want["metadata"].get("labels", {})}
        assert extra == HELM_LABELS, key
        stripped = copy.deepcopy(obj)
        for label in HELM_LABELS:
            del stripped["metadata"]["labels"][label]
        assert stripped == want, f"{key} differs from deploy/"


def test_default_rendering_equals_deploy(default: list[Obj]) -> None:
    """Same objects, field for field; the only difference is Helm's labels (documented),
    and the taint bridge's permissions, which the chart renders only when it is on."""
    _assert_equal_but_helm_labels(default, _without_taint_bridge(deploy_objects()))


def test_default_rendering_mounts_no_kubelet_root_dir(default: list[Obj]) -> None:
    """Issue 39: the pod-resources socket dir, never the kubelet's root dir or above."""
    host = {v["hostPath"]["path"] for v in _pod_spec(default)["volumes"] if "hostPath" in v}
    assert "/var/lib/kubelet/pod-resources" in host
    assert not host & {"/", "/var", "/var/lib", "/var/lib/kubelet"}, host


def test_no_pod_resources_dir_mounts_nothing_and_reads_nothing(helm_bin: Path) -> None:
    objects = render(helm_bin, {"paths": {"podResources": None}})
    names = {v["name"] for v in _pod_spec(objects)["volumes"]}
    assert "pod-resources" not in names
    assert _env(objects)["KUBELET_DRA_POD_RESOURCES_SOCKET"] == ""


def test_taint_rendering_equals_deploy(helm_bin: Path) -> None:
    """With the bridge on, the permissions of deploy/ are all there; the DaemonSet differs
    from deploy/ only by the variable that turns the bridge on."""
    deployed = deploy_objects()
    if _without_taint_bridge(deployed) == deployed:
        pytest.skip("deploy/ has no taint bridge permissions yet (issue 13)")
    rendered = render(helm_bin, {"taint": {"effect": "NoSchedule"}})
    container = _container(rendered)
    turned_on = {"name": "KUBELET_DRA_TAINT_EFFECT", "value": "NoSchedule"}
    assert container["env"][-1] == turned_on
    container["env"].pop()
    _assert_equal_but_helm_labels(rendered, deployed)


def test_default_rendering_matches_kubernetes_models(default: list[Obj]) -> None:
    import kubernetes.client

    client = kubernetes.client.ApiClient()
    for doc in default:
        name = test_deploy._model_name(doc["apiVersion"], doc["kind"])
        # The client's own deserializer (name-mangled private: the stubs do not list it).
        model = client._ApiClient__deserialize(doc, name)  # type: ignore[attr-defined]
        back = client.sanitize_for_serialization(model)
        assert back == test_deploy._strip_none(doc), doc["kind"]


# -- every value has an effect -------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    """Values that differ from the defaults, and what must change in the rendering."""

    id: str
    values: Obj
    check: Check


def _names(objects: list[Obj]) -> dict[str, str]:
    return {o["kind"]: o["metadata"]["name"] for o in objects}


def _check_name_override(objects: list[Obj]) -> None:
    ds = _daemonset(objects)
    assert ds["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "dra-health"}
    assert ds["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == "dra-health"
    for obj in objects:
        assert obj["metadata"]["labels"]["app.kubernetes.io/name"] == "dra-health"
    # The release name contains the new name, so object names stay the release's.
    assert ds["metadata"]["name"] == "kubelet-dra-health"


def _check_fullname_override(objects: list[Obj]) -> None:
    names = _names(objects)
    for kind in ("DaemonSet", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
        assert names[kind] == "kdh", kind
    assert names["ValidatingAdmissionPolicy"] == "kdh-own-node"
    assert names["ValidatingAdmissionPolicyBinding"] == "kdh-own-node"
    binding = one(objects, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == "kdh"
    assert binding["subjects"][0]["name"] == "kdh"
    assert _pod_spec(objects)["serviceAccountName"] == "kdh"
    vap = one(objects, "ValidatingAdmissionPolicy")
    assert (
        '"system:serviceaccount:kubelet-dra-health:kdh"'
        in (vap["spec"]["matchConditions"][0]["expression"])
    )
    assert one(objects, "ValidatingAdmissionPolicyBinding")["spec"]["policyName"] == (
        "kdh-own-node"
    )


def _container_is(**expected: Any) -> Check:
    def check(objects: list[Obj]) -> None:
        container = _container(objects)
        for key, value in expected.items():
            assert container[key] == value, key

    return check


def _pod_spec_is(**expected: Any) -> Check:
    def check(objects: list[Obj]) -> None:
        spec = _pod_spec(objects)
        for key, value in expected.items():
            if value is None:
                assert key not in spec, key
            else:
                assert spec[key] == value, key

    return check


def _env_is(**expected: Any) -> Check:
    def check(objects: list[Obj]) -> None:
        env = _env(objects)
        for name, value in expected.items():
            if value is None:
                assert name not in env, name
            else:
                assert env[name] == value, name

    return check


def _kinds_absent(*kinds: str) -> Check:
    def check(objects: list[Obj]) -> None:
        assert not set(kinds) & set(by_kind(objects)), kinds

    return check


def _check_namespace_level(objects: list[Obj]) -> None:
    labels = one(objects, "Namespace")["metadata"]["labels"]
    for mode in ("enforce", "warn", "audit"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "baseline"


def _check_sa_annotations(objects: list[Obj]) -> None:
    sa = one(objects, "ServiceAccount")
    assert sa["metadata"]["annotations"] == {"example.com/owner": "gpu-team"}


def _check_validation_actions(objects: list[Obj]) -> None:
    binding = one(objects, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["validationActions"] == ["Warn", "Audit"]


def _check_args(objects: list[Obj]) -> None:
    args = _container(objects)["args"]
    assert args == ["run", "--log-format=json", "-v", "-v"]
    # The sidecar's own parser accepts them as meant.
    ns = cli.build_parser().parse_args(args)
    assert (ns.command, ns.log_format, ns.verbose) == ("run", "json", 2)


K0S = {
    "pluginsRegistry": "/var/lib/k0s/kubelet/plugins_registry",
    "plugins": "/var/lib/k0s/kubelet/plugins",
    "state": "/var/lib/k0s/kubelet-dra-health",
    "podResources": "/var/lib/k0s/kubelet/pod-resources",
}


def _check_paths(objects: list[Obj]) -> None:
    spec = _pod_spec(objects)
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m["mountPath"] for m in _container(objects)["volumeMounts"]}
    expected = {
        "plugins-registry": K0S["pluginsRegistry"],
        "plugins": K0S["plugins"],
        "state": K0S["state"],
    }
    expected["pod-resources"] = K0S["podResources"]
    assert host == expected
    assert {k: mounts[k] for k in expected} == expected
    env = _env(objects)
    assert env["KUBELET_DRA_PLUGINS_REGISTRY"] == K0S["pluginsRegistry"]
    assert env["KUBELET_DRA_STATE_DIR"] == K0S["state"]
    assert env["KUBELET_DRA_POD_RESOURCES_SOCKET"] == K0S["podResources"] + "/kubelet.sock"
    assert "KUBELET_DRA_KUBELET_ROOT_DIR" not in env


TAINT_RULE = {
    "apiGroups": ["resource.k8s.io"],
    "resources": ["devicetaintrules"],
    "verbs": ["list", "create", "update", "delete"],
}


def _check_taint(objects: list[Obj]) -> None:
    _env_is(
        KUBELET_DRA_TAINT_EFFECT="NoSchedule",
        KUBELET_DRA_TAINT_AFTER="5",
        KUBELET_DRA_TAINT_UNKNOWN_AFTER="600",
        KUBELET_DRA_UNTAINT_AFTER="120.5",
        KUBELET_DRA_TAINT_KEY="example.com/broken",
    )(objects)
    rules = one(objects, "ClusterRole")["rules"]
    assert rules[-1] == TAINT_RULE
    assert rules[:-1] == one(_without_taint_bridge(deploy_objects()), "ClusterRole")["rules"]
    names = {o["metadata"]["name"] for o in objects if o["kind"].startswith("ValidatingAdm")}
    assert names == {"kubelet-dra-health-own-node", "kubelet-dra-health-own-node-taints"}


def _check_metrics_address(objects: list[Obj]) -> None:
    assert _env(objects)["KUBELET_DRA_METRICS_ADDRESS"] == "[$(POD_IP)]:9500"
    container = _container(objects)
    assert container["ports"] == [{"name": "metrics", "containerPort": 9500, "protocol": "TCP"}]
    annotations = _daemonset(objects)["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == "9500"


def _check_no_pod_annotations(objects: list[Obj]) -> None:
    assert "annotations" not in _daemonset(objects)["spec"]["template"]["metadata"]


def _check_service(objects: list[Obj]) -> None:
    service = one(objects, "Service")
    assert service["metadata"]["name"] == "kubelet-dra-health-metrics"
    assert service["metadata"]["namespace"] == "kubelet-dra-health"
    assert service["spec"]["clusterIP"] == "None"
    pod_labels = _daemonset(objects)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9464, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert "ServiceMonitor" not in by_kind(objects)


def _check_service_monitor(objects: list[Obj]) -> None:
    monitor = one(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    service = one(objects, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= (
        service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["kubelet-dra-health"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert (endpoint["path"], endpoint["interval"], endpoint["scrapeTimeout"]) == (
        "/metrics",
        "15s",
        "5s",
    )
    assert endpoint["relabelings"] == [
        {
            "action": "replace",
            "sourceLabels": ["__meta_kubernetes_pod_node_name"],
            "targetLabel": "node",
        }
    ]


def _check_prometheus_rule(objects: list[Obj]) -> None:
    rule = one(objects, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    source = yaml.safe_load((MONITORING / "rules.yaml").read_text(encoding="utf-8"))
    urls = []
    for group in rule["spec"]["groups"]:
        for alert in group["rules"]:
            urls.append(alert["annotations"].pop("runbook_url"))
    for group in source["groups"]:
        for alert in group["rules"]:
            del alert["annotations"]["runbook_url"]
    assert rule["spec"] == source
    assert urls and all(
        re.fullmatch(r"https://git\.example\.com/kdh/docs/operations\.md#kubeletdra\w+", u)
        for u in urls
    ), urls


def _check_resources(objects: list[Obj]) -> None:
    assert _container(objects)["resources"] == {
        "requests": {"cpu": "50m", "memory": "200Mi"},
        "limits": {"memory": "400Mi"},
    }


def _check_max_unavailable(objects: list[Obj]) -> None:
    strategy = _daemonset(objects)["spec"]["updateStrategy"]
    assert strategy["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": "10%"}


def _check_pod_annotations(objects: list[Obj]) -> None:
    annotations = _daemonset(objects)["spec"]["template"]["metadata"]["annotations"]
    assert annotations["example.com/team"] == "gpu"
    assert annotations["prometheus.io/scrape"] == "true"


def _check_pod_labels(objects: list[Obj]) -> None:
    ds = _daemonset(objects)
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert labels["example.com/team"] == "gpu"
    # The selector does not change (it cannot on an existing DaemonSet).
    assert ds["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "kubelet-dra-health"}


NON_ROOT = {
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "runAsGroup": 65532,
    "supplementalGroups": [2000],
    "seccompProfile": {"type": "RuntimeDefault"},
}
AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["yes"]}]}
            ]
        }
    }
}
TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]

CASES = [
    Case("nameOverride", {"nameOverride": "dra-health"}, _check_name_override),
    Case("fullnameOverride", {"fullnameOverride": "kdh"}, _check_fullname_override),
    Case(
        "image.repository+tag",
        {"image": {"repository": "registry.example.com/kdh", "tag": "1.2.3"}},
        _container_is(image="registry.example.com/kdh:1.2.3"),
    ),
    Case(
        "image.digest",
        {"image": {"digest": "sha256:" + "ab" * 32}},
        _container_is(image="localhost/kubelet-dra-health@sha256:" + "ab" * 32),
    ),
    Case(
        "image.pullPolicy",
        {"image": {"pullPolicy": "Always"}},
        _container_is(imagePullPolicy="Always"),
    ),
    Case(
        "imagePullSecrets",
        {"imagePullSecrets": [{"name": "regcred"}]},
        _pod_spec_is(imagePullSecrets=[{"name": "regcred"}]),
    ),
    Case("namespace.create", {"namespace": {"create": False}}, _kinds_absent("Namespace")),
    Case(
        "namespace.podSecurityLevel",
        {"namespace": {"podSecurityLevel": "baseline"}},
        _check_namespace_level,
    ),
    Case(
        "serviceAccount.annotations",
        {"serviceAccount": {"annotations": {"example.com/owner": "gpu-team"}}},
        _check_sa_annotations,
    ),
    Case(
        "admissionPolicy.enabled",
        {"admissionPolicy": {"enabled": False}},
        _kinds_absent("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"),
    ),
    Case(
        "admissionPolicy.validationActions",
        {"admissionPolicy": {"validationActions": ["Warn", "Audit"]}},
        _check_validation_actions,
    ),
    Case(
        "sidecar.containerStatus",
        {"sidecar": {"containerStatus": "off"}},
        _env_is(KUBELET_DRA_CONTAINER_STATUS="off"),
    ),
    Case(
        "sidecar.podConditionType",
        {"sidecar": {"podConditionType": ""}},
        _env_is(KUBELET_DRA_POD_CONDITION_TYPE=""),
    ),
    Case(
        "sidecar.healthTimeout",
        {"sidecar": {"healthTimeout": 45}},
        _env_is(KUBELET_DRA_HEALTH_TIMEOUT="45"),
    ),
    Case(
        "sidecar.logFormat+verbosity",
        {"sidecar": {"logFormat": "json", "verbosity": 2}},
        _check_args,
    ),
    Case(
        "sidecar.extraEnv",
        {"sidecar": {"extraEnv": [{"name": "KUBELET_DRA_API_QPS", "value": "20"}]}},
        _env_is(KUBELET_DRA_API_QPS="20"),
    ),
    Case("paths", {"paths": K0S}, _check_paths),
    Case(
        "taint",
        {
            "taint": {
                "effect": "NoSchedule",
                "after": 5,
                "unknownAfter": 600,
                "untaintAfter": 120.5,
                "key": "example.com/broken",
            }
        },
        _check_taint,
    ),
    Case(
        "metrics.host+port",
        {"metrics": {"host": "[$(POD_IP)]", "port": 9500}},
        _check_metrics_address,
    ),
    Case(
        "metrics.podAnnotations",
        {"metrics": {"podAnnotations": False}},
        _check_no_pod_annotations,
    ),
    Case("metrics.service", {"metrics": {"service": {"enabled": True}}}, _check_service),
    Case(
        "metrics.serviceMonitor",
        {
            "metrics": {
                "serviceMonitor": {
                    "enabled": True,
                    "interval": "15s",
                    "scrapeTimeout": "5s",
                    "labels": {"release": "prometheus"},
                }
            }
        },
        _check_service_monitor,
    ),
    Case(
        "metrics.prometheusRule",
        {
            "metrics": {
                "prometheusRule": {
                    "enabled": True,
                    "labels": {"release": "prometheus"},
                    "runbookBaseURL": "https://git.example.com/kdh/",
                }
            }
        },
        _check_prometheus_rule,
    ),
    Case(
        "nodeSelector",
        {"nodeSelector": {"gpu": "yes"}},
        _pod_spec_is(nodeSelector={"gpu": "yes"}),
    ),
    Case("tolerations", {"tolerations": TOLERATIONS}, _pod_spec_is(tolerations=TOLERATIONS)),
    Case("affinity", {"affinity": AFFINITY}, _pod_spec_is(affinity=AFFINITY)),
    Case("priorityClassName", {"priorityClassName": ""}, _pod_spec_is(priorityClassName=None)),
    Case("maxUnavailable", {"maxUnavailable": "10%"}, _check_max_unavailable),
    Case(
        "resources",
        {
            "resources": {
                "requests": {"cpu": "50m", "memory": "200Mi"},
                "limits": {"memory": "400Mi"},
            }
        },
        _check_resources,
    ),
    Case(
        "podSecurityContext",
        {"podSecurityContext": NON_ROOT},
        _pod_spec_is(securityContext=NON_ROOT),
    ),
    Case("podAnnotations", {"podAnnotations": {"example.com/team": "gpu"}}, _check_pod_annotations),
    Case("podLabels", {"podLabels": {"example.com/team": "gpu"}}, _check_pod_labels),
]

#: Values that are free-form maps or lists: one case sets them as a whole.
OPAQUE = {
    "serviceAccount.annotations",
    "metrics.serviceMonitor.labels",
    "metrics.prometheusRule.labels",
    "nodeSelector",
    "affinity",
    "resources",
    "podSecurityContext",
    "podAnnotations",
    "podLabels",
}


def _leaves(values: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and path not in OPAQUE:
            yield from _leaves(value, f"{path}.")
        else:
            yield path


def test_every_value_has_a_case() -> None:
    defaults = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    declared = set(_leaves(defaults))
    covered: set[str] = set()
    for case in CASES:
        covered |= set(_leaves(case.values))
    assert declared - covered == set(), "values without a test case"
    assert covered - declared == set(), "cases for values that values.yaml does not declare"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_value_has_its_effect(helm_bin: Path, default: list[Obj], case: Case) -> None:
    rendered = render(helm_bin, case.values)
    assert rendered != default, f"{case.id} changes nothing"
    case.check(rendered)
    # The check would not pass on the default rendering: it tests this value's effect.
    with pytest.raises((AssertionError, KeyError, IndexError, ValueError)):
        case.check(default)


def test_taint_settings_are_not_rendered_when_off(helm_bin: Path, default: list[Obj]) -> None:
    values = {"taint": {"effect": "off", "after": 5, "untaintAfter": 9, "key": "k.io/x"}}
    assert render(helm_bin, values) == default


@pytest.mark.parametrize("effect", ["None", "NoSchedule", "NoExecute"])
def test_taint_effect_alone(helm_bin: Path, effect: str) -> None:
    objects = render(helm_bin, {"taint": {"effect": effect}})
    env = _env(objects)
    assert env["KUBELET_DRA_TAINT_EFFECT"] == effect
    assert not {
        n for n in env if n.startswith("KUBELET_DRA_TAINT_") and n != "KUBELET_DRA_TAINT_EFFECT"
    }
    assert "KUBELET_DRA_UNTAINT_AFTER" not in env
    assert TAINT_RULE in one(objects, "ClusterRole")["rules"]


# -- what the sidecar makes of a rendering ------------------------------------------


def test_rendered_env_is_what_settings_read(
    helm_bin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = render(
        helm_bin,
        {
            "sidecar": {"containerStatus": "on", "podConditionType": "GpuOk", "healthTimeout": 2.5},
            "metrics": {"port": 9500},
            "paths": K0S,
        },
    )
    resolved = {"NODE_NAME": "node-a", "POD_IP": "10.1.2.3"}
    for name, value in _env(objects).items():
        if isinstance(value, str):
            resolved[name] = re.sub(r"\$\((\w+)\)", lambda m: resolved[m[1]], value)
    for name in test_deploy.FLAG_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in resolved.items():
        if name != "POD_IP":
            monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.node_name == "node-a"
    assert settings.container_status == "on"
    assert settings.pod_condition_type == "GpuOk"
    assert settings.health_timeout == 2.5
    assert settings.metrics_address == "10.1.2.3:9500"
    assert str(settings.plugins_registry) == K0S["pluginsRegistry"]
    assert str(settings.state_dir) == K0S["state"]
    assert str(settings.pod_resources_socket) == K0S["podResources"] + "/kubelet.sock"


def test_rendered_env_names_are_sidecar_settings(helm_bin: Path) -> None:
    """Every variable the chart can set is a flag's variable or a Settings field's."""
    values = copy.deepcopy(ALL_ON)
    values["sidecar"] |= {"podConditionType": "X", "healthTimeout": 1}
    values["sidecar"]["extraEnv"] = [{"name": "KUBELET_DRA_WRITE_WINDOW", "value": "0.1"}]
    objects = render(helm_bin, values)
    known = set(test_deploy.FLAG_ENV) | test_deploy.HELPER_ENV
    known |= {f"KUBELET_DRA_{field.upper()}" for field in Settings.model_fields}
    # The taint bridge's variables (issue 13): checked against Settings once it has them.
    taint = {
        "KUBELET_DRA_TAINT_EFFECT",
        "KUBELET_DRA_TAINT_AFTER",
        "KUBELET_DRA_TAINT_UNKNOWN_AFTER",
        "KUBELET_DRA_UNTAINT_AFTER",
        "KUBELET_DRA_TAINT_KEY",
    }
    if "taint_effect" not in Settings.model_fields:
        known |= taint
    names = set(_env(objects))
    assert names - known == set()
    assert {"KUBELET_DRA_CONTAINER_STATUS", "KUBELET_DRA_TAINT_EFFECT"} <= names


def test_admission_policy_follows_the_release(helm_bin: Path) -> None:
    """The policy's CEL, for release "gpu-health" in namespace "ops", admits that release's
    service account on its own node and leaves deploy/'s account alone."""
    if not test_deploy.HAVE_CEL:
        pytest.skip("cel-python (import celpy) is not installed")
    objects = render(helm_bin, release="gpu-health", namespace="ops")
    vap = one(objects, "ValidatingAdmissionPolicy")
    user = "system:serviceaccount:ops:gpu-health-kubelet-dra-health"
    assert one(objects, "ServiceAccount")["metadata"]["namespace"] == "ops"
    token = test_deploy._token_extra("node-a")
    admitted, message = test_deploy._evaluate(
        vap,
        test_deploy._request(user, token),
        test_deploy._pod("node-b"),
        test_deploy._pod("node-b"),
    )
    assert not admitted
    assert (
        'may write the status only of pods on its own node; pod team/train-0 is on node "node-b"'
        in message
    )
    admitted, _ = test_deploy._evaluate(
        vap,
        test_deploy._request(user, token),
        test_deploy._pod("node-a"),
        test_deploy._pod("node-a"),
    )
    assert admitted
    admitted, message = test_deploy._evaluate(
        vap,
        test_deploy._request(test_deploy.SA_USERNAME, token),
        test_deploy._pod("node-b"),
        test_deploy._pod("node-b"),
    )
    assert (admitted, message) == (True, "not matched")


def _taint_rule(node: str, managed_by: str = "kubelet-dra-health") -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": f"{node}-gpu-0",
            "labels": {"kubelet-dra.io/node": node, "app.kubernetes.io/managed-by": managed_by},
        },
        "spec": {"taint": {"key": "kubelet-dra.io/unhealthy", "effect": "NoSchedule"}},
    }


def test_taint_admission_policy_follows_the_release(helm_bin: Path) -> None:
    """The taint policy's CEL, for release "gpu-health" in namespace "ops": the account
    creates rules labelled with its own node only."""
    if not test_deploy.HAVE_CEL:
        pytest.skip("cel-python (import celpy) is not installed")
    objects = render(
        helm_bin, {"taint": {"effect": "NoSchedule"}}, release="gpu-health", namespace="ops"
    )
    (vap,) = [
        o
        for o in by_kind(objects)["ValidatingAdmissionPolicy"]
        if o["metadata"]["name"] == "gpu-health-kubelet-dra-health-own-node-taints"
    ]
    assert _is_taint_policy(vap)
    user = "system:serviceaccount:ops:gpu-health-kubelet-dra-health"
    request = test_deploy._request(user, test_deploy._token_extra("node-a"))
    request |= {"operation": "CREATE", "subResource": "", "namespace": ""}
    admitted, message = test_deploy._evaluate(vap, request, _taint_rule("node-a"), {})
    assert admitted, message
    admitted, message = test_deploy._evaluate(vap, request, _taint_rule("node-b"), {})
    assert not admitted
    assert 'is labelled for node "node-b"' in message
    admitted, _ = test_deploy._evaluate(vap, request, _taint_rule("node-a", "someone-else"), {})
    assert not admitted
    # Other users are not matched.
    other = request | {"userInfo": {"username": test_deploy.SA_USERNAME}}
    assert test_deploy._evaluate(vap, other, _taint_rule("node-b"), {}) == (True, "not matched")


# -- the schema -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"sidecar": {"containerStatus": "maybe"}}, "/sidecar/containerStatus"),
        ({"sidecar": {"healthTimeout": 0}}, "/sidecar/healthTimeout"),
        ({"sidecar": {"healthTimeout": "soon"}}, "/sidecar/healthTimeout"),
        ({"sidecar": {"verbosity": 3}}, "/sidecar/verbosity"),
        ({"sidecar": {"logFormat": "xml"}}, "/sidecar/logFormat"),
        ({"taint": {"effect": "Sometimes"}}, "/taint/effect"),
        ({"taint": {"after": -1}}, "/taint/after"),
        ({"metrics": {"port": 70000}}, "/metrics/port"),
        (
            {"metrics": {"serviceMonitor": {"interval": "often"}}},
            "/metrics/serviceMonitor/interval",
        ),
        ({"paths": {"state": "relative/dir"}}, "/paths/state"),
        ({"image": {"digest": "latest"}}, "/image/digest"),
        (
            {"admissionPolicy": {"validationActions": ["Allow"]}},
            "/admissionPolicy/validationActions/0",
        ),
        ({"sidecar": {"conatinerStatus": "on"}}, "/sidecar"),  # a typo
        ({"tolerations": {"operator": "Exists"}}, "/tolerations"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_schema_refuses(helm_bin: Path, values: Obj, where: str) -> None:
    with pytest.raises(HelmError) as failed:
        render(helm_bin, values)
    message = str(failed.value)
    assert "don't meet the specifications of the schema" in message, message
    assert f"at '{where}'" in message, message


def test_schema_accepts_set_strings_for_seconds(helm_bin: Path) -> None:
    """``--set sidecar.healthTimeout=2.5`` gives a string; the schema takes digits."""
    objects = render(
        helm_bin, {"sidecar": {"healthTimeout": "2.5"}, "taint": {"effect": "None", "after": "0"}}
    )
    assert _env(objects)["KUBELET_DRA_HEALTH_TIMEOUT"] == "2.5"
    assert _env(objects)["KUBELET_DRA_TAINT_AFTER"] == "0"


# -- the PrometheusRule and its source ------------------------------------------------


def test_chart_rules_are_a_copy_of_deploy_monitoring() -> None:
    """files/rules.yaml is deploy/monitoring/rules.yaml (Helm reads files only inside the
    chart). After editing the rules: cp deploy/monitoring/rules.yaml
    deploy/helm/kubelet-dra-health/files/rules.yaml"""
    source = (MONITORING / "rules.yaml").read_bytes()
    assert (CHART / "files" / "rules.yaml").read_bytes() == source


def test_prometheus_rule_without_base_url_keeps_relative_runbooks(helm_bin: Path) -> None:
    objects = render(helm_bin, {"metrics": {"prometheusRule": {"enabled": True}}})
    rule = one(objects, "PrometheusRule")
    source = yaml.safe_load((MONITORING / "rules.yaml").read_text(encoding="utf-8"))
    assert rule["spec"] == source
    assert rule["metadata"]["namespace"] == "kubelet-dra-health"
