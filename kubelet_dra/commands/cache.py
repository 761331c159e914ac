"""``kubelet-dra-health cache show``: read a health cache offline.

Two sources, one table: ``--state-dir DIR``, our own store (nothing is written; an
unreadable file is said and exits 1 without moving anything), and ``--kubelet-state FILE``,
a real kubelet's ``dra_health_state`` JSON (``pkg/kubelet/cm/dra/healthinfo.go``), read as
the kubelet v1.38 ``loadFromCheckpoint`` reads it (:func:`read_kubelet_state`). Both print
what a reader would see now: a record whose lease ran out shows ``Unknown``, as the
kubelet's ``getHealthInfo``. Where the kubelet's DRA checkpoint (``--kubelet-root-dir``,
``kubeletcheckpoint``) names a device by a CDI device ID, the ``resourceid`` column shows
the ``resourceID`` the kubelet writes for it (:func:`read_resource_ids`).
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

from kubelet_dra import errors, models
from kubelet_dra.state import healthinfo, kubeletcheckpoint, store
from kubelet_dra.status import claims

Row = tuple[models.DeviceKey, models.DeviceHealth]
Ids = dict[models.DeviceKey, tuple[str, str]]  # (kubelet's, our) resourceID


def add_parser(subparsers: Any) -> None:
    """Register ``cache show`` on the CLI's subparsers."""
    cache = subparsers.add_parser("cache", help="inspect a health cache offline")
    verbs = cache.add_subparsers(dest="cache_command", required=True)
    show = verbs.add_parser("show", help="print every device the cache holds")
    source = show.add_mutually_exclusive_group(required=True)
    source.add_argument("--state-dir", type=pathlib.Path, help="our state directory")
    source.add_argument("--kubelet-state", type=pathlib.Path, help="a kubelet dra_health_state")
    show.add_argument(
        "--kubelet-root-dir",
        type=pathlib.Path,
        default=pathlib.Path("/var/lib/kubelet"),
        help="the kubelet's root dir, whose dra_manager_state names CDI device IDs "
        "(default /var/lib/kubelet; empty: none)",
    )
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
    ids = read_resource_ids(ns.kubelet_root_dir)
    render(rows, now=time.time(), output=ns.output, out=sys.stdout, ids=ids)
    return 0


def read_resource_ids(root: pathlib.Path | None) -> Ids:
    """Each device's (kubelet's, our) resourceID from the kubelet's DRA checkpoint.

    The first claim in (namespace, name) order speaks for a device in several.

    The ``resourceid`` column shows the ``resourceID`` the kubelet writes for a device (and ours
    after it where several devices of a claim share that ID), so a row can be matched with
    ``allocatedResourcesStatus``; JSON has ``name``, ``kubeletResourceID`` and ``resourceID``.
    A missing checkpoint leaves the column empty; an unusable one is a warning on stderr.
    """
    if root is None or str(root) in ("", "."):
        return {}
    try:
        found = kubeletcheckpoint.read(root / kubeletcheckpoint.FILE_NAME) or ()
    except kubeletcheckpoint.CheckpointError as exc:
        print(f"warning: kubelet checkpoint not used: {exc}", file=sys.stderr)
        return {}
    ids: Ids = {}
    for claim in sorted(found, key=lambda c: c.key):
        for device in claim.devices:
            ids.setdefault(device.key, (device.kubelet_id, device.resource_id))
    return ids


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
    """The rows of a real kubelet's ``dra_health_state`` JSON, as a reader sees them now.

    The file is driver -> ``Devices`` -> ``"<pool>/<device>"`` -> ``PoolName``,
    ``DeviceName``, ``Health``, ``LastUpdated`` (Go RFC 3339), ``HealthCheckTimeout``
    (nanoseconds, 1.35+), ``Message`` (1.36+). A ``null`` file, a driver that is ``null`` or
    has ``"Devices": null`` and a ``null`` device entry read as empty, as the kubelet v1.38
    ``loadFromCheckpoint`` reads them (v1.37 loaded them and then panicked on the next update);
    a null device entry is the kubelet's zero ``DeviceHealth`` and reads ``Unknown``.
    """
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
            try:
                rows.append(_kubelet_row(driver, name, entry, default_lease))
            except ValueError as exc:
                raise errors.StoreError(f"{path}: driver {driver!r}, {name!r}: {exc}") from exc
    return sorted(rows)


def _kubelet_row(driver: str, name: str, entry: object, default_lease: float) -> Row:
    if not isinstance(entry, dict):
        # Go decodes null to the zero DeviceHealth (empty names, zero time),
        # which reads Unknown; show it under its map key "<pool>/<device>".
        pool, _, device = name.rpartition("/")
        return models.DeviceKey(driver, pool, device), models.DeviceHealth(
            models.HealthStatus.UNKNOWN, "", default_lease, 0.0
        )
    timeout_ns = _duration(entry.get("HealthCheckTimeout"))
    record = models.DeviceHealth(
        health=_health(entry.get("Health")),
        message=str(entry.get("Message") or ""),
        lease=timeout_ns / 1e9 if timeout_ns > 0 else default_lease,
        last_report=_go_time(str(entry.get("LastUpdated", ""))),
    )
    key = models.DeviceKey(driver, str(entry.get("PoolName", "")), str(entry.get("DeviceName", "")))
    return key, record


def _beside(key: models.DeviceKey, kubelet_id: str, resource_id: str) -> str:
    """The table's ``resourceid``: what ``claims.device_name`` puts in parentheses."""
    name = claims.device_name(key, kubelet_id, resource_id)
    return name[len(str(key)) + 2 : -1] if name != str(key) else ""


def _duration(value: object) -> int:
    """``HealthCheckTimeout``, a Go ``time.Duration``: an int64 of nanoseconds or absent.

    Go's decoder refuses the whole file for anything else (a string, a
    fraction, a number out of range), so do we (``ValueError``).
    """
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**63) <= value < 2**63:
        raise ValueError(f"HealthCheckTimeout {str(value)[:40]!r} is not an int64 of nanoseconds")
    return value


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


def render(
    rows: Iterable[Row], *, now: float, output: str, out: TextIO, ids: Ids | None = None
) -> None:
    items = [_as_dict(key, record, now, (ids or {}).get(key)) for key, record in rows]
    if output == "json":
        plain = [{k: v for k, v in item.items() if k != "resourceid"} for item in items]
        json.dump(plain, out, indent=2, ensure_ascii=False)
        out.write("\n")
        return
    columns = [
        "driver", "pool", "device", "stored", "visible", "lease", "age", "resourceid", "message",
    ]  # fmt: skip
    table = [[str(item[c]) for c in columns] for item in items]
    widths = [max([len(c), *(len(r[i]) for r in table)]) for i, c in enumerate(columns)]
    for line in [[c.upper() for c in columns], *table]:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
        out.write("\n")
    out.write(f"{len(items)} devices\n")


def _as_dict(
    key: models.DeviceKey,
    record: models.DeviceHealth,
    now: float,
    ids: tuple[str, str] | None = None,
) -> dict[str, Any]:
    visible, _ = record.visible(now)
    kubelet_id, resource_id = ids or (str(key), str(key))
    return {
        "driver": key.driver,
        "pool": key.pool,
        "device": key.device,
        "name": claims.device_name(key, kubelet_id, resource_id),
        "kubeletResourceID": kubelet_id,
        "resourceID": resource_id,
        "resourceid": _beside(key, kubelet_id, resource_id),
        "stored": record.health.value,
        "visible": visible.value,
        "lease": f"{record.lease:g}s",
        "age": f"{max(0.0, now - record.last_report):.0f}s",
        "message": record.message,
        "endpoint": record.endpoint,
        "lastReport": record.last_report,
    }
