"""The manifests in ``deploy/``: valid Kubernetes objects, least privilege, safe defaults.

Every manifest is deserialized into the official ``kubernetes`` client's model
and serialized back: a field the model does not know (a typo) is dropped on
the way and shows up as a difference. Then the invariants the sidecar relies on
are checked (downward-API node name, probes, host paths, security context, the
flag environment variables), the ClusterRole is pinned to
:data:`REQUIRED_RULES`, the requests the code makes are checked against it with
``tests/unit/_rbac.py``, and the ValidatingAdmissionPolicy's CEL is evaluated
with cel-python against sample admission requests (skipped when cel-python is
not installed; no API server runs here).
"""

from __future__ import annotations

import pathlib
import re
from collections.abc import Iterator, Mapping
from typing import Any

import kubernetes.client
import pytest
import yaml

from kubelet_dra.settings import Settings
from kubelet_dra.status.podjson import MutableObj as Obj
from tests.unit import _rbac

DEPLOY = _rbac.DEPLOY_DIR
NAMESPACE = "kubelet-dra-health"
SERVICE_ACCOUNT = "kubelet-dra-health"
SA_USERNAME = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
METRICS_PORT = 9464

# Flag table of the sidecar (issue 5): environment variable -> Settings field.
FLAG_ENV: dict[str, str] = {
    "NODE_NAME": "node_name",
    "KUBECONFIG": "kubeconfig",
    "KUBELET_DRA_PLUGINS_REGISTRY": "plugins_registry",
    "KUBELET_DRA_STATE_DIR": "state_dir",
    "KUBELET_DRA_POD_RESOURCES_SOCKET": "pod_resources_socket",
    "KUBELET_DRA_HEALTH_TIMEOUT": "health_timeout",
    "KUBELET_DRA_CONTAINER_STATUS": "container_status",
    "KUBELET_DRA_POD_CONDITION_TYPE": "pod_condition_type",
    "KUBELET_DRA_METRICS_ADDRESS": "metrics_address",
    "KUBELET_DRA_TAINT_EFFECT": "taint_effect",
    "KUBELET_DRA_TAINT_AFTER": "taint_after",
    "KUBELET_DRA_TAINT_UNKNOWN_AFTER": "taint_unknown_after",
    "KUBELET_DRA_UNTAINT_AFTER": "untaint_after",
    "KUBELET_DRA_TAINT_KEY": "taint_key",
}
# Environment variables that are not flags: only inputs to $(VAR) expansion.
HELPER_ENV = {"POD_IP"}

# The ClusterRole, exactly: (apiGroup, resource[/subresource], verb).
REQUIRED_RULES: frozenset[tuple[str, str, str]] = frozenset(
    {
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "pods/status", "get"),
        ("", "pods/status", "patch"),
        ("resource.k8s.io", "resourceclaims", "get"),
        ("", "events", "create"),
        ("", "events", "patch"),
        # The taint bridge (issue 13): exactly the verbs it uses.
        ("resource.k8s.io", "devicetaintrules", "list"),
        ("resource.k8s.io", "devicetaintrules", "create"),
        ("resource.k8s.io", "devicetaintrules", "update"),
        ("resource.k8s.io", "devicetaintrules", "delete"),
    }
)

# Requests the sidecar makes (informers, writer, events), as the API stand-in records them.
CODE_REQUESTS: list[tuple[str, str]] = [
    ("GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a&limit=500"),
    ("GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a&watch=true&resourceVersion=7"),
    ("GET", "/api/v1/namespaces/team/pods/train-0/status"),
    ("PATCH", "/api/v1/namespaces/team/pods/train-0/status"),
    ("GET", "/apis/resource.k8s.io/v1/namespaces/team/resourceclaims/gpu-claim"),
    ("POST", "/api/v1/namespaces/team/events"),
    ("PATCH", "/api/v1/namespaces/team/events/train-0.17a"),
    ("POST", "/api/v1/namespaces/default/events"),
    ("GET", "/version"),
    # The taint bridge: discovery, its node's rules by label, writes of single rules.
    ("GET", "/apis/resource.k8s.io/v1"),
    (
        "GET",
        "/apis/resource.k8s.io/v1/devicetaintrules?labelSelector=app.kubernetes.io%2F"
        "managed-by%3Dkubelet-dra-health%2Ckubelet-dra.io%2Fnode%3Dnode-a&limit=500",
    ),
    ("POST", "/apis/resource.k8s.io/v1/devicetaintrules"),
    ("PUT", "/apis/resource.k8s.io/v1/devicetaintrules/node-a.gpu.example.com.node-a.gpu-0"),
    ("DELETE", "/apis/resource.k8s.io/v1/devicetaintrules/node-a.gpu.example.com.node-a.gpu-0"),
    ("POST", "/apis/resource.k8s.io/v1beta2/devicetaintrules"),
]

# Requests the sidecar must not be able to make.
FORBIDDEN_REQUESTS: list[tuple[str, str]] = [
    # Not used by the code, so not granted: a whole-status PUT, reading pods
    # outside the status subresource, listing every claim in the cluster.
    ("PUT", "/api/v1/namespaces/team/pods/train-0/status"),
    ("GET", "/api/v1/namespaces/team/pods/train-0"),
    ("GET", "/apis/resource.k8s.io/v1/resourceclaims?limit=500"),
    ("POST", "/apis/events.k8s.io/v1/namespaces/team/events"),
    ("PATCH", "/api/v1/namespaces/team/pods/train-0"),
    ("PUT", "/api/v1/namespaces/team/pods/train-0"),
    ("DELETE", "/api/v1/namespaces/team/pods/train-0"),
    ("POST", "/api/v1/namespaces/team/pods"),
    ("POST", "/api/v1/namespaces/team/pods/train-0/eviction"),
    ("GET", "/api/v1/namespaces/team/secrets/token"),
    ("GET", "/api/v1/nodes/node-a"),
    ("GET", "/api/v1/nodes/node-a/proxy/configz"),
    ("PATCH", "/api/v1/nodes/node-a/status"),
    ("PATCH", "/apis/resource.k8s.io/v1/namespaces/team/resourceclaims/gpu-claim/status"),
    ("GET", "/apis/resource.k8s.io/v1/resourceslices"),
    ("DELETE", "/api/v1/namespaces/team/events/train-0.17a"),
    ("GET", "/metrics"),
    # The taint bridge needs no single-rule reads, watches, patches, status or collections.
    ("GET", "/apis/resource.k8s.io/v1/devicetaintrules/r"),
    ("GET", "/apis/resource.k8s.io/v1/devicetaintrules?watch=true"),
    ("PATCH", "/apis/resource.k8s.io/v1/devicetaintrules/r"),
    ("PUT", "/apis/resource.k8s.io/v1/devicetaintrules/r/status"),
    ("DELETE", "/apis/resource.k8s.io/v1/devicetaintrules"),
    ("POST", "/apis/resource.k8s.io/v1/resourceslices"),
]


# -- loading -----------------------------------------------------------------------


def _manifest_files() -> list[pathlib.Path]:
    return sorted(p for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")


def _load(path: pathlib.Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def _objects() -> Iterator[tuple[pathlib.Path, Obj]]:
    for path in _manifest_files():
        for obj in _load(path):
            yield path, obj


def _one(kind: str) -> Obj:
    found = [obj for _, obj in _objects() if obj["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def _all(kind: str) -> list[Obj]:
    return [obj for _, obj in _objects() if obj["kind"] == kind]


def _named(kind: str, name: str) -> Obj:
    (found,) = [obj for obj in _all(kind) if obj["metadata"]["name"] == name]
    return found


def _model_name(api_version: str, kind: str) -> str:
    version = api_version.rsplit("/", 1)[-1]
    return version.capitalize() + kind


def _strip_none(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _strip_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_none(v) for v in value]
    return value


@pytest.fixture(scope="module")
def daemonset() -> Obj:
    return _one("DaemonSet")


@pytest.fixture(scope="module")
def pod_spec(daemonset: Obj) -> Obj:
    spec: Obj = daemonset["spec"]["template"]["spec"]
    return spec


@pytest.fixture(scope="module")
def container(pod_spec: Obj) -> Obj:
    containers = pod_spec["containers"]
    assert len(containers) == 1
    assert not pod_spec.get("initContainers")
    c: Obj = containers[0]
    return c


@pytest.fixture(scope="module")
def env(container: Obj) -> dict[str, Obj]:
    return {e["name"]: e for e in container["env"]}


# -- every manifest ----------------------------------------------------------------


def test_kustomization_lists_every_manifest() -> None:
    kustomization = _load(DEPLOY / "kustomization.yaml")[0]
    assert kustomization["kind"] == "Kustomization"
    listed = kustomization["resources"]
    assert len(listed) == len(set(listed))
    assert sorted(listed) == [p.name for p in _manifest_files()]


@pytest.mark.parametrize("path", _manifest_files(), ids=lambda p: p.name)
def test_manifest_matches_kubernetes_models(path: pathlib.Path) -> None:
    client = kubernetes.client.ApiClient()
    docs = _load(path)
    assert docs, f"{path.name} is empty"
    for doc in docs:
        name = _model_name(doc["apiVersion"], doc["kind"])
        assert hasattr(kubernetes.client, name), f"no model {name} for {path.name}"
        # Required fields and enums are checked by the models (client-side validation).
        # The client's own deserializer (name-mangled private: the stubs do not list it).
        model = client._ApiClient__deserialize(doc, name)  # type: ignore[attr-defined]
        back = client.sanitize_for_serialization(model)
        assert back == _strip_none(doc), f"{path.name}: a field the model does not know"


def test_namespaced_objects_live_in_our_namespace() -> None:
    cluster_scoped = {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    for path, obj in _objects():
        namespace = obj["metadata"].get("namespace")
        if obj["kind"] in cluster_scoped:
            assert namespace is None, path.name
        else:
            assert namespace == NAMESPACE, path.name
        assert obj["metadata"]["labels"]["app.kubernetes.io/name"] == "kubelet-dra-health"
    assert _one("Namespace")["metadata"]["name"] == NAMESPACE


def test_identities_are_consistent(daemonset: Obj, pod_spec: Obj) -> None:
    sa = _one("ServiceAccount")
    role = _one("ClusterRole")
    binding = _one("ClusterRoleBinding")
    assert sa["metadata"]["name"] == SERVICE_ACCOUNT
    assert pod_spec["serviceAccountName"] == SERVICE_ACCOUNT
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}
    ]
    policies = _all("ValidatingAdmissionPolicy")
    bindings = {b["spec"]["policyName"]: b for b in _all("ValidatingAdmissionPolicyBinding")}
    assert sorted(bindings) == sorted(p["metadata"]["name"] for p in policies)
    for vap in policies:
        vap_binding = bindings[vap["metadata"]["name"]]
        assert vap_binding["metadata"]["name"] == vap["metadata"]["name"]
        assert vap_binding["spec"]["validationActions"] == ["Deny"]
        (condition,) = vap["spec"]["matchConditions"]
        assert f'"{SA_USERNAME}"' in condition["expression"]


# -- the DaemonSet -----------------------------------------------------------------


def test_node_name_from_downward_api(env: dict[str, Obj]) -> None:
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}


def test_env_names_are_flags_of_the_sidecar(container: Obj, env: dict[str, Obj]) -> None:
    assert container["args"] == ["run"]
    names = [e["name"] for e in container["env"]]
    assert len(names) == len(set(names))
    assert set(names) <= set(FLAG_ENV) | HELPER_ENV
    fields = Settings.model_fields
    for var, field in FLAG_ENV.items():
        assert field in fields, f"{var}: Settings has no field {field}"
    # $(VAR) is expanded only from variables defined earlier in the list.
    for i, e in enumerate(container["env"]):
        for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", e.get("value", "")):
            assert ref in names[:i], f"{e['name']} uses $({ref}) before it is defined"


def test_settings_read_the_manifest_env(
    env: dict[str, Obj], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the container's environment turns into, as the kubelet expands it."""
    resolved = {"NODE_NAME": "node-a", "POD_IP": "10.1.2.3"}
    for name, e in env.items():
        if "value" in e:
            resolved[name] = re.sub(r"\$\((\w+)\)", lambda m: resolved[m[1]], e["value"])
    for name in FLAG_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in resolved.items():
        if name in FLAG_ENV:
            monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.node_name == "node-a"
    assert str(settings.plugins_registry) == "/var/lib/kubelet/plugins_registry"
    assert str(settings.state_dir) == "/var/lib/kubelet-dra-health"
    assert settings.metrics_address == f"10.1.2.3:{METRICS_PORT}"
    # The manifest repeats the built-in defaults, so it and the code cannot drift apart.
    defaults = Settings.model_fields
    assert defaults["plugins_registry"].default == settings.plugins_registry
    assert defaults["state_dir"].default == settings.state_dir


def test_host_paths(pod_spec: Obj, container: Obj, env: dict[str, Obj]) -> None:
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    host = {v["hostPath"]["path"]: v for v in volumes.values() if "hostPath" in v}
    assert set(host) == {
        "/var/lib/kubelet/plugins_registry",
        "/var/lib/kubelet/plugins",
        "/var/lib/kubelet-dra-health",
        "/var/lib/kubelet/pod-resources",
    }
    # Issue 39: nothing above the socket directories and our state dir, and never the
    # kubelet's root dir itself (its pods' volumes, its checkpoints, its pki/).
    assert "/var/lib/kubelet" not in host and "/" not in host and "/var/lib" not in host
    expect = {
        "/var/lib/kubelet/plugins_registry": ("Directory", True, ""),
        "/var/lib/kubelet/plugins": ("Directory", True, ""),
        "/var/lib/kubelet-dra-health": ("DirectoryOrCreate", False, ""),
        # The kubelet's PodResources socket: the directory (the kubelet re-creates the
        # socket at each start), read-only.
        "/var/lib/kubelet/pod-resources": ("Directory", True, ""),
    }
    for path, (kind, read_only, inside) in expect.items():
        volume = host[path]
        assert volume["hostPath"]["type"] == kind
        # Same path inside (drivers advertise absolute socket paths), but the root dir.
        mount = mounts[inside or path]
        assert mount["name"] == volume["name"]
        assert bool(mount.get("readOnly", False)) is read_only, path
        assert "subPath" not in mount
        # Submounts under a read-only host path (other pods' volumes under the kubelet's
        # root) read-only too where the runtime can; mounts made later never propagate in.
        assert mount.get("recursiveReadOnly") == ("IfPossible" if read_only else None), path
        assert "mountPropagation" not in mount, path
    assert env["KUBELET_DRA_PLUGINS_REGISTRY"]["value"] == "/var/lib/kubelet/plugins_registry"
    assert env["KUBELET_DRA_STATE_DIR"]["value"] == "/var/lib/kubelet-dra-health"
    assert env["KUBELET_DRA_POD_RESOURCES_SOCKET"]["value"] == (
        "/var/lib/kubelet/pod-resources/kubelet.sock"
    )
    assert "KUBELET_DRA_KUBELET_ROOT_DIR" not in env
    # Every other volume is scratch space, never a host path.
    for volume in volumes.values():
        assert set(volume) - {"name"} <= {"hostPath", "emptyDir"}, volume["name"]


def test_only_the_metrics_port(
    daemonset: Obj, pod_spec: Obj, container: Obj, env: dict[str, Obj]
) -> None:
    assert not pod_spec.get("hostNetwork", False)
    assert not pod_spec.get("hostPID", False)
    assert not pod_spec.get("hostIPC", False)
    assert container["ports"] == [
        {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}
    ]
    address = env["KUBELET_DRA_METRICS_ADDRESS"]["value"]
    assert address == f"$(POD_IP):{METRICS_PORT}"
    annotations = daemonset["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(METRICS_PORT)
    assert annotations["prometheus.io/path"] == "/metrics"


def test_probes(container: Obj) -> None:
    def target(probe: str) -> tuple[str, Any]:
        get = container[probe]["httpGet"]
        assert set(container[probe]) - {"httpGet"} <= {
            "periodSeconds",
            "timeoutSeconds",
            "failureThreshold",
            "initialDelaySeconds",
            "successThreshold",
        }
        return get["path"], get["port"]

    assert target("livenessProbe") == ("/healthz", "metrics")
    assert target("readinessProbe") == ("/readyz", "metrics")
    assert target("startupProbe") == ("/healthz", "metrics")


def test_security_context(pod_spec: Obj, container: Obj) -> None:
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc.get("privileged", False) is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    pod_sc = pod_spec["securityContext"]
    assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
    # Root by default (root-owned driver sockets); see docs/deploy.md for non-root.
    assert pod_sc["runAsUser"] == 0


def test_scheduling_and_resources(daemonset: Obj, pod_spec: Obj, container: Obj) -> None:
    assert pod_spec["priorityClassName"] == "system-node-critical"
    assert pod_spec["tolerations"] == [{"operator": "Exists"}]
    assert pod_spec["terminationGracePeriodSeconds"] == 10
    assert container["resources"] == {
        "requests": {"cpu": "20m", "memory": "128Mi"},
        "limits": {"memory": "256Mi"},
    }
    # Never two sidecars on one node (shared state dir, double writes).
    assert daemonset["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == 0
    selector = daemonset["spec"]["selector"]["matchLabels"]
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()


def test_image_is_what_the_image_build_tags(container: Obj) -> None:
    # deploy/image/build.py tags REPOSITORY:<version>; tests/unit/test_image_files.py
    # checks the Containerfile against the build.
    assert container["image"] == "localhost/kubelet-dra-health:0.1.0"


# -- RBAC ----------------------------------------------------------------------------


def _expand(rules: list[Obj]) -> set[tuple[str, str, str]]:
    out = set()
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    out.add((group, resource, verb))
    return out


def test_cluster_role_is_exactly_required_rules() -> None:
    rules = _rbac.cluster_role_rules()
    for rule in rules:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, rule
        for values in rule.values():
            assert "*" not in values and not any(v.startswith("*/") for v in values), rule
    assert _expand(rules) == REQUIRED_RULES
    # The RBAC evaluator agrees with the expansion.
    for group, resource, verb in REQUIRED_RULES:
        res, _, sub = resource.partition("/")
        assert _rbac.rbac_allows(rules, verb, group, res, sub)


@pytest.mark.parametrize(("method", "path"), CODE_REQUESTS)
def test_code_requests_are_allowed(method: str, path: str) -> None:
    assert _rbac.request_allowed(_rbac.cluster_role_rules(), method, path)


@pytest.mark.parametrize(("method", "path"), FORBIDDEN_REQUESTS)
def test_other_requests_are_denied(method: str, path: str) -> None:
    assert not _rbac.request_allowed(_rbac.cluster_role_rules(), method, path)


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("GET", "/api/v1/pods?watch=true", ("watch", "", "pods", "", "", "")),
        ("GET", "/api/v1/pods", ("list", "", "pods", "", "", "")),
        ("GET", "/api/v1/namespaces/x/pods", ("list", "", "pods", "", "x", "")),
        ("GET", "/api/v1/namespaces/x/pods/y", ("get", "", "pods", "", "x", "y")),
        ("HEAD", "/api/v1/namespaces/x/pods/y", ("get", "", "pods", "", "x", "y")),
        ("PATCH", "/api/v1/namespaces/x/pods/y/status", ("patch", "", "pods", "status", "x", "y")),
        ("PUT", "/api/v1/namespaces/x/pods/y/status", ("update", "", "pods", "status", "x", "y")),
        (
            "GET",
            "/apis/resource.k8s.io/v1/namespaces/x/resourceclaims/y",
            ("get", "resource.k8s.io", "resourceclaims", "", "x", "y"),
        ),
        (
            "GET",
            "/apis/resource.k8s.io/v1/resourceclaims?watch=1",
            ("watch", "resource.k8s.io", "resourceclaims", "", "", ""),
        ),
        ("GET", "/api/v1/watch/namespaces/x/pods", ("watch", "", "pods", "", "x", "")),
        (
            "GET",
            "/api/v1/namespaces/x/pods?fieldSelector=metadata.name%3Dy",
            ("list", "", "pods", "", "x", "y"),
        ),
        ("POST", "/api/v1/namespaces/x/events", ("create", "", "events", "", "x", "")),
        ("DELETE", "/api/v1/namespaces/x/pods", ("deletecollection", "", "pods", "", "x", "")),
        ("DELETE", "/api/v1/namespaces/x/pods/y", ("delete", "", "pods", "", "x", "y")),
        ("GET", "/api/v1/namespaces/x", ("get", "", "namespaces", "", "x", "x")),
        ("PUT", "/api/v1/namespaces/x/status", ("update", "", "namespaces", "status", "x", "x")),
        ("GET", "/api/v1/nodes/n", ("get", "", "nodes", "", "", "n")),
    ],
)
def test_request_attributes(method: str, path: str, expected: tuple[str, ...]) -> None:
    a = _rbac.request_attributes(method, path)
    assert a.is_resource_request
    assert (a.verb, a.group, a.resource, a.subresource, a.namespace, a.name) == expected


@pytest.mark.parametrize("path", ["/version", "/healthz", "/api", "/apis", "/api/v1"])
def test_request_attributes_non_resource(path: str) -> None:
    a = _rbac.request_attributes("GET", path)
    assert not a.is_resource_request
    assert (a.verb, a.path) == ("get", path)


def test_rbac_allows_wildcards_and_names() -> None:
    rules: list[Obj] = [
        {"apiGroups": ["*"], "resources": ["*/status"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"], "resourceNames": ["c"]},
        {"nonResourceURLs": ["/metrics"], "verbs": ["get"]},
    ]
    assert _rbac.rbac_allows(rules, "get", "apps", "deployments", "status")
    assert not _rbac.rbac_allows(rules, "get", "apps", "deployments")
    assert _rbac.rbac_allows(rules, "update", "", "configmaps", name="c")
    assert not _rbac.rbac_allows(rules, "update", "", "configmaps", name="d")
    assert not _rbac.rbac_allows(rules, "list", "", "configmaps")
    assert _rbac.request_allowed(rules, "GET", "/metrics")
    assert not _rbac.request_allowed(rules, "GET", "/logs/x")
    # Rules in the client's snake_case form (V1PolicyRule.to_dict()) work too.
    snake = kubernetes.client.V1PolicyRule(
        api_groups=[""], resources=["pods"], verbs=["get"]
    ).to_dict()
    assert _rbac.rbac_allows([snake], "get", "", "pods")


# -- the ValidatingAdmissionPolicy ---------------------------------------------------


@pytest.fixture(scope="module")
def vap() -> Obj:
    return _named("ValidatingAdmissionPolicy", "kubelet-dra-health-own-node")


def test_vap_matches_pod_status_updates(vap: Obj) -> None:
    spec = vap["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["UPDATE"],
            "resources": ["pods/status"],
        }
    ]
    for validation in spec["validations"]:
        assert validation["reason"] in {"Forbidden", "Unauthorized", "Invalid"}
        assert validation["message"]
    # The RBAC rules allow no other write on pods that the policy would have to cover,
    # and every other write is on devicetaintrules (test_deploy_taints.py's policy).
    writes = {(g, r) for g, r, v in REQUIRED_RULES if v in {"create", "update", "patch", "delete"}}
    assert ("", "pods") not in writes
    assert writes == {("", "pods/status"), ("", "events"), ("resource.k8s.io", "devicetaintrules")}


try:
    import celpy
    from celpy import celtypes
    from celpy.adapter import json_to_cel
except ImportError:  # pragma: no cover - cel-python is an optional test dependency
    celpy = None  # type: ignore[assignment]  # None: the tests below skip

HAVE_CEL = celpy is not None
needs_cel = pytest.mark.skipif(not HAVE_CEL, reason="cel-python (import celpy) is not installed")


def _token_extra(node: str | None) -> dict[str, list[str]]:
    extra = {
        "authentication.kubernetes.io/credential-id": ["JTI=7e1c"],
        "authentication.kubernetes.io/pod-name": ["kubelet-dra-health-x7k2p"],
        "authentication.kubernetes.io/pod-uid": ["0b5f6c8e"],
    }
    if node is not None:
        extra[NODE_NAME_EXTRA] = [node]
        extra["authentication.kubernetes.io/node-uid"] = ["5d2a"]
    return extra


def _request(username: str, extra: dict[str, list[str]] | None) -> Obj:
    user: Obj = {"username": username, "uid": "u-1", "groups": ["system:authenticated"]}
    if extra is not None:
        user["extra"] = extra
    return {
        "uid": "r-1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "subResource": "status",
        "name": "train-0",
        "namespace": "team",
        "operation": "UPDATE",
        "userInfo": user,
    }


def _pod(node: str | None) -> Obj:
    spec: Obj = {"containers": [{"name": "main", "image": "busybox"}]}
    if node is not None:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train-0", "namespace": "team"},
        "spec": spec,
        "status": {"phase": "Running"},
    }


def _evaluate(vap: Obj, request: Obj, obj: Obj, old: Obj) -> tuple[bool, str]:
    """Admit or deny, and the message: the policy's semantics over cel-python.

    matchConditions all true, else the policy does not apply (admitted);
    variables in order, each visible to the next as ``variables.<name>``;
    every validation must be true, the first false one gives the message
    (``messageExpression`` when it evaluates to a string, else ``message``).
    """
    env = celpy.Environment()

    def run(expression: str, activation: Mapping[str, Any]) -> Any:
        return env.program(env.compile(expression)).evaluate(dict(activation))

    spec = vap["spec"]
    activation: dict[str, Any] = {
        "request": json_to_cel(request),
        "object": json_to_cel(obj),
        "oldObject": json_to_cel(old),
        "params": json_to_cel(None),
    }
    for condition in spec.get("matchConditions", []):
        if not bool(run(condition["expression"], activation)):
            return True, "not matched"
    variables: dict[Any, Any] = {}
    for variable in spec.get("variables", []):
        activation["variables"] = celtypes.MapType(variables)
        variables[celtypes.StringType(variable["name"])] = run(variable["expression"], activation)
    activation["variables"] = celtypes.MapType(variables)
    for validation in spec["validations"]:
        if not bool(run(validation["expression"], activation)):
            message = validation.get("message", "")
            if "messageExpression" in validation:
                message = str(run(validation["messageExpression"], activation))
            return False, message
    return True, "admitted"


@needs_cel
def test_vap_expressions_compile(vap: Obj) -> None:
    env = celpy.Environment()
    spec = vap["spec"]
    expressions = [c["expression"] for c in spec["matchConditions"]]
    expressions += [v["expression"] for v in spec["variables"]]
    for validation in spec["validations"]:
        expressions.append(validation["expression"])
        if "messageExpression" in validation:
            expressions.append(validation["messageExpression"])
    for expression in expressions:
        env.compile(expression)


@needs_cel
def test_vap_admits_own_node(vap: Obj) -> None:
    admitted, message = _evaluate(
        vap, _request(SA_USERNAME, _token_extra("node-a")), _pod("node-a"), _pod("node-a")
    )
    assert admitted, message
    assert message == "admitted"


@needs_cel
def test_vap_rejects_other_node(vap: Obj) -> None:
    admitted, message = _evaluate(
        vap, _request(SA_USERNAME, _token_extra("node-a")), _pod("node-b"), _pod("node-b")
    )
    assert not admitted
    assert message == (
        'kubelet-dra-health on node "node-a" may write the status only of pods on its own'
        ' node; pod team/train-0 is on node "node-b"'
    )


@needs_cel
@pytest.mark.parametrize(("new", "old"), [("node-a", "node-b"), ("node-b", "node-a")])
def test_vap_rejects_moving_a_pod(vap: Obj, new: str, old: str) -> None:
    admitted, _ = _evaluate(
        vap, _request(SA_USERNAME, _token_extra("node-a")), _pod(new), _pod(old)
    )
    assert not admitted


@needs_cel
def test_vap_rejects_unscheduled_pod(vap: Obj) -> None:
    admitted, message = _evaluate(
        vap, _request(SA_USERNAME, _token_extra("node-a")), _pod(None), _pod(None)
    )
    assert not admitted
    assert 'is on node ""' in message


@needs_cel
@pytest.mark.parametrize(
    "extra",
    [
        None,  # a token with no extra at all (legacy secret-based token)
        {},
        _token_extra(None),  # bound to a pod, but the server adds no node claim (< 1.30)
        {NODE_NAME_EXTRA: []},
        {NODE_NAME_EXTRA: ["node-a", "node-b"]},
        {NODE_NAME_EXTRA: [""]},
    ],
    ids=["no-extra", "empty-extra", "no-node-claim", "empty-claim", "two-nodes", "empty-name"],
)
def test_vap_rejects_token_without_node_name(vap: Obj, extra: dict[str, list[str]] | None) -> None:
    admitted, message = _evaluate(vap, _request(SA_USERNAME, extra), _pod(""), _pod(""))
    assert not admitted
    assert NODE_NAME_EXTRA in message


@needs_cel
@pytest.mark.parametrize(
    "username",
    [
        "system:node:node-b",
        "system:serviceaccount:kube-system:kubelet-dra-health",
        "system:serviceaccount:kubelet-dra-health:default",
        "admin",
    ],
)
def test_vap_ignores_other_users(vap: Obj, username: str) -> None:
    admitted, message = _evaluate(
        vap, _request(username, _token_extra("node-a")), _pod("node-b"), _pod("node-b")
    )
    assert admitted
    assert message == "not matched"
