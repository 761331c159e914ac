"""``kubelet-dra-health watch``: see a driver's health stream the way a kubelet sees it.

A tool for driver authors. It registers like the kubelet (``GetInfo``, the
same negotiation as ``dra_plugin_manager.go``, as an observer that never calls
``NotifyRegistrationStatus``), opens ``NodeWatchResources`` on the chosen
version, prints every report as a table (device, health, lease, age, message)
or as JSON lines, and warns about what would go wrong with a real kubelet:
a resend cadence longer than the lease, messages over 1024 bytes, unknown
enum values, devices that stop being reported, bad or duplicate names, a
health service that is advertised but answers ``UNIMPLEMENTED``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

import grpc

from kubelet_dra import clock, errors, settings
from kubelet_dra.plugin import getinfo, registration, streams
from kubelet_dra.state import healthinfo

_ENUM_NAMES = {0: "Unknown", 1: "Healthy", 2: "Unhealthy"}
_MESSAGE_COLUMN = 60


def add_watch_parser(subparsers: Any) -> None:
    """Register the ``watch`` subcommand (``handler(ns) -> int``)."""
    parser = subparsers.add_parser("watch", help="show a DRA driver's health stream")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--registry", help="plugins registry directory to discover drivers in")
    where.add_argument("--socket", help="a driver's registration socket")
    parser.add_argument("--driver", help="only this driver")
    parser.add_argument("--once", action="store_true", help="print one report and exit")
    parser.add_argument("--output", choices=["table", "json"], default="table")
    parser.add_argument(
        "--timeout", type=float, default=None, help="give up after this many seconds"
    )
    parser.set_defaults(handler=run_watch)


def run_watch(ns: argparse.Namespace) -> int:
    """Handler of ``watch``: 0 when reports were seen, 1 when none could be."""
    options = Options(
        registry=ns.registry,
        socket=ns.socket,
        driver=ns.driver,
        once=ns.once,
        output=ns.output,
        timeout=ns.timeout if ns.timeout is not None else (10.0 if ns.once else None),
    )
    try:
        return asyncio.run(watch(options, out=sys.stdout))
    except KeyboardInterrupt:
        return 0


@dataclasses.dataclass(frozen=True)
class Options:
    registry: str | None = None
    socket: str | None = None
    driver: str | None = None
    once: bool = False
    output: str = "table"
    timeout: float | None = None


async def watch(options: Options, *, out: TextIO) -> int:
    """Discover, connect and print until done; returns the exit code."""
    try:
        plugins = await discover(options)
    except errors.RegistrationError as exc:
        _say(out, options, "error", f"{options.socket}: {exc}")
        return 1
    if not plugins:
        _say(out, options, "error", "no DRA driver found" + _for(options.driver))
        return 1
    tasks = [asyncio.create_task(_watch_one(p, options, out)) for p in plugins]
    printed = False
    try:
        async with asyncio.timeout(options.timeout):
            for next_done in asyncio.as_completed(tasks):
                printed = await next_done or printed
                if printed and options.once:
                    break
    except TimeoutError:
        _say(out, options, "error" if not printed else "note", "timed out")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return 0 if printed else 1


async def discover(options: Options) -> list[getinfo.PluginInfo]:
    """The plugins to watch, from one socket or a registry scan."""
    found: list[getinfo.PluginInfo] = []
    if options.socket:
        found.append(
            await getinfo.fetch_plugin_info(
                options.socket, role=settings.Role.OBSERVER, timeout=5.0
            )
        )
    else:

        async def collect(event: registration.PluginEvent) -> None:
            found.append(event.plugin)

        watcher = registration.RegistryWatcher(
            options.registry,
            role=settings.Role.OBSERVER,
            settings=settings.Settings(),
            clock=clock.SystemClock(),
            on_event=collect,
        )
        await watcher.start()
        await watcher.close()
    return [p for p in found if options.driver in (None, p.driver)]


class Advisor:
    """What a real kubelet would make of the reports of one driver."""

    def __init__(self, driver: str) -> None:
        self.driver = driver
        self.cache = healthinfo.HealthCache()
        self._last_seen: dict[tuple[str, str], float] = {}
        self._leases: dict[tuple[str, str], float] = {}
        self._warned: set[str] = set()

    def review(self, response: Any, now: float) -> list[str]:
        """Warnings for this report (each distinct warning once per run)."""
        warnings: list[str] = []
        seen: set[tuple[str, str]] = set()
        for dh in response.devices:
            key = (dh.device.pool_name, dh.device.device_name)
            seen.add(key)
            warnings += self._device_warnings(key, dh, now)
        warnings += self._missing(seen, now)
        converted = streams.convert(response.devices, max_devices=1 << 30)
        for reason in sorted(set(converted.problems) & {"empty_name", "duplicate"}):
            warnings.append(
                f"report has {reason.replace('_', ' ')} entries; the kubelet drops them"
            )
        self.cache.update(self.driver, converted.reports, now=now)
        return [w for w in warnings if self._first(w)]

    def _device_warnings(self, key: tuple[str, str], dh: Any, now: float) -> list[str]:
        name, out = "/".join(key), []
        lease = self.cache.lease_for(int(dh.health_check_timeout_seconds))
        if int(dh.health) not in _ENUM_NAMES:
            out.append(
                f"{name}: health enum value {int(dh.health)} is unknown; kubelet shows Unknown"
            )
        size = len(dh.message.encode())
        if size > healthinfo.MESSAGE_MAX_BYTES:
            out.append(f"{name}: message is {size} bytes; the kubelet truncates it to 1024")
        last = self._last_seen.get(key)
        if last is not None and now - last > lease:
            out.append(
                f"{name}: re-sent after {now - last:.0f}s but its lease is {lease:.0f}s; "
                "pods show Unknown in between (resend more often or raise "
                "health_check_timeout_seconds)"
            )
        self._last_seen[key] = now
        self._leases[key] = lease
        return out

    def _missing(self, seen: set[tuple[str, str]], now: float) -> list[str]:
        out = []
        for key, last in self._last_seen.items():
            lease = self._leases.get(key, healthinfo.DEFAULT_HEALTH_TIMEOUT)
            if key not in seen and now - last > lease:
                out.append(
                    f"{'/'.join(key)}: not reported for {now - last:.0f}s (lease "
                    f"{lease:.0f}s); the kubelet shows Unknown"
                )
        return out

    def _first(self, warning: str) -> bool:
        stem = warning.split(":", maxsplit=1)[0] + warning.rsplit(";", maxsplit=1)[-1]
        if stem in self._warned:
            return False
        self._warned.add(stem)
        return True


async def _watch_one(plugin: getinfo.PluginInfo, options: Options, out: TextIO) -> bool:
    """Stream from one plugin; True once a report was printed."""
    if plugin.health_service is None:
        _say(
            out,
            options,
            "warning",
            f"{plugin.driver} advertises no health service; "
            "the kubelet (1.37+) opens no health stream",
        )
        return False
    if plugin.health_service.startswith("v1alpha1"):
        _say(
            out,
            options,
            "note",
            f"{plugin.driver} only advertises v1alpha1.DRAResourceHealth; "
            "kubelets 1.37+ prefer v1 and v1alpha1 is due for removal around 1.40",
        )
    advisor, printed = Advisor(plugin.driver), False
    async with grpc.aio.insecure_channel(f"unix:{plugin.endpoint}") as channel:
        try:
            async for response in streams.open_watch(channel, plugin.health_service):
                now = time.time()
                _render(
                    out,
                    options,
                    plugin=plugin,
                    response=response,
                    warnings=advisor.review(response, now),
                    now=now,
                )
                printed = True
                if options.once:
                    return True
        except grpc.aio.AioRpcError as exc:
            _say(out, options, "error", _explain(plugin, exc))
            return printed
    _say(
        out,
        options,
        "warning",
        f"{plugin.driver}: stream ended (EOF); the kubelet shows "
        "Unknown for every device until it reconnects",
    )
    return printed


def _explain(plugin: getinfo.PluginInfo, exc: grpc.aio.AioRpcError) -> str:
    if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
        return (
            f"{plugin.driver} advertises {plugin.health_service} but answers UNIMPLEMENTED: "
            "kubelets 1.37+ give up, 1.34-1.36 retry every 5 s forever; do not advertise it"
        )
    return f"{plugin.driver}: stream failed: {exc.code().name}: {exc.details()}"


def _render(
    out: TextIO,
    options: Options,
    *,
    plugin: getinfo.PluginInfo,
    response: Any,
    warnings: list[str],
    now: float,
) -> None:
    rows = [_row(dh, now) for dh in response.devices]
    if options.output == "json":
        record = {
            "driver": plugin.driver,
            "endpoint": plugin.endpoint,
            "service": plugin.health_service,
            "time": now,
            "devices": rows,
            "warnings": warnings,
        }
        print(json.dumps(record), file=out, flush=True)
        return
    stamp = time.strftime("%H:%M:%S", time.localtime(now))
    print(f"== {plugin.driver} via {plugin.health_service} at {stamp}", file=out)
    print(_table(rows), file=out)
    for warning in warnings:
        print(f"warning: {warning}", file=out)
    out.flush()


def _row(dh: Any, now: float) -> dict[str, Any]:
    timeout = int(dh.health_check_timeout_seconds)
    health = int(dh.health)
    return {
        "device": f"{dh.device.pool_name}/{dh.device.device_name}",
        "health": _ENUM_NAMES.get(health, f"enum {health}"),
        "lease": float(timeout) if timeout > 0 else healthinfo.DEFAULT_HEALTH_TIMEOUT,
        "age": round(now - dh.last_updated_time, 1) if dh.last_updated_time else None,
        "message": dh.message,
    }


def _table(rows: Sequence[dict[str, Any]]) -> str:
    header = ("DEVICE", "HEALTH", "LEASE", "AGE", "MESSAGE")
    cells = [header] + [
        (
            r["device"],
            r["health"],
            f"{r['lease']:.0f}s",
            "-" if r["age"] is None else f"{r['age']:.0f}s",
            _clip(r["message"]),
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header) - 1)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1]
        for row in cells
    ]
    return "\n".join(line.rstrip() for line in lines)


def _clip(message: str) -> str:
    one_line = message.replace("\n", " ")
    return one_line if len(one_line) <= _MESSAGE_COLUMN else one_line[: _MESSAGE_COLUMN - 3] + "..."


def _say(out: TextIO, options: Options, level: str, text: str) -> None:
    if options.output == "json":
        print(json.dumps({level: text}), file=out, flush=True)
    else:
        print(f"{level}: {text}", file=out, flush=True)


def _for(driver: str | None) -> str:
    return f" named {driver}" if driver else ""
