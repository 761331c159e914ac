"""The kubelet's DRA checkpoint in the whole pipeline: FakeDriver -> DRAHealthManager ->
FakeApiServer, with a ``dra_manager_state`` written as the kubelet writes it.

The pods' claims come from the API (``driver/pool/device``); the checkpoint adds the CDI
device IDs the driver returned at prepare, and the pods' resourceIDs follow it: a new
file re-writes them, a torn file is refused and changes nothing, a claim that leaves the
file falls back to the API's view.
"""

from __future__ import annotations

import pathlib
from typing import Any

from kubelet_dra import manager
from kubelet_dra.state import kubeletcheckpoint
from kubelet_dra.status import podstatus
from kubelet_dra.testing import FakeApiServer, FakeDriver, eventually
from tests.unit import _kubelet_checkpoint_files as files

from ._sidecar_process import DRIVER, cluster, device, pod_health, settings_for


def _write(root: pathlib.Path, blob: bytes) -> None:
    """A temporary file renamed over the checkpoint, as the kubelet's file store does."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / ".tmp-checkpoint"
    tmp.write_bytes(blob)
    tmp.rename(root / kubeletcheckpoint.FILE_NAME)


def _checkpoint(cdi: str) -> bytes:
    """The kubelet's record of claim gpu-a (pod train-a's) with one CDI device ID."""
    devices = [files.device("1.37", "pool", "gpu-0", ["gpu"], [cdi])]
    claim = files.claim(
        "uid-a", "gpu-a", ["uid-train-a"], {DRIVER: files.driver_state("1.37", devices)}
    )
    return files.envelope(files.checkpoint_data([claim]))


def _condition(api: FakeApiServer, name: str) -> dict[str, Any]:
    found = podstatus.find_condition(api.get_pod("default", name)["status"], "DeviceHealthy")
    return found or {}


async def test_resource_ids_follow_the_kubelets_checkpoint(
    sockdir: pathlib.Path, api: FakeApiServer
) -> None:
    cluster(api)
    root = sockdir / "kubelet"
    _write(root, _checkpoint("vendor.com/gpu=gpu0"))
    # No kubelet writes here, only its checkpoint is there: no wait for its entries
    # (test_writer_coexist.py tests --kubelet-field-grace).
    cfg = settings_for(sockdir, api, kubelet_checkpoint_interval=0.05, kubelet_field_grace=0)
    async with FakeDriver(name=DRIVER, registry=sockdir / "reg") as driver:
        await driver.set_health(device("gpu-0", "Unhealthy", message="XID 79"), device("gpu-1"))
        async with manager.DRAHealthManager(cfg) as mgr:
            await eventually(
                lambda: (
                    pod_health(api, "train-a") == {"vendor.com/gpu=gpu0": ("Unhealthy", "XID 79")}
                )
            )
            # train-b's claim is not in the checkpoint: the API's view.
            await eventually(
                lambda: pod_health(api, "train-b") == {f"{DRIVER}/pool/gpu-1": ("Healthy", "")}
            )
            assert _condition(api, "train-a")["message"] == (
                f"Unhealthy devices: {DRIVER}/pool/gpu-0 (as vendor.com/gpu=gpu0) (claim gpu-a): "
                "XID 79"
            )
            _write(root, _checkpoint("vendor.com/gpu=renamed"))
            await eventually(lambda: "vendor.com/gpu=renamed" in pod_health(api, "train-a"))
            # A torn file is refused (counted) and changes nothing.
            writes = len(api.status_writes("default", "train-a"))
            _write(root, _checkpoint("vendor.com/gpu=torn")[:-20])
            assert mgr.checkpoint is not None
            await eventually(
                lambda: mgr.metric_state().checkpoint_refused.get("json") == 1,
                what="the torn file counted",
            )
            assert "vendor.com/gpu=renamed" in pod_health(api, "train-a")
            assert len(api.status_writes("default", "train-a")) == writes
            # The claim leaves the file: back to driver/pool/device.
            _write(root, files.EMPTY)
            await eventually(
                lambda: (
                    pod_health(api, "train-a") == {f"{DRIVER}/pool/gpu-0": ("Unhealthy", "XID 79")}
                )
            )
            assert _condition(api, "train-a")["message"] == (
                f"Unhealthy devices: {DRIVER}/pool/gpu-0 (claim gpu-a): XID 79"
            )
