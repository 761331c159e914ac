"""Interop: NodeWatchResources as served by the real kubeletplugin helpers, read with our
generated v1 / v1alpha1 code: field contents, changes, resends, silence, UNIMPLEMENTED for
drivers without health support, and stream errors.

Combinations: the 1.37 helper on v1 and on v1alpha1 (served through the helper's conversion
wrapper), and the 1.35 helper on v1alpha1 (served by the driver's own implementation).
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from ._driver import DriverProcess, device
from ._grpc import HealthStream, StreamEnded

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]

DriverFactory = Callable[..., DriverProcess]

COMBINATIONS = [
    pytest.param("current", "v1", id="helper1.37-v1"),
    pytest.param("current", "v1alpha1", id="helper1.37-v1alpha1"),
    pytest.param("v035", "v1alpha1", id="helper1.35-v1alpha1"),
]

#: The 1.37 helper's fixed text for ErrHealthNotSupported.
NOT_SUPPORTED_TEXT = "device health reporting is not supported by this driver"


def as_tuples(response: Any) -> list[tuple[str, str, int, int, str]]:
    return [
        (
            d.device.pool_name,
            d.device.device_name,
            d.health,
            d.health_check_timeout_seconds,
            d.message,
        )
        for d in response.devices
    ]


def open_stream(drv: DriverProcess, api: str) -> HealthStream:
    stream = HealthStream(drv.dra_socket, api)
    drv.wait_for(
        "stream_open", lambda e: e["method"] == f"/{api}.DRAResourceHealth/NodeWatchResources"
    )
    return stream


@pytest.mark.parametrize(("version", "api"), COMBINATIONS)
def test_scripted_report_fields(interop_driver: DriverFactory, version: str, api: str) -> None:
    fixed_time = 1_700_000_000
    drv = interop_driver(
        version,
        script={
            "devices": [
                device("gpu-0", "HEALTHY", message="all good", timeout_seconds=45),
                device("gpu-1", "UNHEALTHY", pool="pool-1", message="ECC errors"),
                device("gpu-2", "UNKNOWN", last_updated=fixed_time),
            ]
        },
    )
    stream = open_stream(drv, api)
    try:
        before = int(time.time())
        first = stream.next()
    finally:
        stream.close()
    # HealthStatus numbers: UNKNOWN=0, HEALTHY=1, UNHEALTHY=2 in both versions.
    # The 1.35 helper's v1alpha1 has no message field (added in 1.36): never sent.
    msg = (lambda m: m) if version == "current" else (lambda m: "")
    assert as_tuples(first) == [
        ("pool-0", "gpu-0", 1, 45, msg("all good")),
        ("pool-1", "gpu-1", 2, 0, msg("ECC errors")),
        ("pool-0", "gpu-2", 0, 0, ""),
    ]
    stamps = [d.last_updated_time for d in first.devices]
    assert abs(stamps[0] - before) <= 2 and abs(stamps[1] - before) <= 2
    assert stamps[2] == fixed_time


@pytest.mark.parametrize(("version", "api"), COMBINATIONS)
def test_script_change_is_sent_on_open_stream(
    interop_driver: DriverFactory, version: str, api: str
) -> None:
    drv = interop_driver(version, script={"devices": [device("gpu-0", "HEALTHY")]})
    stream = open_stream(drv, api)
    try:
        assert as_tuples(stream.next())[0][2] == 1
        drv.control({"devices": [device("gpu-0", "UNHEALTHY", timeout_seconds=5)]})
        changed = stream.next(timeout=5)
        assert as_tuples(changed)[0][2:4] == (2, 5)
        # An empty list is a valid report (the kubelet keeps earlier entries until timeout).
        drv.control({"devices": []})
        assert list(stream.next(timeout=5).devices) == []
    finally:
        stream.close()


@pytest.mark.parametrize(("version", "api"), COMBINATIONS)
def test_resend_period(interop_driver: DriverFactory, version: str, api: str) -> None:
    drv = interop_driver(version, script={"devices": [device("gpu-0")], "resend_seconds": 0.25})
    stream = open_stream(drv, api)
    try:
        received = [stream.next()]
        deadline = time.monotonic() + 1.6
        while time.monotonic() < deadline:
            try:
                received.append(stream.next(timeout=max(0.05, deadline - time.monotonic())))
            except queue.Empty:
                break
    finally:
        stream.close()
    # ~1 initial + 6 resends in 1.6 s; allow slack for a loaded machine.
    assert 4 <= len(received) <= 9
    assert all(as_tuples(r) == as_tuples(received[0]) for r in received)


@pytest.mark.parametrize(("version", "api"), COMBINATIONS)
def test_silence_keeps_stream_open(interop_driver: DriverFactory, version: str, api: str) -> None:
    script: dict[str, Any] = {"devices": [device("gpu-0")], "resend_seconds": 0.2}
    drv = interop_driver(version, script=script)
    stream = open_stream(drv, api)
    try:
        stream.next()
        drv.control({**script, "silent": True})
        time.sleep(0.5)  # let the driver pick the change up, then forget what was sent
        stream.drain()
        with pytest.raises(queue.Empty):
            stream.next(timeout=1.2)
        assert stream.code is None  # still open
        drv.control({**script, "devices": [device("gpu-0", "UNHEALTHY")]})
        assert as_tuples(stream.next(timeout=5))[0][2] == 2
    finally:
        stream.close()


@pytest.mark.parametrize(("version", "api"), COMBINATIONS)
def test_not_supported_is_unimplemented(
    interop_driver: DriverFactory, version: str, api: str
) -> None:
    drv = interop_driver(version, script={"devices": [device("gpu-0")], "not_supported": True})
    stream = HealthStream(drv.dra_socket, api)
    try:
        with pytest.raises(StreamEnded) as ended:
            stream.next()
    finally:
        stream.close()
    assert ended.value.code == grpc.StatusCode.UNIMPLEMENTED
    assert ended.value.details == NOT_SUPPORTED_TEXT


@pytest.mark.parametrize(("version", "api"), COMBINATIONS)
def test_not_supported_ends_open_stream(
    interop_driver: DriverFactory, version: str, api: str
) -> None:
    drv = interop_driver(version, script={"devices": [device("gpu-0")]})
    stream = open_stream(drv, api)
    try:
        stream.next()
        drv.control({"devices": [device("gpu-0")], "not_supported": True})
        end = stream.wait_end()
    finally:
        stream.close()
    assert end.code == grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.parametrize(("version", "api"), COMBINATIONS)
def test_stream_error_status(interop_driver: DriverFactory, version: str, api: str) -> None:
    drv = interop_driver(version, script={"devices": [device("gpu-0")]})
    stream = open_stream(drv, api)
    try:
        stream.next()
        drv.control({"stream_error": {"code": "UNAVAILABLE", "message": "monitor restarting"}})
        end = stream.wait_end()
    finally:
        stream.close()
    assert (end.code, end.details) == (grpc.StatusCode.UNAVAILABLE, "monitor restarting")
    closed = drv.wait_for("stream_closed")
    assert "monitor restarting" in closed[-1].get("error", "")


def test_two_streams_on_both_versions_get_the_same_report(interop_driver: DriverFactory) -> None:
    """The 1.37 helper serves v1 and v1alpha1 at once; each stream calls the driver's hook."""
    drv = interop_driver("current", script={"devices": [device("gpu-0", message="m")]})
    v1 = open_stream(drv, "v1")
    v1alpha1 = open_stream(drv, "v1alpha1")
    try:
        assert as_tuples(v1.next()) == as_tuples(v1alpha1.next())
    finally:
        v1.close()
        v1alpha1.close()
    assert len(drv.wait_for("stream_open", count=2)) == 2


def test_helper_flags_stale_reports(interop_driver: DriverFactory) -> None:
    """The 1.37 helper itself notices when a driver stops re-sending within the devices'
    timeout and reports a recoverable error to the driver (checked every 10 s)."""
    drv = interop_driver("current", script={"devices": [device("gpu-0", timeout_seconds=1)]})
    stream = open_stream(drv, "v1")
    try:
        stream.next()
        drv.control({"devices": [device("gpu-0", timeout_seconds=1)], "silent": True})
        errors = drv.wait_for("handle_error", timeout=25)
        assert stream.code is None  # the stream is not closed because of it
    finally:
        stream.close()
    assert errors[0]["recoverable"] is True
    assert "stale" in errors[0]["msg"]
