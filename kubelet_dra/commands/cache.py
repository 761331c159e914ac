"""``kubelet-dra-health cache show``: read a health cache offline.

Two sources, one table:

- ``--state-dir DIR``: our own store (``store.HealthStore``), opened read-only
  in spirit (nothing is written unless the file is unreadable, in which case
  the command says so and exits 1 without moving anything);
- ``--kubelet-state FILE``: a real kubelet's ``dra_health_state`` JSON
  (kubelet ``pkg/kubelet/cm/dra/healthinfo.go``), to debug a node: driver ->
  ``Devices`` -> ``"<pool>/<device>"`` -> ``PoolName``, ``DeviceName``,
  ``Health``, ``LastUpdated`` (Go RFC 3339), ``HealthCheckTimeout``
  (nanoseconds, 1.35+), ``Message`` (1.36+).

A ``null`` file, a driver that is ``null`` or has ``"Devices": null`` and a
``null`` device entry read as empty, as the kubelet v1.38 ``loadFromCheckpoint``
reads them (v1.37 loaded them and then panicked on the next update). A null
device entry is the kubelet's zero ``DeviceHealth``: it reads ``Unknown``.

Both print what a reader would see *now*: a record whose lease ran out shows
``Unknown`` in the ``visible`` column, as the kubelet's ``getHealthInfo``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sqlite3
import sys
import time
from collections.abc import Iterable
from typing import Any, TextIO

from kubelet_dra import errors, healthinfo, models, store

Row = tuple[models.DeviceKey, models.DeviceHealth]


def add_parser(subparsers: Any) -> None:
    """Register ``cache show`` on the CLI's subparsers."""
    cache = subparsers.add_parser("cache", help="inspect a health cache offline")
    verbs = cache.add_subparsers(dest="cache_command", required=True)
    show = verbs.add_parser("show", help="print every device the cache holds")
    source = show.add_mutually_exclusive_group(required=True)
    source.add_argument("--state-dir", type=pathlib.Path, help="our state directory")
    source.add_argument("--kubelet-state", type=pathlib.Path, help="a kubelet dra_health_state")
    show.add_argument("--output", choices=["table", "json"], default="table")
    show.add_argument(
        "--health-timeout",
        type=float,
        default=healthinfo.DEFAULT_HEALTH_TIMEOUT,
        help="lease for records that carry none (kubelet 1.34 files)",
    )
    show.set_defaults(handler=run_show)


def run_show(ns: argparse.Namespace) -> int:
    try:
        if ns.state_dir is not None:
            rows = read_state_dir(ns.state_dir)
        else:
            rows = read_kubelet_state(ns.kubelet_state, default_lease=ns.health_timeout)
    except errors.StoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    render(rows, now=time.time(), output=ns.output, out=sys.stdout)
    return 0


def read_state_dir(state_dir: pathlib.Path) -> list[Row]:
    path = state_dir / store.FILE_NAME
    if not path.exists():
        raise errors.StoreError(f"no health cache in {state_dir}")
    # Plain sqlite3 in read-only mode: a debugging command must never move
    # or rewrite the file a running sidecar owns.
    try:
        conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
        try:
            values = [v for (v,) in conn.execute("SELECT value FROM devices")]
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise errors.StoreError(f"cannot read {path}: {exc}") from exc
    rows = []
    for value in values:
        try:
            rows.append(store.StoredDevice.model_validate_json(value).to_record())
        except ValueError as exc:
            print(f"warning: skipping unreadable record: {exc}", file=sys.stderr)
    return sorted(rows)


def read_kubelet_state(path: pathlib.Path, *, default_lease: float) -> list[Row]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise errors.StoreError(f"cannot read kubelet state {path}: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise errors.StoreError(f"{path}: expected a JSON object of drivers")
    rows = []
    for driver, state in data.items():
        devices = state.get("Devices") if isinstance(state, dict) else None
        if devices is not None and not isinstance(devices, dict):
            raise errors.StoreError(f"{path}: driver {driver!r}: Devices is not an object")
        for name, entry in (devices or {}).items():
            rows.append(_kubelet_row(driver, name, entry, default_lease))
    return sorted(rows)


def _kubelet_row(driver: str, name: str, entry: object, default_lease: float) -> Row:
    if not isinstance(entry, dict):
        # Go decodes null to the zero DeviceHealth (empty names, zero time),
        # which reads Unknown; show it under its map key "<pool>/<device>".
        pool, _, device = name.rpartition("/")
        return models.DeviceKey(driver, pool, device), models.DeviceHealth(
            models.HealthStatus.UNKNOWN, "", default_lease, 0.0
        )
    timeout_ns = int(entry.get("HealthCheckTimeout") or 0)
    record = models.DeviceHealth(
        health=_health(entry.get("Health")),
        message=str(entry.get("Message") or ""),
        lease=timeout_ns / 1e9 if timeout_ns > 0 else default_lease,
        last_report=_go_time(str(entry.get("LastUpdated", ""))),
    )
    key = models.DeviceKey(driver, str(entry.get("PoolName", "")), str(entry.get("DeviceName", "")))
    return key, record


def _health(value: object) -> models.HealthStatus:
    try:
        return models.HealthStatus(str(value))
    except ValueError:
        return models.HealthStatus.UNKNOWN


def _go_time(text: str) -> float:
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return 0.0


def render(rows: Iterable[Row], *, now: float, output: str, out: TextIO) -> None:
    items = [_as_dict(key, record, now) for key, record in rows]
    if output == "json":
        json.dump(items, out, indent=2, ensure_ascii=False)
        out.write("\n")
        return
    columns = ["driver", "pool", "device", "stored", "visible", "lease", "age", "message"]
    table = [[str(item[c]) for c in columns] for item in items]
    widths = [max([len(c), *(len(r[i]) for r in table)]) for i, c in enumerate(columns)]
    for line in [[c.upper() for c in columns], *table]:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
        out.write("\n")
    out.write(f"{len(items)} devices\n")


def _as_dict(key: models.DeviceKey, record: models.DeviceHealth, now: float) -> dict[str, Any]:
    visible, _ = record.visible(now)
    return {
        "driver": key.driver,
        "pool": key.pool,
        "device": key.device,
        "stored": record.health.value,
        "visible": visible.value,
        "lease": f"{record.lease:g}s",
        "age": f"{max(0.0, now - record.last_report):.0f}s",
        "message": record.message,
        "endpoint": record.endpoint,
        "lastReport": record.last_report,
    }
