"""Interop: ``kubelet-dra-health run`` against the real kube-apiserver 1.37 (and, with the same
assertions, against the FakeApiServer), fed by the Go driver on the 1.37 kubeletplugin helper.

No scheduler or kubelet runs: the tests create pods with ``spec.nodeName`` set and write their
initial status themselves, and create resource.k8s.io/v1 ResourceClaims with an allocation.
Each test uses its own namespace and node name, so sidecars on the shared server never see
each other's pods. What the tests prove:

- the sidecar's status writes pass the real validation (``claim:<ref>/<request>`` and
  ``claim:<ref>`` names, health values, a multi-byte message cut to 1024 bytes, one
  resourceID per device) and its Events are accepted;
- the real merge semantics hold: other containers' statuses and other conditions (including
  one added by a third party between our writes) are preserved;
- with ResourceHealthStatus (and ResourceHealthStatusMessage) off the field is dropped and we
  say so once: one log line, ``kubelet_dra_api_field_dropped`` 1, one Node Event;
- a "kubelet" that rewrites container statuses whole causes no write war in ``auto`` mode.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kubelet_dra.testing.fakeapi import (
    Container,
    FakeApiServer,
    PodClaim,
    fresh_container_statuses,
    make_claim,
    make_pod,
)

from ._cluster import (
    Cluster,
    FakeCluster,
    RealCluster,
    SidecarProcess,
    condition,
    container_status,
    health_entries,
    poll,
)
from ._driver import DriverProcess, device

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

DRIVER = "gpu.interop.example.com"
GATES_OFF = {"ResourceHealthStatus": False, "ResourceHealthStatusMessage": False}
DriverFactory = Callable[..., DriverProcess]
WRITES_OK = 'kubelet_dra_pod_writes_total{result="ok"}'
REMOVES_LINE = "removes containerStatuses\\[\\]\\.allocatedResourcesStatus"


@pytest.fixture(params=["real", "fake"])
def cluster(
    request: pytest.FixtureRequest, kube_apiserver_factory: Callable[..., Any]
) -> Iterator[Cluster]:
    """The real kube-apiserver (configured by ``@pytest.mark.kube_apiserver``) or the
    FakeApiServer with the same feature gates."""
    marker = request.node.get_closest_marker("kube_apiserver")
    kwargs = dict(marker.kwargs) if marker is not None else {}
    if request.param == "real":
        real = RealCluster(kube_apiserver_factory(**kwargs))
        yield real
        real.close()
        return
    gates = kwargs.get("feature_gates", {})
    with FakeApiServer() as server:
        server.health_gate = gates.get("ResourceHealthStatus", True)
        server.message_gate = gates.get("ResourceHealthStatusMessage", server.health_gate)
        fake = FakeCluster(server)
        yield fake
        fake.close()


class Scenario:
    """A namespace, a node name, the Go driver and the sidecar watching its registry."""

    def __init__(self, cluster: Cluster, driver: DriverProcess, tmp: Path, sockets: Path):
        self.cluster = cluster
        self.driver = driver
        self.namespace = f"sidecar-{uuid.uuid4().hex[:8]}"
        self.node = f"node-{uuid.uuid4().hex[:8]}"
        self.tmp, self.sockets = tmp, sockets
        cluster.ensure_namespace(self.namespace)

    def create_workload(self, name: str = "workload") -> dict[str, Any]:
        """Container ``main`` uses claim ``gpu`` (request ``gpu``: gpu-0, gpu-1) and claim
        ``nic`` without a request (nic-0); container ``other`` uses none."""
        pod = make_pod(
            name, self.node, namespace=self.namespace,
            claims=[PodClaim("gpu", f"{name}-gpu"), PodClaim("nic", f"{name}-nic")],
            containers=[Container("main", claims=[("gpu", "gpu"), "nic"]), Container("other")],
        )  # fmt: skip
        created = self.cluster.create_pod(pod)
        gpus = [(DRIVER, "pool-0", "gpu-0", "gpu"), (DRIVER, "pool-0", "gpu-1", "gpu")]
        for claim, results in (
            (f"{name}-gpu", gpus),
            (f"{name}-nic", [(DRIVER, "pool-0", "nic-0", "nic")]),
        ):
            self.cluster.create_claim(
                make_claim(claim, self.namespace, results, reserved_for=[created], node=self.node)
            )
        return created

    def sidecar(self, *flags: str, token: str | None = None) -> SidecarProcess:
        kubeconfig = self.cluster.write_kubeconfig(self.tmp / "sidecar.kubeconfig", token)
        return SidecarProcess(
            node=self.node, kubeconfig=kubeconfig, registry=self.driver.registry_dir,
            state_dir=self.tmp / "state", flags=flags,
        )  # fmt: skip

    def pod(self, name: str = "workload") -> dict[str, Any]:
        return self.cluster.get_pod(self.namespace, name)

    def pod_if(self, predicate: Callable[[dict[str, Any]], Any]) -> Callable[[], Any]:
        """For polling: the pod when ``predicate(pod)`` holds, else None."""

        def check() -> dict[str, Any] | None:
            pod = self.pod()
            return pod if predicate(pod) else None

        return check


@pytest.fixture
def scenario(
    cluster: Cluster,
    interop_driver: DriverFactory,
    interop_socket_dir: Path,
    tmp_path: Path,
) -> Scenario:
    driver = interop_driver(
        "current", driver_name=DRIVER, registry_dir=interop_socket_dir / "registry",
        script={"devices": [device("gpu-0"), device("gpu-1"), device("nic-0")]},
    )  # fmt: skip
    return Scenario(cluster, driver, tmp_path, interop_socket_dir)


def rid(name: str) -> str:
    return f"{DRIVER}/pool-0/{name}"


LONG = "é" * 600  # 1200 bytes: cut to 1021 bytes on a character boundary, plus "..."


def test_writes_pass_real_validation_and_merge(scenario: Scenario) -> None:
    before = scenario.create_workload()
    scenario.driver.control(
        {
            "devices": [
                device("gpu-0", "UNHEALTHY", message=LONG),
                device("gpu-1", "HEALTHY"),
                device("nic-0", "HEALTHY", message="link up"),
            ]
        }
    )
    with scenario.sidecar() as sidecar:
        # Both claims written (under load the nic claim's GET can land after the first write).
        pod = sidecar.until(
            scenario.pod_if(
                lambda p: "Unhealthy" in str(health_entries(p)) and "claim:nic" in health_entries(p)
            ),
            what="both claims written",
        )
        entries = health_entries(pod)
        assert sorted(entries) == ["claim:gpu/gpu", "claim:nic"]
        assert sorted(entries["claim:gpu/gpu"]) == [
            (rid("gpu-0"), "Unhealthy", "é" * 510 + "..."),
            (rid("gpu-1"), "Healthy", ""),
        ]
        assert len(entries["claim:gpu/gpu"][0][2].encode()) <= 1024
        assert entries["claim:nic"] == [(rid("nic-0"), "Healthy", "link up")]
        # The other container and every other condition are as the "kubelet" wrote them.
        assert container_status(pod, "other") == container_status(before, "other")
        main_before = {k: v for k, v in container_status(before, "main").items()}
        main_now = dict(container_status(pod, "main"))
        main_now.pop("allocatedResourcesStatus")
        assert main_now == main_before
        ours = condition(pod, "DeviceHealthy")
        assert ours is not None and ours["status"] == "False"
        kept = [c for c in pod["status"]["conditions"] if c["type"] != "DeviceHealthy"]
        assert kept == before["status"]["conditions"]
        # A third party adds its own condition; our next write must keep it (merge by type).
        custom = {"type": "example.com/Custom", "status": "True", "reason": "Test"}
        scenario.cluster.patch_status(
            scenario.namespace, "workload", {"status": {"conditions": [custom]}}
        )
        scenario.driver.control(
            {"devices": [device("gpu-0"), device("gpu-1"), device("nic-0", message="link up")]}
        )
        pod = sidecar.until(
            scenario.pod_if(
                lambda p: (condition(p, "DeviceHealthy") or {}).get("status") == "True"
            ),
            what="the change written",
        )
        assert sorted(health_entries(pod)["claim:gpu/gpu"]) == [
            (rid("gpu-0"), "Healthy", ""),
            (rid("gpu-1"), "Healthy", ""),
        ]
        assert (condition(pod, "example.com/Custom") or {}).get("reason") == "Test"
        assert condition(pod, "Ready") == condition(before, "Ready")
        assert container_status(pod, "other") == container_status(before, "other")
        # The Event about gpu-0 passed the real Event validation too.
        sidecar.until(
            lambda: any(
                e.get("reason") == "DeviceUnhealthy"
                for e in scenario.cluster.events(scenario.namespace)
            ),
            what="a DeviceUnhealthy event",
        )
        metrics = sidecar.metrics()
        assert metrics[WRITES_OK] >= 2
        assert metrics['kubelet_dra_pod_writes_total{result="failed"}'] == 0
        assert metrics["kubelet_dra_api_field_dropped"] == 0
        assert not sidecar.grep("not written|Traceback")


@pytest.mark.kube_apiserver(feature_gates=GATES_OFF)
def test_gate_off_detected_once(scenario: Scenario) -> None:
    scenario.create_workload()
    scenario.driver.control(
        {
            "devices": [
                device("gpu-0", "UNHEALTHY", message="ECC"),
                device("gpu-1"),
                device("nic-0"),
            ]
        }
    )
    with scenario.sidecar() as sidecar:
        pod = sidecar.until(
            scenario.pod_if(lambda p: condition(p, "DeviceHealthy")),
            what="the condition written",
        )
        assert health_entries(pod) == {}  # dropped by the server
        sidecar.until(lambda: sidecar.metric("kubelet_dra_api_field_dropped") == 1, what="gauge")

        def node_events() -> list[dict[str, Any]]:
            return [
                e
                for e in scenario.cluster.events("default")
                if e.get("reason") == "ResourceHealthStatusDisabled"
                and e["involvedObject"].get("name") == scenario.node
            ]

        sidecar.until(node_events, what="the Node event")
        # More changes: conditions keep being written; the detection stays single.
        scenario.driver.control({"devices": [device("gpu-0"), device("gpu-1"), device("nic-0")]})
        sidecar.until(
            lambda: (condition(scenario.pod(), "DeviceHealthy") or {}).get("status") == "True",
            what="the next condition",
            detail=lambda: str(condition(scenario.pod(), "DeviceHealthy")),
        )
        assert health_entries(scenario.pod()) == {}
        assert len(sidecar.grep("drops containerStatuses\\[\\]\\.allocatedResourcesStatus")) == 1
        events = node_events()
        assert len(events) == 1 and events[0].get("count", 1) == 1
        assert events[0]["involvedObject"]["kind"] == "Node"
        assert sidecar.metrics()['kubelet_dra_pod_writes_total{result="failed"}'] == 0


def test_kubelet_rewrites_cause_no_write_war(scenario: Scenario) -> None:
    """A kubelet-like writer replaces containerStatuses whole (without our field) every
    0.2 s, as a kubelet with its ResourceHealthStatus gate off does; in auto mode we notice
    that it removes the field, stop the field on the node and say so once (issue 19)."""
    scenario.create_workload()
    scenario.driver.control({"devices": [device("gpu-0", "UNHEALTHY"), device("gpu-1")]})
    with scenario.sidecar("--container-status", "auto") as sidecar:
        sidecar.until(lambda: health_entries(scenario.pod()), what="first write")
        stop = threading.Event()
        kubelet_writes = [0]

        def kubelet() -> None:
            while not stop.wait(0.2):
                current = scenario.pod()
                statuses = fresh_container_statuses(current)
                for cs in statuses:  # something the kubelet always refreshes
                    cs["restartCount"] = kubelet_writes[0] + 1
                scenario.cluster.patch_status(
                    scenario.namespace, "workload", {"status": {"containerStatuses": statuses}}
                )
                kubelet_writes[0] += 1

        thread = threading.Thread(target=kubelet, daemon=True)
        thread.start()
        try:
            sidecar.until(lambda: sidecar.grep(REMOVES_LINE), what="the removal noticed")
            writes_at_start = sidecar.metric(WRITES_OK)
            start_count = kubelet_writes[0]
            poll(lambda: kubelet_writes[0] >= start_count + 15, 20, "15 kubelet writes")
            ours = sidecar.metric(WRITES_OK) - writes_at_start
        finally:
            stop.set()
            thread.join(5)
        assert ours <= 1, f"{ours} writes of ours against {kubelet_writes[0]} kubelet writes"
        pod = scenario.pod()
        assert health_entries(pod) == {}  # the kubelet removes it; we stopped writing it
        assert condition(pod, "DeviceHealthy") is not None  # ours, kept by the merge
        assert len(sidecar.grep(REMOVES_LINE)) == 1
        assert not sidecar.grep("The kubelet writes device health")  # not what happened
        assert sidecar.metric("kubelet_dra_kubelet_removes_field") == 1
        sidecar.until(lambda: removal_events(scenario), what="the Node event")
        assert len(removal_events(scenario)) == 1


def removal_events(scenario: Scenario) -> list[dict[str, Any]]:
    """The sidecar's ``KubeletRemovesResourceHealth`` Events on the scenario's Node."""
    return [
        e
        for e in scenario.cluster.events("default")
        if e.get("reason") == "KubeletRemovesResourceHealth"
        and e["involvedObject"].get("name") == scenario.node
    ]
