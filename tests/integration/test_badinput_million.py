"""A million devices in one health report: refused with a clear reason, memory bounded.

The sender is a separate process (so its own 30 MB message does not count in
our memory): a bare gRPC server that answers ``NodeWatchResources`` with one
pre-serialized response of N devices (a protobuf repeated field is the
concatenation of its entries, so the bytes are built by repetition). Our
side is a ``PluginManager`` on a real health cache. We sample our resident
memory while the report arrives and check the refusal reason, its counter and
its one log line.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
import sys

import pytest

from kubelet_dra import clock
from kubelet_dra.plugin import getinfo, plugins, registration
from kubelet_dra.state import healthinfo
from kubelet_dra.testing import eventually

from ._driver_fixtures import Changes, make_settings, rss_mb

SENDER = r"""
import sys, time
from concurrent import futures
import grpc
from kubelet_dra._proto.dra_health.v1 import api_pb2 as pb

sock, count = sys.argv[1], int(sys.argv[2])
one = pb.NodeWatchResourcesResponse(devices=[pb.DeviceHealth(
    device=pb.DeviceIdentifier(pool_name="pool", device_name="gpu-000000"),
    health=1, last_updated_time=1, health_check_timeout_seconds=30)]).SerializeToString()
payload = one * count

def watch(request, context):
    yield payload
    time.sleep(3600)

handler = grpc.method_handlers_generic_handler("v1.DRAResourceHealth", {
    "NodeWatchResources": grpc.unary_stream_rpc_method_handler(
        watch, request_deserializer=None, response_serializer=None)})
server = grpc.server(futures.ThreadPoolExecutor(4),
                     options=[("grpc.max_send_message_length", 1 << 30)])
server.add_generic_rpc_handlers((handler,))
server.add_insecure_port("unix:" + sock)
server.start()
print(len(payload), flush=True)
server.wait_for_termination()
"""


@pytest.mark.parametrize(
    ("count", "reason"),
    [
        pytest.param(1_000_000, "too_large", id="million-over-16MB"),
        pytest.param(150_000, "too_many_devices", id="150k-over-device-limit"),
    ],
)
async def test_huge_report_is_refused_with_a_reason_and_memory_stays_bounded(
    sockdir: pathlib.Path, caplog: pytest.LogCaptureFixture, count: int, reason: str
) -> None:
    caplog.set_level(logging.WARNING)
    sock = sockdir / "huge.sock"
    env = {**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).parents[2])}
    sender = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SENDER, str(sock), str(count),
        stdout=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        assert sender.stdout is not None
        size = int(await asyncio.wait_for(sender.stdout.readline(), 30))
        info = getinfo.make_plugin_info(
            "huge.example.com", str(sock), ["v1.DRAPlugin", "v1.DRAResourceHealth"]
        )
        cache = healthinfo.HealthCache()
        settings = make_settings(stream_backoff_initial=5.0)
        before = peak = rss_mb()
        async with plugins.PluginManager(
            cache, settings=settings, clock=clock.SystemClock(), on_change=Changes()
        ) as mgr:
            await mgr.handle(registration.PluginEvent(registration.EventKind.REGISTER, info))

            def refused() -> int:
                nonlocal peak
                peak = max(peak, rss_mb())
                count = mgr.refused.get(("huge.example.com", reason), 0)
                assert count, f"refused so far: {dict(mgr.refused)}"
                return count

            await eventually(refused, what=f"the refusal ({reason})", timeout=30, interval=0.005)
            await eventually(lambda: f"({reason})" in caplog.text)
        assert len(cache) == 0
    finally:
        sender.kill()
        await sender.wait()
    print(
        f"\n{count} devices ({size / 1e6:.1f} MB): refused as {reason}, RSS +{peak - before:.0f} MB"
    )
    # The refused message is never decoded (too_large) or decoded once and dropped.
    assert peak - before < 150
