"""Device names from the kubelet's PodResources API in the whole pipeline, over real gRPC.

FakeDriver -> DRAHealthManager -> FakeApiServer, with a :class:`FakePodResources` on a
unix socket standing in for the kubelet's ``pod-resources/kubelet.sock``. The pods' claims
come from the API (``driver/pool/device``); the kubelet's answers add the CDI device IDs,
and the pods' resourceIDs follow them: ``List`` at start, ``Get`` for a pod the kubelet
did not list, ``List`` again after the kubelet restarts (no sidecar restart), names kept
for a pod that stopped being listed, and a kubelet that gives no names (gate off, or no
service) leaves ``<driver>/<pool>/<device>`` with a ``/readyz`` note and a metric.
"""

from __future__ import annotations

import pathlib
from typing import Any

from kubelet_dra import manager
from kubelet_dra.state import podresources
from kubelet_dra.status import podstatus
from kubelet_dra.testing import (
    FakeApiServer,
    FakeDriver,
    FakePodResources,
    PodResourcesDevice,
    eventually,
    make_claim,
    make_pod,
)

from ._sidecar_process import DRIVER, NODE, cluster, device, pod_health, settings_for


def _socket(sockdir: pathlib.Path) -> pathlib.Path:
    return sockdir / "kubelet" / "pod-resources" / "kubelet.sock"


def _kubelet(fake: FakePodResources, claim: str, pod: str, *cdi: str, dev: str) -> None:
    fake.set_claim("default", claim, [PodResourcesDevice(DRIVER, "pool", dev, cdi)])
    fake.set_pod("default", pod, {"main": [claim]})


def _settings(sockdir: pathlib.Path, api: FakeApiServer, **extra: Any) -> Any:
    # No real kubelet writes here: no wait for its entries (test_writer_coexist.py).
    return settings_for(sockdir, api, pod_resources_socket=_socket(sockdir),
                        kubelet_field_grace=0, **extra)  # fmt: skip


def _condition(api: FakeApiServer, name: str) -> dict[str, Any]:
    found = podstatus.find_condition(api.get_pod("default", name)["status"], "DeviceHealthy")
    return found or {}


def _touch(api: FakeApiServer, name: str) -> None:
    """An API event for the pod (a label), as the kubelet's status updates make them."""

    def mutate(pod: dict[str, Any]) -> dict[str, Any]:
        pod["metadata"].setdefault("labels", {})["touched"] = "1"
        return pod

    api.update_pod("default", name, mutate)


async def test_names_follow_list_get_and_a_kubelet_restart(
    sockdir: pathlib.Path, api: FakeApiServer
) -> None:
    cluster(api)
    fake = FakePodResources(_socket(sockdir))
    _kubelet(fake, "gpu-a", "train-a", "vendor.com/gpu=gpu0", dev="gpu-0")
    async with fake, FakeDriver(name=DRIVER, registry=sockdir / "reg") as driver:
        await driver.set_health(device("gpu-0", "Unhealthy", message="XID 79"), device("gpu-1"))
        async with manager.DRAHealthManager(_settings(sockdir, api)) as mgr:
            # List at start: train-a named as the kubelet names it; train-b unknown to it.
            await eventually(
                lambda: (
                    pod_health(api, "train-a") == {"vendor.com/gpu=gpu0": ("Unhealthy", "XID 79")}
                )
            )
            await eventually(
                lambda: pod_health(api, "train-b") == {f"{DRIVER}/pool/gpu-1": ("Healthy", "")}
            )
            assert mgr.names is not None and mgr.names.present
            # The kubelet prepares train-b; its next API event asks for it (Get).
            _kubelet(fake, "gpu-b", "train-b", "vendor.com/gpu=gpu1", dev="gpu-1")
            gets = fake.calls["Get"]
            _touch(api, "train-b")
            await eventually(lambda: "vendor.com/gpu=gpu1" in pod_health(api, "train-b"))
            assert fake.calls["Get"] > gets
            # train-a turns terminal (no longer listed) and the kubelet restarts with
            # train-b renamed: the new List renames train-b, train-a keeps its name.
            fake.set_pod("default", "train-a", {"main": ["gpu-a"]}, terminal=True)
            _kubelet(fake, "gpu-b", "train-b", "vendor.com/gpu=gpu1b", dev="gpu-1")
            lists = fake.calls["List"]
            await fake.restart()
            await eventually(
                lambda: "vendor.com/gpu=gpu1b" in pod_health(api, "train-b"),
                what="train-b renamed by the List after the kubelet's restart",
            )
            assert fake.calls["List"] > lists and mgr.names.reconnects >= 1
            assert pod_health(api, "train-a") == {"vendor.com/gpu=gpu0": ("Unhealthy", "XID 79")}
            assert mgr.readiness_notes().get("names") is None
            calls = mgr.metric_state().pod_resources_calls
            assert calls[("List", "OK")] >= 2 and calls[("Get", "OK")] >= 1


async def test_devices_sharing_a_first_cdi_id_get_the_kubelets_names(
    sockdir: pathlib.Path, api: FakeApiServer
) -> None:
    """The kubelet reports each device of a driver after the IDs of the ones before it;
    each device still gets its own IDs: the kubelet's name is the shared one."""
    api.create_claim(
        make_claim("tpus", results=[(DRIVER, "pool", f"tpu-{i}", "tpu") for i in range(3)])
    )
    api.create_pod(make_pod("p", NODE, claims=["tpus"]))
    fake = FakePodResources(_socket(sockdir))
    ids = [("vendor.com/tpu=common", f"vendor.com/tpu=chip{i}") for i in range(3)]
    fake.set_claim(
        "default",
        "tpus",
        [PodResourcesDevice(DRIVER, "pool", f"tpu-{i}", ids[i]) for i in range(3)],
    )
    fake.set_pod("default", "p", {"main": ["tpus"]})
    async with fake, FakeDriver(name=DRIVER, registry=sockdir / "reg") as driver:
        await driver.set_health(
            device("tpu-0"), device("tpu-1", "Unhealthy", message="gone"), device("tpu-2")
        )
        cfg = _settings(sockdir, api, container_status="on")
        async with manager.DRAHealthManager(cfg):
            want = {
                "vendor.com/tpu=chip0": ("Healthy", ""),
                "vendor.com/tpu=chip1": ("Unhealthy", "gone"),
                "vendor.com/tpu=chip2": ("Healthy", ""),
            }
            await eventually(lambda: pod_health(api, "p") == want)
            message = _condition(api, "p")["message"]
            assert f"{DRIVER}/pool/tpu-1 (as vendor.com/tpu=common, ours vendor.com/tpu=chip1)" in (
                message
            )


async def test_a_kubelet_without_the_service_leaves_plain_names_and_says_so(
    sockdir: pathlib.Path, api: FakeApiServer
) -> None:
    cluster(api)
    fake = FakePodResources(_socket(sockdir), unimplemented=True)
    async with fake, FakeDriver(name=DRIVER, registry=sockdir / "reg") as driver:
        await driver.set_health(device("gpu-0", "Unhealthy", message="XID 79"), device("gpu-1"))
        async with manager.DRAHealthManager(_settings(sockdir, api)) as mgr:
            await eventually(
                lambda: (
                    pod_health(api, "train-a") == {f"{DRIVER}/pool/gpu-0": ("Unhealthy", "XID 79")}
                )
            )
            await eventually(lambda: "names" in mgr.readiness_notes())
            assert "UNIMPLEMENTED" in mgr.readiness_notes()["names"]
            state = mgr.metric_state()
            assert state.pod_resources_fallback == {"unimplemented": 1, "no_dynamic_resources": 0}
            assert state.pod_resources_calls[("List", "UNIMPLEMENTED")] >= 1


async def test_a_kubelet_with_the_gate_off_leaves_plain_names_and_says_so(
    sockdir: pathlib.Path, api: FakeApiServer
) -> None:
    cluster(api)
    fake = FakePodResources(_socket(sockdir), dynamic_resources=False)
    _kubelet(fake, "gpu-a", "train-a", "vendor.com/gpu=gpu0", dev="gpu-0")
    _kubelet(fake, "gpu-b", "train-b", "vendor.com/gpu=gpu1", dev="gpu-1")
    async with fake, FakeDriver(name=DRIVER, registry=sockdir / "reg") as driver:
        await driver.set_health(device("gpu-0", "Unhealthy", message="XID 79"), device("gpu-1"))
        async with manager.DRAHealthManager(_settings(sockdir, api)) as mgr:
            await eventually(lambda: "names" in mgr.readiness_notes())
            assert "KubeletPodResourcesDynamicResources" in mgr.readiness_notes()["names"]
            await eventually(
                lambda: (
                    pod_health(api, "train-a") == {f"{DRIVER}/pool/gpu-0": ("Unhealthy", "XID 79")}
                )
            )
            assert mgr.metric_state().pod_resources_fallback == {
                "unimplemented": 0, "no_dynamic_resources": 1,
            }  # fmt: skip
            assert mgr.names is not None and mgr.names.fallback == (
                podresources.FALLBACK_NO_DYNAMIC_RESOURCES
            )
