"""The fake driver as a subprocess: JSON-lines control socket, client and CLI.

``kubelet_dra.cli`` registers the ``fake-driver`` subcommand from here; this
module imports ``fakedriver``, never the other way round.

Part of the test kit (see :mod:`kubelet_dra.testing.fakedriver` for the
protocol); the kubeletplugin helper has no counterpart, this is how tests in
other processes and languages script a :class:`FakeDriver`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from kubelet_dra.testing import fakedriver

logger = logging.getLogger(__name__)


# -- subprocess mode: JSON-lines control socket --------------------------------


class _ControlServer:
    """Serves the JSON-lines control protocol for one driver."""

    def __init__(self, driver: fakedriver.FakeDriver, stopped: asyncio.Event) -> None:
        self._driver, self._stopped = driver, stopped

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                writer.write(json.dumps(await self._answer(line)).encode() + b"\n")
                await writer.drain()
        finally:
            writer.close()

    async def _answer(self, line: bytes) -> dict[str, Any]:
        try:
            request = json.loads(line)
            result = await self._apply(request.pop("op"), request)
        except Exception as exc:
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        return {"ok": True, **result}

    async def _apply(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        drv = self._driver
        if op == "set_health":
            await drv.set_health(*args.get("devices", []), resend=args.get("resend"))
        elif op == "push":
            await drv.push(int(args.get("times", 1)))
        elif op == "silent":
            drv.set_silent(bool(args.get("value", True)))
        elif op == "end_streams":
            await drv.end_streams(args.get("code"), args.get("message", ""))
        elif op == "restart":
            await drv.restart()
        elif op == "set_prepare":
            drv.prepare_devices = args.get("devices")
            drv.prepare_claims = dict(args.get("claims") or {})
        elif op == "stop":
            self._stopped.set()
        elif op not in ("calls", "status"):
            raise ValueError(f"unknown op {op!r}")
        return {"calls": dict(drv.calls), "open_streams": drv.open_streams}


class FakeDriverClient:
    """Client of a subprocess driver's control socket: ``await client.request("push")``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> FakeDriverClient:
        self._reader, self._writer = await asyncio.open_unix_connection(self.path)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(ConnectionError):
                await self._writer.wait_closed()

    async def request(self, op: str, **args: Any) -> dict[str, Any]:
        """Send one operation; raise ``RuntimeError`` if the driver refused it."""
        assert self._reader is not None and self._writer is not None, "use async with"
        self._writer.write(json.dumps({"op": op, **args}).encode() + b"\n")
        await self._writer.drain()
        answer: dict[str, Any] = json.loads(await self._reader.readline())
        if not answer.get("ok"):
            raise RuntimeError(answer.get("error", "control request failed"))
        return answer


def add_fake_driver_parser(subparsers: Any) -> None:
    """Register the ``fake-driver`` subcommand (``handler(ns) -> int``)."""
    parser = subparsers.add_parser(
        "fake-driver", help="run a scriptable DRA driver (for tests and demos)"
    )
    _add_arguments(parser)
    parser.set_defaults(handler=run_fake_driver)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", default="gpu.example.com", help="driver name")
    parser.add_argument("--registry", required=True, help="plugins registry directory")
    parser.add_argument("--plugin-dir", help="directory of the DRA socket")
    parser.add_argument("--health-versions", default="v1", help="comma list: v1,v1alpha1 or none")
    parser.add_argument("--dra-versions", default="v1", help="comma list: v1,v1beta1")
    parser.add_argument("--unimplemented", action="store_true", help="answer UNIMPLEMENTED")
    parser.add_argument("--control", help="control socket path")
    parser.add_argument("--devices", help="JSON list of devices to report from the start")
    parser.add_argument("--resend", type=float, help="resend period in seconds")
    parser.add_argument(
        "--prepare-claims",
        help='JSON object "<namespace>/<claim>" -> devices NodePrepareResources returns for it',
    )


def _versions(text: str) -> tuple[str, ...]:
    return tuple(v for v in text.split(",") if v and v != "none")


def run_fake_driver(ns: argparse.Namespace) -> int:
    """Handler of ``fake-driver``: serve until SIGTERM/SIGINT or the ``stop`` op."""
    return asyncio.run(_run(ns))


async def _run(ns: argparse.Namespace) -> int:
    driver = fakedriver.FakeDriver(
        ns.name,
        registry=ns.registry,
        plugin_dir=ns.plugin_dir,
        health_versions=_versions(ns.health_versions),
        dra_versions=_versions(ns.dra_versions),
        unimplemented=ns.unimplemented,
    )
    control = ns.control or str(driver.registry.parent / f"{ns.name}-control.sock")
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    if ns.prepare_claims:
        driver.prepare_claims = dict(json.loads(ns.prepare_claims))
    async with driver:
        if ns.devices:
            await driver.set_health(*json.loads(ns.devices), resend=ns.resend)
        fakedriver.unlink(control)
        server = await asyncio.start_unix_server(_ControlServer(driver, stopped).handle, control)
        ready = {
            "event": "ready",
            "driver": driver.name,
            "registration_socket": str(driver.registration_socket),
            "dra_socket": str(driver.dra_socket),
            "control": control,
        }
        print(json.dumps(ready), flush=True)
        async with server:
            await stopped.wait()
        fakedriver.unlink(control)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kubelet_dra.testing.fakedriver_control")
    _add_arguments(parser)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    return run_fake_driver(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
