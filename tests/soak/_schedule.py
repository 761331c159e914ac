"""The soak's seeded random schedule: which fault hits which part when, and every health change.

Pure: :func:`make` turns ``(seed, minutes)`` into the whole plan before anything starts,
so a failing run is replayed exactly with ``--seed`` (the schedule is printed at the
start and written to ``schedule.json``).

Each part (the sidecar, each driver, the API server, the fault proxy, the state dir) has
its faults placed without overlap on its own timeline; faults of different parts overlap
freely. The sidecar's own faults fall in the first third of the faulted time, so that its
last life (two thirds of the run) measures the resource slopes. Every kind appears at
least once, whatever the length, and longer runs add more
at the rates of :data:`PER_HOUR`. Faults start after :data:`WARMUP` seconds and end
:data:`QUIET` seconds before the end, which is left for the final convergence check.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Sequence
from typing import Any

DRIVERS = 3
DEVICES = 8
PODS = 30
#: Seconds of each driver's lease (``timeout_seconds``) and of its re-sends.
LEASE = 60
RESEND = 2.0
WARMUP = 30.0
QUIET = 60.0

#: part -> kinds of fault on it (each driver's part is ``driver-<i>``).
KINDS: dict[str, tuple[str, ...]] = {
    # A read-only state dir meets the sidecar at its start (see _run: Linux refuses to
    # remount a filesystem read-only while a file is open for writing), so it is a
    # sidecar fault: SIGKILL, remount ro, start, remount rw after the window.
    "sidecar": ("sidecar-sigkill", "sidecar-sigterm", "disk-readonly"),
    "driver": ("driver-sigkill-same-socket", "driver-sigkill-new-socket", "driver-flood"),
    "apiserver": ("apiserver-restart",),
    "proxy": ("proxy-5xx", "proxy-429", "proxy-reset", "proxy-stall"),
    "disk": ("disk-full",),
    # Only where a real kubelet runs (``make(..., kubelet=True)``): SIGKILL, then a start
    # that waits for its Node to be Ready again (its fake runtime keeps the containers).
    "kubelet": ("kubelet-restart",),
}
#: Extra faults per hour of faulted time, per part (beyond one of each kind).
PER_HOUR = {
    "sidecar": 24.0, "driver": 6.0, "apiserver": 4.0, "proxy": 24.0, "disk": 10.0, "kubelet": 6.0,
}  # fmt: skip
#: (shortest, longest) seconds each kind lasts: the outage, the window, the flood.
DURATIONS: dict[str, tuple[float, float]] = {
    "sidecar-sigkill": (0.5, 3.0),
    "sidecar-sigterm": (0.5, 3.0),
    "driver-sigkill-same-socket": (1.0, 90.0),
    "driver-sigkill-new-socket": (1.0, 90.0),
    "driver-flood": (10.0, 30.0),
    "apiserver-restart": (1.0, 5.0),
    "proxy-5xx": (5.0, 20.0),
    "proxy-429": (5.0, 20.0),
    "proxy-reset": (5.0, 20.0),
    "proxy-stall": (5.0, 15.0),
    "disk-full": (5.0, 15.0),
    "disk-readonly": (5.0, 15.0),
    "kubelet-restart": (1.0, 20.0),
}
#: Share of the faulted time, from its start, in which the sidecar's own faults fall.
SIDECAR_SHARE = 1 / 3
#: Mean seconds between two health changes (any driver).
CHANGE_EVERY = 3.0
LONG_MESSAGE_RATE = 0.1


@dataclasses.dataclass(frozen=True)
class Fault:
    at: float
    part: str
    kind: str
    seconds: float


@dataclasses.dataclass(frozen=True)
class Change:
    at: float
    driver: int
    device: int
    health: str
    message: str


@dataclasses.dataclass(frozen=True)
class Schedule:
    seed: int
    minutes: float
    faults: tuple[Fault, ...]
    changes: tuple[Change, ...]

    @property
    def seconds(self) -> float:
        return self.minutes * 60

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "minutes": self.minutes,
            "faults": [dataclasses.asdict(f) for f in self.faults],
            "changes": [dataclasses.asdict(c) for c in self.changes],
        }

    def table(self) -> str:
        lines = [f"soak schedule: seed {self.seed}, {self.minutes:g} min, {len(self.faults)} "
                 f"faults, {len(self.changes)} health changes (replay: --seed {self.seed} "
                 f"--minutes {self.minutes:g})"]  # fmt: skip
        lines += [
            f"  {f.at:8.1f} s  {f.part:<10} {f.kind:<27} {f.seconds:5.1f} s" for f in self.faults
        ]
        return "\n".join(lines)


def part_names(kubelet: bool = False) -> list[str]:
    names = ["sidecar", *(f"driver-{i}" for i in range(DRIVERS)), "apiserver", "proxy", "disk"]
    return [*names, "kubelet"] if kubelet else names


def kinds_of(part: str) -> tuple[str, ...]:
    return KINDS[part.split("-", maxsplit=1)[0]]


def make(seed: int, minutes: float, *, kubelet: bool = False) -> Schedule:
    """The plan of ``(seed, minutes)``; ``kubelet`` adds the kubelet's faults, drawn from
    a generator of their own so that every other fault and change is the same plan with
    or without a kubelet (a seed replays the same run either way)."""
    rng = random.Random(seed)
    start, end = WARMUP, max(WARMUP + 30.0, minutes * 60 - QUIET)
    faults: list[Fault] = []
    for part in part_names():
        # The sidecar's own faults fall in the first third: its last life then spans
        # the rest, long enough for a resource slope to mean something (a life of a
        # few minutes is mostly warm-up: connection pools, the allocator's high water).
        stop = start + (end - start) * SIDECAR_SHARE if part == "sidecar" else end
        kinds = _kinds_for(rng, part, stop - start)
        faults += _place(rng, part, kinds, start, stop)
    changes = _changes(rng, minutes * 60 - 20)
    if kubelet:
        own = random.Random(f"{seed}/kubelet")
        faults += _place(own, "kubelet", _kinds_for(own, "kubelet", end - start), start, end)
    faults.sort(key=lambda f: (f.at, f.part))
    return Schedule(seed, minutes, tuple(faults), tuple(changes))


def _kinds_for(rng: random.Random, part: str, seconds: float) -> list[str]:
    kinds = list(kinds_of(part))
    if part.startswith("driver-"):
        # One of each driver kind among the three drivers, not three of each.
        index = int(part.split("-")[1])
        kinds = [kinds[index % len(kinds)]]
    extra = _poisson(rng, PER_HOUR[part.split("-", maxsplit=1)[0]] * seconds / 3600)
    return kinds + [rng.choice(kinds_of(part)) for _ in range(extra)]


def _poisson(rng: random.Random, mean: float) -> int:
    count, total = 0, rng.expovariate(1.0)
    while total < mean:
        count += 1
        total += rng.expovariate(1.0)
    return count


def _place(
    rng: random.Random, part: str, kinds: Sequence[str], start: float, end: float
) -> list[Fault]:
    """One slot of equal length per fault, in random order: never two at once on a part."""
    order = list(kinds)
    rng.shuffle(order)
    slot = (end - start) / max(1, len(order))
    placed = []
    for i, kind in enumerate(order):
        low, high = DURATIONS[kind]
        seconds = min(rng.uniform(low, high), 0.8 * slot)
        at = start + i * slot + rng.uniform(0, slot - seconds)
        placed.append(Fault(round(at, 1), part, kind, round(seconds, 1)))
    return placed


def _changes(rng: random.Random, end: float) -> list[Change]:
    """Health changes from the first seconds to 20 s before the end."""
    changes: list[Change] = []
    at = 5.0
    while True:
        at += rng.expovariate(1 / CHANGE_EVERY)
        if at >= end:
            return changes
        if rng.random() < 0.5:
            health, message = "Healthy", ""
        else:
            health, message = "Unhealthy", f"XID {rng.randint(1, 200)} ✗"
            if rng.random() < LONG_MESSAGE_RATE:
                # Over the API's 1024 bytes: the sidecar must cut it, never send it whole.
                message = f"XID {rng.randint(1, 200)} " + "✗" * rng.randint(400, 600)
        changes.append(
            Change(round(at, 2), rng.randrange(DRIVERS), rng.randrange(DEVICES), health, message)
        )


def load(path: str) -> dict[str, Any]:
    with open(path) as f:
        data: dict[str, Any] = json.load(f)
    return data
