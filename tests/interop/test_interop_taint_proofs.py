"""Interop proofs: health that acts, with the real scheduler and controller manager 1.37.2.

A real kube-apiserver (DRA on: 1.37 defaults), kube-scheduler and kube-controller-manager
(Job, resource-claim and device-taint-eviction controllers), the Go interop driver
streaming device health, and our sidecar. Each proof has its own node: a Node object, a
ResourceSlice of the test offering that node's devices (pool = node name), and a sidecar
for that node. No kubelet runs: the scheduler binds pods, nobody starts them, and the test
sets a pod's phase ``Failed`` where a kubelet would.

1. ``NoSchedule``: device A Unhealthy longer than ``--taint-after`` -> the rule appears -> a
   new pod's claim gets B, never A; another pod waits; A Healthy for ``--untaint-after`` ->
   the rule goes -> the waiting pod gets A.
2. ``NoExecute``: the real eviction controller marks a pod on a tainted device
   ``DisruptionTarget`` and deletes it; a pod whose claim tolerates the taint stays.
3. Jobs with ``podFailurePolicy`` on our ``DeviceHealthy=False`` condition: ``Ignore`` does
   not count the failure, ``FailJob`` fails the Job with reason ``PodFailurePolicy``; the
   same failure without our condition counts against ``backoffLimit``.
4. Outage: the API server stops for 20 s while a device turns Unhealthy; afterwards the
   rule exists once, created by one successful request, and the pod status was written.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kubelet_dra.status.podjson import MutableObj as Obj
from kubelet_dra.testing import eventually_sync
from tests.conftest import interop_binary

from . import _controlplane as cp
from ._apiserver import KubeApiServer, start_kube_apiserver
from ._cluster import RealCluster, SidecarProcess, condition
from ._driver import DriverProcess, device

pytestmark = [pytest.mark.interop, pytest.mark.timeout(420)]

DRIVER = "gpu.taints.example.com"
KEY = "kubelet-dra.io/unhealthy"
HOLD = "kubelet-dra.io/test-hold"
DriverFactory = Callable[..., DriverProcess]


@pytest.fixture(scope="module")
def control_plane(
    kube_apiserver_factory: Callable[..., KubeApiServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[KubeApiServer, cp.Controllers]]:
    server = kube_apiserver_factory()
    controllers = cp.start_controllers(
        server,
        scheduler_bin=interop_binary("kube-scheduler"),
        manager_bin=interop_binary("kube-controller-manager"),
        workdir=tmp_path_factory.mktemp("controllers"),
    )
    try:
        yield server, controllers
    finally:
        controllers.stop()


@pytest.fixture
def cluster(control_plane: tuple[KubeApiServer, cp.Controllers]) -> Iterator[RealCluster]:
    real = RealCluster(control_plane[0])
    yield real
    real.close()


def _json(response: Any) -> Obj:
    data: Obj = json.loads(response.data)
    return data


def ignore_exists(create: Callable[[], Any]) -> None:
    try:
        create()
    except ApiException as exc:
        if exc.status != 409:
            raise


class NodeRig:
    """One node with its devices in a ResourceSlice, a namespace, a driver and a sidecar."""

    def __init__(self, cluster: RealCluster, devices: list[str], tmp_path: Path) -> None:
        self.cluster = cluster
        self.node = f"node-{uuid.uuid4().hex[:8]}"
        self.namespace = f"ns-{self.node}"
        self.devices = devices
        self.tmp_path = tmp_path
        core, resource = cluster.core, cluster.resource
        core.create_node(cp.node(self.node))
        # The TaintNodesByCondition admission plugin taints a new Node not-ready; no kubelet
        # will clear it, so the test does (the node is "ready" for the scheduler).
        core.patch_node(self.node, {"spec": {"taints": []}})
        cluster.ensure_namespace(self.namespace)
        ignore_exists(lambda: resource.create_device_class(cp.device_class(DRIVER)))
        resource.create_resource_slice(cp.resource_slice(DRIVER, self.node, devices))
        self.driver: DriverProcess | None = None

    def script(self, **health: str) -> Obj:
        return {
            "devices": [
                device(d, health.get(d.replace("-", "_"), "HEALTHY"), pool=self.node,
                       message="XID 79" if health.get(d.replace("-", "_")) == "UNHEALTHY" else "")
                for d in self.devices
            ],
            "resend_seconds": 1,
        }  # fmt: skip

    def start_driver(self, factory: DriverFactory, registry: Path, **health: str) -> None:
        self.driver = factory(
            "current", driver_name=DRIVER, registry_dir=registry, script=self.script(**health)
        )

    def set_health(self, **health: str) -> None:
        assert self.driver is not None
        self.driver.control(self.script(**health))

    def sidecar(self, *flags: str) -> SidecarProcess:
        assert self.driver is not None
        kubeconfig = self.cluster.write_kubeconfig(self.tmp_path / f"{self.node}.kubeconfig")
        return SidecarProcess(
            node=self.node, kubeconfig=kubeconfig, registry=self.driver.registry_dir,
            state_dir=self.tmp_path / f"state-{self.node}", flags=flags,
        )  # fmt: skip

    # reads

    def rules(self) -> list[Obj]:
        listed = self.cluster.resource.list_device_taint_rule(
            label_selector=f"kubelet-dra.io/node={self.node}", _preload_content=False
        )
        items: list[Obj] = _json(listed)["items"]
        return items

    def rule_devices(self) -> set[str]:
        return {r["spec"]["deviceSelector"]["device"] for r in self.rules()}

    def claim(self, name: str) -> Obj:
        return _json(
            self.cluster.resource.read_namespaced_resource_claim(
                name, self.namespace, _preload_content=False
            )
        )

    def pod(self, name: str) -> Obj | None:
        try:
            return self.cluster.get_pod(self.namespace, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    # writes

    def create_claim_and_pod(
        self, name: str, tolerate: str | None = None, finalizers: tuple[str, ...] = ()
    ) -> None:
        self.cluster.resource.create_namespaced_resource_claim(
            self.namespace, cp.claim(name, self.namespace, DRIVER, tolerate)
        )
        body = cp.pod(name, self.namespace, name, self.node)
        if finalizers:
            body["metadata"]["finalizers"] = list(finalizers)
        self.cluster.core.create_namespaced_pod(self.namespace, body)


def wait(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    *watched: SidecarProcess,
    detail: Callable[[], str] = str,
) -> Any:
    """:func:`eventually_sync` while the ``watched`` sidecars run; fail with ``detail()``
    and their logs."""

    def check() -> Any:
        for sidecar in watched:
            sidecar.check_running()
        return predicate()

    try:
        return eventually_sync(check, what=what, timeout=timeout, interval=0.2)
    except AssertionError as exc:
        logs = "\n".join(s.log[-4000:] for s in watched)
        raise AssertionError(f"{exc}\n{detail()}\n{logs}") from None


# -- proof 1 ---------------------------------------------------------------------------------------


def test_proof1_tainted_device_is_not_allocated_until_untainted(
    cluster: RealCluster,
    control_plane: tuple[KubeApiServer, cp.Controllers],
    interop_driver: DriverFactory,
    interop_socket_dir: Path,
    tmp_path: Path,
) -> None:
    controllers = control_plane[1]
    rig = NodeRig(cluster, ["gpu-a", "gpu-b"], tmp_path)
    rig.start_driver(interop_driver, interop_socket_dir / "registry", gpu_a="UNHEALTHY")
    flags = ("--taint-effect", "NoSchedule", "--taint-after", "2", "--untaint-after", "4")
    with rig.sidecar(*flags) as sidecar:
        wait(lambda: rig.rule_devices() == {"gpu-a"}, 60, "the rule for gpu-a", sidecar)
        (rule,) = rig.rules()
        assert rule["spec"]["taint"]["effect"] == "NoSchedule"
        # A new pod whose claim asks for one device gets B, never A.
        rig.create_claim_and_pod("first")
        allocated = wait(
            lambda: cp.allocated_device(rig.claim("first")),
            90,
            "the scheduler to allocate the first claim",
            sidecar,
            detail=controllers.logs,
        )
        assert allocated == "gpu-b"
        first = rig.pod("first")
        wait(lambda: (rig.pod("first") or {}).get("spec", {}).get("nodeName"), 30, "binding")
        # A second pod cannot be placed: A is tainted, B is taken.
        rig.create_claim_and_pod("second")
        wait(
            lambda: (
                (condition(rig.pod("second") or {}, "PodScheduled") or {}).get("reason")
                == "Unschedulable"
            ),
            60,
            "the second pod unschedulable",
            sidecar,
            detail=controllers.logs,
        )
        assert cp.allocated_device(rig.claim("second")) is None
        # A Healthy for --untaint-after: the rule goes and A is allocatable again.
        rig.set_health()
        wait(lambda: rig.rules() == [], 60, "the rule to be deleted", sidecar)
        assert (
            wait(
                lambda: cp.allocated_device(rig.claim("second")),
                120,
                "the second claim allocated after the untaint",
                sidecar,
                detail=controllers.logs,
            )
            == "gpu-a"
        )
        assert first is not None
    assert sidecar.grep("taint bridge on: resource.k8s.io/v1, effect NoSchedule")


# -- proof 2 ---------------------------------------------------------------------------------------


def test_proof2_noexecute_evicts_unless_tolerated(
    cluster: RealCluster,
    control_plane: tuple[KubeApiServer, cp.Controllers],
    interop_driver: DriverFactory,
    interop_socket_dir: Path,
    tmp_path: Path,
) -> None:
    controllers = control_plane[1]
    rig = NodeRig(cluster, ["gpu-a", "gpu-b"], tmp_path)
    rig.start_driver(interop_driver, interop_socket_dir / "registry")
    with rig.sidecar("--taint-effect", "NoExecute", "--taint-after", "1") as sidecar:
        # A finalizer keeps the evicted pod readable: the test sees what the controller did.
        rig.create_claim_and_pod("plain", finalizers=(HOLD,))
        rig.create_claim_and_pod("tolerant", tolerate=KEY)
        devices = {
            name: wait(
                lambda: cp.allocated_device(rig.claim(name)),  # noqa: B023  # called at once
                90,
                f"claim {name} allocated",
                sidecar,
                detail=controllers.logs,
            )
            for name in ("plain", "tolerant")
        }
        for name in devices:
            wait(lambda: (rig.pod(name) or {}).get("spec", {}).get("nodeName"), 30, name)  # noqa: B023
        # Both devices turn Unhealthy: both are tainted NoExecute.
        rig.set_health(gpu_a="UNHEALTHY", gpu_b="UNHEALTHY")
        wait(lambda: rig.rule_devices() == {"gpu-a", "gpu-b"}, 60, "two rules", sidecar)
        plain = wait(
            lambda: (p := rig.pod("plain")) and p["metadata"].get("deletionTimestamp") and p,
            120,
            "the plain pod evicted",
            sidecar,
            detail=controllers.logs,
        )
        target = condition(plain, "DisruptionTarget")
        assert target is not None, plain["status"]
        assert (target["status"], target["reason"]) == ("True", "DeletionByDeviceTaintManager")
        # The tolerating pod stays, on its tainted device.
        time.sleep(5)
        tolerant = rig.pod("tolerant")
        assert tolerant is not None
        assert not tolerant["metadata"].get("deletionTimestamp")
        assert condition(tolerant, "DisruptionTarget") is None
        assert cp.allocated_device(rig.claim("tolerant")) == devices["tolerant"]
        # Let the evicted pod go.
        cluster.core.patch_namespaced_pod(
            "plain", rig.namespace, {"metadata": {"finalizers": None}}
        )
        wait(lambda: rig.pod("plain") is None, 30, "the evicted pod gone")
    assert "Evicted pod by deleting it" in controllers.manager.tail(500_000)


# -- proof 3 ---------------------------------------------------------------------------------------


def job(name: str, action: str | None, node: str) -> Obj:
    spec: Obj = {
        "backoffLimit": 0,
        "template": {
            "spec": cp.pod_spec({"resourceClaimTemplateName": "gpu"}, node),
        },
    }
    if action is not None:
        spec["podFailurePolicy"] = {
            "rules": [
                {
                    "action": action,
                    "onPodConditions": [{"type": "DeviceHealthy", "status": "False"}],
                }
            ]
        }
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec}


def test_proof3_job_pod_failure_policy_on_our_condition(
    cluster: RealCluster,
    control_plane: tuple[KubeApiServer, cp.Controllers],
    interop_driver: DriverFactory,
    interop_socket_dir: Path,
    tmp_path: Path,
) -> None:
    controllers = control_plane[1]
    rig = NodeRig(cluster, ["gpu-0", "gpu-1", "gpu-2"], tmp_path)
    rig.start_driver(interop_driver, interop_socket_dir / "registry")
    batch = client.BatchV1Api(cluster.api)
    ns = rig.namespace
    cluster.resource.create_namespaced_resource_claim_template(
        ns,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "gpu"},
            "spec": {"spec": cp.device_request(DRIVER)},
        },
    )
    names = {"ignore": "Ignore", "failjob": "FailJob", "control": None}
    with rig.sidecar() as sidecar:  # the bridge is off: only the pod condition matters here
        for name, action in names.items():
            batch.create_namespaced_job(ns, job(name, action, rig.node))

        def job_pods(name: str) -> list[Obj]:
            listed = cluster.core.list_namespaced_pod(
                ns, label_selector=f"job-name={name}", _preload_content=False
            )
            items: list[Obj] = _json(listed)["items"]
            return items

        def device_of(pod: Obj) -> str | None:
            for entry in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
                return cp.allocated_device(rig.claim(entry["resourceClaimName"]))
            return None

        pods = {
            name: wait(
                lambda: [p for p in job_pods(name) if device_of(p)],  # noqa: B023  # called at once
                120,
                f"job {name}'s pod scheduled with a device",
                sidecar,
                detail=controllers.logs,
            )[0]
            for name in names
        }
        gpus = {name: device_of(pod) for name, pod in pods.items()}
        assert sorted(str(g) for g in gpus.values()) == ["gpu-0", "gpu-1", "gpu-2"]
        # The devices of the Ignore and FailJob pods break; the control pod's stays healthy.
        broken = {gpus["ignore"], gpus["failjob"]}
        rig.set_health(**{str(d).replace("-", "_"): "UNHEALTHY" for d in broken})

        def cond(name: str) -> str | None:
            pod = rig.pod(pods[name]["metadata"]["name"]) or {}
            return (condition(pod, "DeviceHealthy") or {}).get("status")

        for name, expected in (("ignore", "False"), ("failjob", "False"), ("control", "True")):
            wait(lambda: cond(name) == expected, 60, f"{name}: DeviceHealthy", sidecar)  # noqa: B023
        # The containers fail, as a kubelet would report it.
        for pod in pods.values():
            cluster.patch_status(ns, pod["metadata"]["name"], failed_status())
        for name, expected in (("ignore", "False"), ("failjob", "False"), ("control", "True")):
            assert cond(name) == expected  # still there on the failed pod

        def job_status(name: str) -> Obj:
            status: Obj = (
                _json(batch.read_namespaced_job(name, ns, _preload_content=False)).get("status")
                or {}
            )
            return status

        def failed_reason(name: str) -> str | None:
            for c in job_status(name).get("conditions") or []:
                if c["type"] == "Failed" and c["status"] == "True":
                    return str(c["reason"])
            return None

        detail = controllers.logs
        assert (
            wait(lambda: failed_reason("failjob"), 90, "FailJob", sidecar, detail=detail)
            == "PodFailurePolicy"
        )
        assert (
            wait(lambda: failed_reason("control"), 90, "control", sidecar, detail=detail)
            == "BackoffLimitExceeded"
        )
        assert job_status("control").get("failed") == 1
        # Ignore: the failure is not counted and the pod is replaced.
        wait(lambda: len(job_pods("ignore")) >= 2, 90, "a replacement pod", sidecar, detail=detail)
        status = job_status("ignore")
        assert failed_reason("ignore") is None
        assert not status.get("failed")


def failed_status() -> Obj:
    return {
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "main",
                    "image": "registry.invalid/train:1",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": {"exitCode": 1, "reason": "Error"}},
                }
            ],
        }
    }


# -- proof 4 ---------------------------------------------------------------------------------------


@pytest.fixture
def own_apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeApiServer]:
    """A server of this test alone: it is stopped and started again."""
    server = start_kube_apiserver(
        etcd_bin=interop_binary("etcd"),
        apiserver_bin=interop_binary("kube-apiserver"),
        workdir=tmp_path_factory.mktemp("outage-apiserver"),
        feature_gates={"ResourceHealthStatus": True},
    )
    try:
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.stop()


def test_proof4_outage_creates_the_rule_once(
    own_apiserver: KubeApiServer,
    interop_driver: DriverFactory,
    interop_socket_dir: Path,
    tmp_path: Path,
) -> None:
    from kubelet_dra.testing.fakeapi import PodClaim, make_claim, make_pod

    cluster = RealCluster(own_apiserver)
    node = f"node-{uuid.uuid4().hex[:8]}"
    namespace = "outage"
    pod = cluster.create_pod(
        make_pod("train", node, namespace=namespace, claims=[PodClaim("gpu", "train-gpu")])
    )
    cluster.create_claim(
        make_claim("train-gpu", namespace, [(DRIVER, node, "gpu-0", "gpu")],
                   reserved_for=[pod], node=node)
    )  # fmt: skip
    driver = interop_driver(
        "current", driver_name=DRIVER, registry_dir=interop_socket_dir / "registry",
        script={"devices": [device("gpu-0", pool=node)], "resend_seconds": 1},
    )  # fmt: skip
    kubeconfig = cluster.write_kubeconfig(tmp_path / "admin.kubeconfig")
    selector = f"kubelet-dra.io/node={node}"

    def rules() -> list[Obj]:
        listed = cluster.resource.list_device_taint_rule(
            label_selector=selector, _preload_content=False
        )
        items: list[Obj] = _json(listed)["items"]
        return items

    def health_condition() -> str | None:
        found = condition(cluster.get_pod(namespace, "train"), "DeviceHealthy") or {}
        return found.get("status")

    with SidecarProcess(
        node=node, kubeconfig=kubeconfig, registry=driver.registry_dir,
        state_dir=tmp_path / "state", flags=("--taint-effect", "NoSchedule", "--taint-after", "2"),
    ) as sidecar:  # fmt: skip
        sidecar.until(lambda: sidecar.grep("taint bridge on"), 60, "the bridge on")
        sidecar.until(lambda: health_condition() == "True", 60, "the pod written Healthy")
        cp.stop_apiserver(own_apiserver)
        started = time.monotonic()
        driver.control(
            {"devices": [device("gpu-0", "UNHEALTHY", pool=node, message="XID 79")],
             "resend_seconds": 1}
        )  # fmt: skip
        time.sleep(max(0.0, 20 - (time.monotonic() - started)))
        cp.start_apiserver(own_apiserver)
        down = time.monotonic() - started
        (rule,) = sidecar.until(rules, 90, "the rule after the outage")
        sidecar.until(lambda: health_condition() == "False", 60, "the pod written Unhealthy")
        time.sleep(5)  # anything more would have happened by now
        assert len(rules()) == 1
        assert rules()[0]["metadata"]["uid"] == rule["metadata"]["uid"]
        assert rule["metadata"]["generation"] == 1  # created once, never rewritten
        assert rule["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": node, "device": "gpu-0"}
        assert rule["spec"]["taint"]["value"] == "Unhealthy"
        assert sidecar.metric('kubelet_dra_taint_rule_writes_total{op="create",result="ok"}') == 1
        assert sidecar.metric('kubelet_dra_taint_rules{effect="NoSchedule"}') == 1
        assert not sidecar.grep("taint bridge off")
        assert sidecar.grep("taint bridge: .*retrying")  # it did see the outage
    cluster.close()
    assert down >= 20
