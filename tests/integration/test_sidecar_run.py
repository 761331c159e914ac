"""``kubelet-dra-health run`` end to end, as a subprocess.

The sidecar process talks to a ``FakeApiServer`` and a ``FakeDriver`` that
live in the test process (one test drives the driver as a subprocess too).
Each test ends the sidecar with a signal and checks the exit code, the time
it took, and the state file it left.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import signal
import sys

import pytest

from kubelet_dra import models
from kubelet_dra.state import store
from kubelet_dra.testing import FakeApiServer, FakeDriver
from kubelet_dra.testing.fakedriver_control import FakeDriverClient
from tests.unit import _rbac

from ._sidecar_process import (
    DRIVER,
    ROOT,
    SidecarProcess,
    base_env,
    device,
    health_of,
    pod_health,
)

pytestmark = pytest.mark.usefixtures("cluster_objects")


def state_records(state_dir: pathlib.Path) -> dict[models.DeviceKey, models.DeviceHealth]:
    db = store.HealthStore.open(state_dir)
    try:
        return dict(db.load())
    finally:
        db.close()


def key(name: str) -> models.DeviceKey:
    return models.DeviceKey(DRIVER, "pool", name)


def assert_rbac_allows_every_request(api: FakeApiServer) -> None:
    rules = _rbac.cluster_role_rules()
    made = {(r.method, r.path + ("?watch=true" if r.is_watch else "")) for r in api.requests}
    assert made, "the sidecar made no API requests"
    denied = sorted(m for m in made if not _rbac.request_allowed(rules, *m))
    assert not denied, f"requests the ClusterRole does not allow: {denied}"


async def test_health_reaches_pods_and_sigterm_flushes_the_state_file(
    sockdir: pathlib.Path, api: FakeApiServer
) -> None:
    # A long flush interval: only the flush at shutdown can have written the file.
    env = {"KUBELET_DRA_STORE_FLUSH_INTERVAL": "60"}
    async with (
        FakeDriver(DRIVER, registry=sockdir / "reg") as driver,
        SidecarProcess(sockdir, api, env=env) as sidecar,
    ):
        await driver.set_health(device("gpu-0"), device("gpu-1"))
        await sidecar.until(lambda: health_of(api, "train-a", "gpu-0") == "Healthy")
        await sidecar.until(lambda: health_of(api, "train-b", "gpu-1") == "Healthy")
        await driver.set_health(device("gpu-0", "Unhealthy", message="XID 79"), device("gpu-1"))
        await sidecar.until(
            lambda: pod_health(api, "train-a")[f"{DRIVER}/pool/gpu-0"] == ("Unhealthy", "XID 79")
        )
        code, seconds = await sidecar.stop(signal.SIGTERM)
    assert code == 0, sidecar.log
    assert seconds < 5.0
    records = state_records(sidecar.state_dir)
    assert records[key("gpu-0")].health is models.HealthStatus.UNHEALTHY
    assert records[key("gpu-0")].message == "XID 79"
    assert records[key("gpu-1")].health is models.HealthStatus.HEALTHY
    # Observer role: registration is read, never acknowledged.
    assert driver.calls["GetInfo"] >= 1
    assert driver.calls["NotifyRegistrationStatus"] == 0
    assert driver.notifications == []
    assert not api.status_writes("default", "elsewhere")
    assert_rbac_allows_every_request(api)


async def test_sigint_exits_zero_with_the_state_file_flushed(
    sockdir: pathlib.Path, api: FakeApiServer
) -> None:
    env = {"KUBELET_DRA_STORE_FLUSH_INTERVAL": "60"}
    async with (
        FakeDriver(DRIVER, registry=sockdir / "reg") as driver,
        SidecarProcess(sockdir, api, env=env) as sidecar,
    ):
        await driver.set_health(device("gpu-0", "Unhealthy", message="fan"), device("gpu-1"))
        await sidecar.until(lambda: health_of(api, "train-a", "gpu-0") == "Unhealthy")
        code, seconds = await sidecar.stop(signal.SIGINT)
    assert code == 0, sidecar.log
    assert seconds < 5.0
    assert state_records(sidecar.state_dir)[key("gpu-0")].message == "fan"
    assert driver.calls["NotifyRegistrationStatus"] == 0


async def test_lease_runs_out_while_the_driver_is_silent(
    sockdir: pathlib.Path, api: FakeApiServer
) -> None:
    # gpu-0 reports no timeout: the node default (--health-timeout 1) applies.
    # gpu-1 reports its own 30 s, which wins over the node default.
    async with (
        FakeDriver(DRIVER, registry=sockdir / "reg") as driver,
        SidecarProcess(sockdir, api, flags=["--health-timeout", "1"]) as sidecar,
    ):
        await driver.set_health(device("gpu-0"), device("gpu-1", timeout_seconds=30))
        await sidecar.until(lambda: health_of(api, "train-a", "gpu-0") == "Healthy")
        await sidecar.until(lambda: health_of(api, "train-b", "gpu-1") == "Healthy")
        driver.set_silent(True)
        await sidecar.until(lambda: health_of(api, "train-a", "gpu-0") == "Unknown", timeout=4)
        assert health_of(api, "train-b", "gpu-1") == "Healthy"
        assert driver.open_streams == 1  # the stream stayed open: only the lease ran out
        driver.set_silent(False)
        await driver.push()
        await sidecar.until(lambda: health_of(api, "train-a", "gpu-0") == "Healthy")
        code, _ = await sidecar.stop()
    assert code == 0, sidecar.log


async def test_driver_restart_with_new_sockets_is_followed(
    sockdir: pathlib.Path, api: FakeApiServer
) -> None:
    async with (
        FakeDriver(DRIVER, registry=sockdir / "reg") as driver,
        SidecarProcess(sockdir, api) as sidecar,
    ):
        # Short leases, renewed while the driver runs: its devices turn Unknown
        # when the leases run out after it went away.
        await driver.set_health(
            device("gpu-0", timeout_seconds=1), device("gpu-1", timeout_seconds=1), resend=0.2
        )
        await sidecar.until(lambda: health_of(api, "train-a", "gpu-0") == "Healthy")
        await driver.stop()
        assert not driver.registration_socket.exists()
        assert not driver.dra_socket.exists()
        await sidecar.until(lambda: health_of(api, "train-a", "gpu-0") == "Unknown")
        await driver.start()
        await driver.set_health(device("gpu-0", "Unhealthy", message="after restart"))
        await sidecar.until(
            lambda: (
                pod_health(api, "train-a")[f"{DRIVER}/pool/gpu-0"] == ("Unhealthy", "after restart")
            )
        )
        assert driver.calls["GetInfo"] >= 2
        code, _ = await sidecar.stop()
    assert code == 0, sidecar.log
    assert driver.calls["NotifyRegistrationStatus"] == 0


async def test_sidecar_follows_a_fake_driver_subprocess(
    sockdir: pathlib.Path, api: FakeApiServer
) -> None:
    control = sockdir / "ctl.sock"
    devices = json.dumps([device("gpu-0"), device("gpu-1")])
    driver = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "kubelet_dra", "fake-driver", "--name", DRIVER],
        *["--registry", str(sockdir / "reg"), "--control", str(control), "--devices", devices],
        cwd=ROOT,
        env=base_env(),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert driver.stdout is not None
        ready = json.loads(await asyncio.wait_for(driver.stdout.readline(), 8))
        assert ready["event"] == "ready"
        async with SidecarProcess(sockdir, api) as sidecar, FakeDriverClient(control) as client:
            await sidecar.until(lambda: health_of(api, "train-b", "gpu-1") == "Healthy")
            await client.request(
                "set_health", devices=[device("gpu-0"), device("gpu-1", "Unhealthy", message="m")]
            )
            await sidecar.until(lambda: health_of(api, "train-b", "gpu-1") == "Unhealthy")
            # A restart this fast may never show Unknown in the API (the writer
            # coalesces); what matters is that the new sockets are followed.
            await client.request("restart")
            await client.request("set_health", devices=[device("gpu-1", "Healthy")])
            await sidecar.until(lambda: health_of(api, "train-b", "gpu-1") == "Healthy")
            calls = (await client.request("calls"))["calls"]
            code, _ = await sidecar.stop()
        assert code == 0, sidecar.log
        assert calls.get("GetInfo", 0) >= 2
        assert calls.get("NodeWatchResources/v1", 0) >= 2
        assert calls.get("NotifyRegistrationStatus", 0) == 0
    finally:
        driver.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(driver.wait(), 5) == 0


async def test_sigterm_exits_in_time_while_an_api_call_hangs(
    sockdir: pathlib.Path, api: FakeApiServer
) -> None:
    # The pod list hangs for longer than the exit budget; the sidecar must not
    # wait for the worker thread that is stuck in it.
    api.delay("GET", r"/pods$", 30.0, watch=False)
    async with SidecarProcess(sockdir, api, metrics=True) as sidecar:
        url = await sidecar.metrics_url()
        code, seconds = await sidecar.stop(signal.SIGTERM)
    assert url.startswith("http://127.0.0.1:")
    assert code == 0, sidecar.log
    assert seconds < 5.0
