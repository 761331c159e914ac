"""What the runner compares, and how a difference is shown and explained.

An :class:`Observed` difference is one thing the two sides disagree on:
a container's ``allocatedResourcesStatus`` at a sync point, the pods
announced since the previous sync point, one device's health as each cache
reads it, the outcome of a registration or prepare, the checkpoint as our
CLI reads it, or the twin failing. A scenario's declared differences must
cover every observed one, and each declaration must cover at least one
(:func:`classify`), so declarations neither hide bugs nor rot.

Order: kubelet 1.38 sorts entries by name and resources by resourceID, so
from 1.38 on lists are compared exactly, order included. Earlier kubelets
build the entry list by iterating a Go map, whose order is random by design;
there entries are compared by name, and each entry's resources (an ordered
append over the driver's prepare answer) exactly.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tests.conformance import _scenario as sc

FIELDS = ("containerStatuses", "initContainerStatuses")
DEFAULT_TIMEOUT_NS = 30_000_000_000


@dataclasses.dataclass(frozen=True)
class Observed:
    kind: str
    at: str
    subject: str
    ours: Any
    twin: Any

    def render(self) -> str:
        head = f"[{self.kind}] at {self.at}: {self.subject}"
        if self.kind == "status":
            ours_lines = json.dumps(self.ours, indent=1, ensure_ascii=False).splitlines()
            twin_lines = json.dumps(self.twin, indent=1, ensure_ascii=False).splitlines()
            diff = difflib.unified_diff(
                twin_lines, ours_lines, "twin (kubelet)", "ours", lineterm="", n=2
            )
            return head + "\n    " + "\n    ".join(diff)
        twin, ours = _short(self.twin), _short(self.ours)
        return f"{head}\n    twin (kubelet): {twin}\n    ours:           {ours}"


def _short(value: Any, limit: int = 600) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


# -- statuses ------------------------------------------------------------------


def entries(status: Mapping[str, Any] | None, field: str) -> dict[str, list[Any]]:
    """Container name -> its ``allocatedResourcesStatus`` (missing = empty)."""
    out: dict[str, list[Any]] = {}
    for cs in (status or {}).get(field) or ():
        out[str(cs.get("name"))] = [_entry(e) for e in cs.get("allocatedResourcesStatus") or ()]
    return out


def _entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "name": entry.get("name"),
        "resources": [
            {k: r[k] for k in ("resourceID", "health", "message") if r.get(k) is not None}
            for r in entry.get("resources") or ()
        ],
    }


def compare_status(
    at: str, pod: str, ours: Mapping[str, Any], twin: Mapping[str, Any], *, ordered: bool
) -> list[Observed]:
    found = []
    for field in FIELDS:
        mine, theirs = entries(ours, field), entries(twin, field)
        for container in sorted(set(mine) | set(theirs)):
            a, b = mine.get(container, []), theirs.get(container, [])
            if not ordered:
                a = sorted(a, key=lambda e: str(e["name"]))
                b = sorted(b, key=lambda e: str(e["name"]))
            if a != b:
                found.append(Observed("status", at, f"pod {pod} {field}[{container}]", a, b))
    return found


# -- the twin's cache as its checkpoint reads ----------------------------------


def go_time(text: str) -> float:
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return 0.0


def twin_entry(state: Any, key: tuple[str, str, str]) -> Mapping[str, Any] | None:
    driver, pool, device = key
    if not isinstance(state, dict):
        return None
    devices = (state.get(driver) or {}).get("Devices") or {}
    entry = devices.get(f"{pool}/{device}")
    return entry if isinstance(entry, dict) else None


def twin_lease(entry: Mapping[str, Any]) -> float:
    return int(entry.get("HealthCheckTimeout") or DEFAULT_TIMEOUT_NS) / 1e9


def twin_view(entry: Mapping[str, Any] | None, now: float) -> tuple[str, str]:
    """``getHealthInfo``: Unknown when absent or past its timeout (strictly)."""
    if entry is None:
        return ("Unknown", "")
    if now - go_time(str(entry.get("LastUpdated", ""))) > twin_lease(entry):
        return ("Unknown", "")
    health = str(entry.get("Health"))
    if health not in ("Healthy", "Unhealthy", "Unknown"):
        health = "Unknown"
    return (health, str(entry.get("Message") or ""))


def compare_devices(
    at: str,
    ours: Mapping[tuple[str, str, str], tuple[str, str]],
    state: Any,
    now: float,
    *,
    limit: int = 20,
) -> list[Observed]:
    found = []
    for key, mine in ours.items():
        theirs = twin_view(twin_entry(state, key), now)
        if tuple(mine) != theirs:
            found.append(Observed("devices", at, "/".join(key), list(mine), list(theirs)))
            if len(found) >= limit:
                break
    return found


# -- the checkpoint as our CLI reads it ----------------------------------------


def checkpoint_rows(state: Any) -> list[dict[str, Any]]:
    """The twin's checkpoint as ``cache show`` should list it (stored values)."""
    rows = []
    if isinstance(state, dict):
        for driver, drv in state.items():
            for entry in ((drv or {}).get("Devices") or {}).values():
                rows.append(
                    {
                        "driver": driver,
                        "pool": entry.get("PoolName", ""),
                        "device": entry.get("DeviceName", ""),
                        "stored": _stored(entry.get("Health")),
                        "message": entry.get("Message") or "",
                        "lease": f"{twin_lease(entry):g}s",
                    }
                )
    return sorted(rows, key=row_key)


def _stored(value: Any) -> str:
    return str(value) if value in ("Healthy", "Unhealthy", "Unknown") else "Unknown"


def row_key(row: Mapping[str, Any]) -> tuple[str, str, str]:
    return (str(row["driver"]), str(row["pool"]), str(row["device"]))


def compare_cli(
    cli_rows: Sequence[Mapping[str, Any]], state: Any, *, limit: int = 20
) -> list[Observed]:
    mine = sorted(
        (
            {k: row[k] for k in ("driver", "pool", "device", "stored", "message", "lease")}
            for row in cli_rows
        ),
        key=row_key,
    )
    theirs = checkpoint_rows(state)
    if mine == theirs:
        return []
    a = {row_key(r): r for r in mine}
    b = {row_key(r): r for r in theirs}
    found = []
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            found.append(
                Observed(
                    "checkpoint", "end", "cache show: " + "/".join(key), a.get(key), b.get(key)
                )
            )
            if len(found) >= limit:
                break
    return found


# -- explaining ------------------------------------------------------------------


@dataclasses.dataclass
class Verdict:
    unexplained: list[Observed]
    missing: list[sc.Difference]
    seen: list[sc.Difference]

    @property
    def ok(self) -> bool:
        return not self.unexplained and not self.missing


def _covers(diff: sc.Difference, obs: Observed) -> bool:
    return obs.kind in diff.kinds and (not diff.at or obs.at in diff.at)


def classify(scenario: sc.Scenario, line: str, observed: Iterable[Observed]) -> Verdict:
    declared = [d for d in scenario.differences if line in d.lines]
    observed = list(observed)
    unexplained = [o for o in observed if not any(_covers(d, o) for d in declared)]
    seen = [d for d in declared if any(_covers(d, o) for o in observed)]
    missing = [d for d in declared if d not in seen]
    return Verdict(unexplained, missing, seen)
