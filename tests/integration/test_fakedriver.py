"""The FakeDriver test kit: control API in process and as a subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import sys

import grpc
import pytest

from kubelet_dra._proto.dra.v1 import api_pb2 as dra_pb2
from kubelet_dra._proto.dra.v1 import api_pb2_grpc as dra_grpc
from kubelet_dra._proto.dra_health.v1 import api_pb2 as health_pb2
from kubelet_dra._proto.dra_health.v1 import api_pb2_grpc as health_grpc
from kubelet_dra.testing import eventually, fakedriver, fakedriver_control

from ._driver_fixtures import device


async def first_reports(path: pathlib.Path, count: int) -> list[list[str]]:
    async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
        call = health_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            health_pb2.NodeWatchResourcesRequest()
        )
        got = []
        async for response in call:
            got.append([d.device.device_name for d in response.devices])
            if len(got) == count:
                call.cancel()
                break
        return got


async def test_sockets_calls_and_prepare(registry: pathlib.Path) -> None:
    async with fakedriver.FakeDriver(registry=registry, dra_versions=("v1", "v1beta1")) as drv:
        assert drv.registration_socket == registry / "gpu.example.com-reg.sock"
        assert drv.supported_versions == [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
        ]
        await drv.set_health(device("pool", "gpu-0"))
        async with grpc.aio.insecure_channel(f"unix:{drv.dra_socket}") as channel:
            request = dra_pb2.NodePrepareResourcesRequest(claims=[dra_pb2.Claim(uid="u1")])
            answer = await dra_grpc.DRAPluginStub(channel).NodePrepareResources(request)
        assert answer.claims["u1"].devices[0].device_name == "gpu-0"
        assert drv.calls["NodePrepareResources/v1"] == 1


async def test_prepare_per_claim(registry: pathlib.Path) -> None:
    """A claim named in ``prepare_claims`` gets its own devices; others the default."""
    async with fakedriver.FakeDriver(registry=registry) as drv:
        await drv.set_health(device("pool", "gpu-0"), device("pool", "gpu-1"))
        drv.prepare_claims = {"ns/one": [{"pool": "pool", "device": "gpu-1"}]}
        claims = [
            dra_pb2.Claim(uid="u1", namespace="ns", name="one"),
            dra_pb2.Claim(uid="u2", namespace="ns", name="two"),
            dra_pb2.Claim(uid="u3", namespace="other", name="one"),
        ]
        async with grpc.aio.insecure_channel(f"unix:{drv.dra_socket}") as channel:
            answer = await dra_grpc.DRAPluginStub(channel).NodePrepareResources(
                dra_pb2.NodePrepareResourcesRequest(claims=claims)
            )
        names = {uid: [d.device_name for d in c.devices] for uid, c in answer.claims.items()}
        assert names == {"u1": ["gpu-1"], "u2": ["gpu-0", "gpu-1"], "u3": ["gpu-0", "gpu-1"]}


async def test_push_silent_and_resend(registry: pathlib.Path) -> None:
    async with fakedriver.FakeDriver(registry=registry) as drv:
        await drv.set_health(device("pool", "a"), resend=0.01)  # heartbeat
        assert await first_reports(drv.dra_socket, 3) == [["a"], ["a"], ["a"]]
        drv.set_silent()
        await drv.set_health(device("pool", "b"))
        # The first reader's stream gone, the next one open is the new reader's.
        await eventually(lambda: drv.open_streams == 0, what="the first stream closed")
        reader = asyncio.create_task(first_reports(drv.dra_socket, 1))
        await drv.wait_for_streams(1)
        drv.set_silent(False)
        await drv.set_health(device("pool", "c"))
        # The stream's first report is the one sent after the silence: had the
        # silent driver sent "b" (at the stream's start or on set_health), the
        # reader would have got it first. No window of real time to wait out.
        assert await reader == [["c"]]


async def test_end_streams_and_restart_make_new_sockets(registry: pathlib.Path) -> None:
    async with fakedriver.FakeDriver(registry=registry) as drv:
        reader = asyncio.create_task(first_reports(drv.dra_socket, 1))
        await drv.wait_for_streams(1)
        await drv.end_streams("INTERNAL", "boom")
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await reader
        assert (failed.value.code(), failed.value.details()) == (grpc.StatusCode.INTERNAL, "boom")
        before = os.stat(drv.registration_socket)
        await drv.restart()
        after = os.stat(drv.registration_socket)
        # The filesystem may reuse the inode number; the watcher keys on (inode, ctime).
        assert (after.st_ino, after.st_ctime_ns) != (before.st_ino, before.st_ctime_ns)


async def test_subprocess_mode_with_the_control_socket(
    sockdir: pathlib.Path, registry: pathlib.Path
) -> None:
    control = sockdir / "ctl.sock"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kubelet_dra.testing.fakedriver_control",
        "--registry",
        str(registry),
        "--control",
        str(control),
        "--health-versions",
        "v1,v1alpha1",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        ready = json.loads(await asyncio.wait_for(proc.stdout.readline(), 20))
        assert ready["event"] == "ready"
        async with fakedriver_control.FakeDriverClient(control) as client:
            await client.request("set_health", devices=[device("pool", "gpu-7")])
            assert await first_reports(pathlib.Path(ready["dra_socket"]), 1) == [["gpu-7"]]
            answer = await client.request("calls")
            assert answer["calls"]["NodeWatchResources/v1"] == 1
            await client.request("stop")
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
