"""``kubelet-dra-health watch``: output and the warnings a driver author needs."""

from __future__ import annotations

import argparse
import io
import json
import pathlib
from typing import Any

from kubelet_dra._proto.dra_health.v1 import api_pb2 as v1
from kubelet_dra.commands import watch
from kubelet_dra.testing import fakedriver

from ._driver_fixtures import device


def json_lines(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


async def test_once_prints_one_table_and_exits_zero(registry: pathlib.Path) -> None:
    async with fakedriver.FakeDriver(registry=registry) as drv:
        await drv.set_health(
            device("pool", "gpu-0", message="all good"),
            device("pool", "gpu-1", "Unhealthy", timeout_seconds=90),
        )
        out = io.StringIO()
        options = watch.Options(socket=str(drv.registration_socket), once=True, timeout=5)
        assert await watch.watch(options, out=out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("== gpu.example.com via v1.DRAResourceHealth at ")
    assert lines[1].split() == ["DEVICE", "HEALTH", "LEASE", "AGE", "MESSAGE"]
    assert lines[2].split()[:3] == ["pool/gpu-0", "Healthy", "30s"]
    assert lines[2].endswith("all good")
    assert lines[3].split()[:3] == ["pool/gpu-1", "Unhealthy", "90s"]
    assert drv.calls["NotifyRegistrationStatus"] == 0  # an observer, like the sidecar


async def test_once_json_warns_about_enum_and_message_size(registry: pathlib.Path) -> None:
    async with fakedriver.FakeDriver(registry=registry / "d", health_versions=("v1alpha1",)) as drv:
        await drv.set_health(device("pool", "gpu-0", 7, message="m" * 2000))
        out = io.StringIO()
        options = watch.Options(registry=str(registry), once=True, output="json", timeout=5)
        assert await watch.watch(options, out=out) == 0
    note, report = json_lines(out)
    assert "only advertises v1alpha1" in str(note["note"])
    assert report["service"] == "v1alpha1.DRAResourceHealth"
    assert report["devices"][0]["health"] == "enum 7"
    warnings = " | ".join(report["warnings"])
    assert "health enum value 7 is unknown" in warnings
    assert "message is 2000 bytes" in warnings


async def test_advertised_but_unimplemented_is_an_error(registry: pathlib.Path) -> None:
    async with fakedriver.FakeDriver(registry=registry, unimplemented=True) as drv:
        out = io.StringIO()
        options = watch.Options(socket=str(drv.registration_socket), once=True, timeout=5)
        assert await watch.watch(options, out=out) == 1
    assert "answers UNIMPLEMENTED" in out.getvalue()
    assert drv.calls["NodeWatchResources/v1"] == 1


async def test_driver_filter_and_no_health_service(registry: pathlib.Path) -> None:
    async with fakedriver.FakeDriver("a.example.com", registry=registry, health_versions=()):
        out = io.StringIO()
        options = watch.Options(registry=str(registry), driver="b.example.com", once=True)
        assert await watch.watch(options, out=out) == 1
        assert "no DRA driver found named b.example.com" in out.getvalue()
        out = io.StringIO()
        options = watch.Options(registry=str(registry), once=True, timeout=2)
        assert await watch.watch(options, out=out) == 1
        assert "advertises no health service" in out.getvalue()


def test_advisor_warns_when_resend_is_slower_than_the_lease() -> None:
    advisor = watch.Advisor("gpu.example.com")

    def report(*names: str) -> v1.NodeWatchResourcesResponse:
        return v1.NodeWatchResourcesResponse(
            devices=[
                v1.DeviceHealth(
                    device=v1.DeviceIdentifier(pool_name="p", device_name=n),
                    health=v1.HEALTHY,
                    health_check_timeout_seconds=10,
                )
                for n in names
            ]
        )

    assert advisor.review(report("a", "b"), now=100.0) == []
    assert advisor.review(report("a", "b"), now=105.0) == []
    warnings = advisor.review(report("a"), now=125.0)
    assert any("p/a: re-sent after 20s but its lease is 10s" in w for w in warnings)
    assert any("p/b: not reported for 20s" in w for w in warnings)
    assert advisor.review(report("a"), now=145.0) == []  # each warning once


def test_parser_registers_watch_subcommand() -> None:
    parser = argparse.ArgumentParser()
    watch.add_watch_parser(parser.add_subparsers(dest="command"))
    ns = parser.parse_args(["watch", "--socket", "/x.sock", "--once", "--output", "json"])
    assert (ns.handler, ns.socket, ns.once, ns.output) == (
        watch.run_watch,
        "/x.sock",
        True,
        "json",
    )
