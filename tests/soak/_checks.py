"""What the soak checks, continuously: lost final states, Unknown blips, refused writes, resources.

:class:`World` is what the drivers last said and when each part was down; the checks
read it:

- **lost final states** (:class:`Convergence`): once a second every pod is read
  straight from the real API server (not through the fault proxy) and compared with
  what its device's driver last said (``Unknown`` once the driver has been gone longer
  than its lease). A pod may differ for at most :data:`BOUND` seconds counted from
  the later of the change it must show and the end of the last fault that keeps the
  sidecar from writing (the sidecar down, the API server down, a fault-proxy window);
  longer is a lost final state. At the end every pod must match within the bound.
- **Unknown blips** (:func:`blips`): every status write the server accepted, as the
  fault proxy saw the stored pod come back, is read with the blip detector of
  ``tests/faults/_faults`` (``_unknown_resources``); an ``Unknown`` device whose
  lease was still running at that moment is a blip (:meth:`World.lease_running`).
- **writes refused as invalid**: the proxy's 400 and 422 answers to the sidecar.

Beside a real kubelet (its gate on) the field ``allocatedResourcesStatus`` is the
kubelet's, and the sidecar's own word on a pod is its condition ``DeviceHealthy``: the
convergence and blip checks then read that condition (:func:`condition_health`,
:func:`condition_unknown`), and the field only where a write of ours carried it. The
kubelet's field is sampled too, as a comparison (:func:`pod_health`), not as a check.
- **resources flat** (:func:`pooled_slope`): see there.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kubelet_dra.state import healthinfo
from kubelet_dra.status import podstatus
from tests.faults._faults import _unknown_resources

from . import _parts as parts
from . import _schedule as plan

#: Seconds a pod may differ from what its driver said, after its cause (see the doc).
BOUND = 60.0
#: Faults during which the sidecar cannot write (each counted until it is over).
BLOCKING = ("sidecar", "apiserver", "proxy")
#: Seconds after its restart that a driver back from an outage longer than its
#: guaranteed lease may still show Unknown (its stream's backoff, then a write).
REVIVAL = BOUND


@dataclasses.dataclass
class Interval:
    part: str
    kind: str
    start: float
    end: float | None = None


class World:
    """What each driver said (per device), and every part's down time, as it happened."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.said: dict[tuple[int, int], tuple[str, str]] = {
            (d, i): ("Healthy", "") for d in range(plan.DRIVERS) for i in range(plan.DEVICES)
        }
        self.said_at: dict[tuple[int, int], float] = dict.fromkeys(self.said, 0.0)
        self.down_since: dict[int, float | None] = dict.fromkeys(range(plan.DRIVERS))
        self.up_since: dict[int, float] = dict.fromkeys(range(plan.DRIVERS), 0.0)
        #: (driver, down, up) of finished outages.
        self.outages: list[tuple[int, float, float]] = []
        self.intervals: list[Interval] = []
        self.sidecar_starts: list[float] = []
        #: (driver, sidecar start) -> when that sidecar's first stream reached the driver.
        self.streamed: dict[tuple[int, float], float] = {}

    # -- recording -----------------------------------------------------------------------

    def reports(self, driver: int) -> list[dict[str, Any]]:
        with self.lock:
            return [
                {
                    "pool": parts.POOL,
                    "device": parts.device_name(i),
                    "health": self.said[(driver, i)][0],
                    "message": self.said[(driver, i)][1],
                    "timeout_seconds": plan.LEASE,
                }
                for i in range(plan.DEVICES)
            ]

    def say(self, driver: int, device: int, health: str, message: str, at: float) -> None:
        with self.lock:
            self.said[(driver, device)] = (health, message)
            self.said_at[(driver, device)] = at

    def driver_down(self, driver: int, at: float) -> None:
        with self.lock:
            self.down_since[driver] = at

    def streamed_since(self, driver: int, start: float, at: float) -> None:
        """The sidecar started at ``start`` opened its first stream to ``driver`` at ``at``."""
        with self.lock:
            self.streamed.setdefault((driver, start), at)

    def driver_up(self, driver: int, at: float) -> None:
        with self.lock:
            down = self.down_since[driver]
            if down is not None:
                self.outages.append((driver, down, at))
            self.down_since[driver] = None
            self.up_since[driver] = at

    def begin(self, part: str, kind: str, at: float) -> Interval:
        interval = Interval(part, kind, at)
        with self.lock:
            self.intervals.append(interval)
        return interval

    def end(self, interval: Interval, at: float) -> None:
        with self.lock:
            interval.end = at

    # -- reading -------------------------------------------------------------------------

    def blocked_until(self, now: float) -> float:
        """The end of the last fault that kept the sidecar from writing (``now`` while one
        is still on)."""
        latest = 0.0
        with self.lock:
            for interval in self.intervals:
                if interval.part.split("-")[0] not in BLOCKING:
                    continue
                latest = max(latest, now if interval.end is None else interval.end)
        return min(latest, now)

    def _guaranteed(self, driver: int, down: float, now: float) -> float:
        """Seconds of lease the sidecar promises after a driver went away at ``down``.

        The whole lease (less one re-send period) while the sidecar lives through the
        outage; across a sidecar restart it promises half (the state file's renewal
        rule), less any time the state dir could not be written before that restart. A
        restart is across the outage when the driver went away before the new sidecar's
        first stream reached it, even if that was after the start: a sidecar slow to
        start (a loaded node, tracemalloc) holds only what its state file kept.
        """
        lease = plan.LEASE - plan.RESEND - 1
        restarted = [
            s
            for s in self.sidecar_starts
            if s <= now and down < self.streamed.get((driver, s), math.inf)
        ]
        if not restarted:
            return lease
        disk = sum(
            min(i.end if i.end is not None else now, restarted[-1])
            - max(i.start, down - plan.LEASE / 2)
            for i in self.intervals
            if (i.part == "disk" or i.kind == "disk-readonly")
            and i.start < restarted[-1]
            and (i.end is None or i.end > down - plan.LEASE / 2)
        )
        return plan.LEASE / 2 - plan.RESEND - 1 - max(0.0, disk)

    def lease_running(self, driver: int, at: float) -> bool:
        """Whether the sidecar must still show what ``driver`` last said, at ``at``."""
        with self.lock:
            down = self.down_since[driver]
            if down is not None and down <= at:
                return at < down + self._guaranteed(driver, down, at)
            for d, start, up in self.outages:
                if d == driver and start <= at < up:
                    return at < start + self._guaranteed(driver, start, at)
            # Up at ``at``: after a long outage its first report may take a while.
            last = [(s, u) for d, s, u in self.outages if d == driver and u <= at]
            if last:
                start, up = last[-1]
                if up - start >= self._guaranteed(driver, start, up) and at < up + REVIVAL:
                    return False
            return True

    def expected(
        self, driver: int, device: int, now: float
    ) -> tuple[tuple[str, str] | None, float]:
        """(health, message) the pod must show now (``None``: either may be right) and
        since when it must."""
        with self.lock:
            health, message = self.said[(driver, device)]
            since = max(self.said_at[(driver, device)], self.up_since[driver])
            down = self.down_since[driver]
        said = (health, healthinfo.truncate_message(message))
        if down is None:
            return said, since
        gone = down + plan.LEASE + plan.RESEND + 1
        if now >= gone:
            return ("Unknown", ""), gone
        if self.lease_running(driver, now):
            return said, since
        return None, now


def pod_devices(pods: int = plan.PODS) -> dict[str, tuple[int, int]]:
    """Pod name -> (driver, device): pod ``k`` holds device ``k mod 24`` (six devices are
    held by two pods each, through two claims)."""
    out = {}
    for k in range(pods):
        flat = k % (plan.DRIVERS * plan.DEVICES)
        out[f"pod-{k:02d}"] = (flat // plan.DEVICES, flat % plan.DEVICES)
    return out


def pod_health(pod: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    status = pod.get("status") or {}
    entries = podstatus.container_entries(status, "containerStatuses", "main")
    return {
        r["resourceID"]: (r["health"], r.get("message", ""))
        for entry in entries
        for r in entry.get("resources", [])
    }


#: The sidecar's pod condition (its default ``--pod-condition-type``).
CONDITION = "DeviceHealthy"
#: Fewest bytes of a cut condition message (``...`` at its end) taken as the whole one:
#: the condition is capped at 1,024 bytes, its prefix names the device and the claim.
CUT_AT_LEAST = 900


def _condition(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if cond.get("type") == CONDITION:
            found: Mapping[str, Any] = cond
            return found
    return None


def condition_health(pod: Mapping[str, Any], resource: str) -> tuple[str, str] | None:
    """(health, message) the sidecar's condition gives the pod's one device ``resource``.

    Read from the documented format (docs/pod-status.md, "The pod condition"), not with
    the code that writes it: ``True`` is Healthy; ``False`` must read ``Unhealthy
    devices: <resource> (claim <name>)``, then ``: <message>`` if there is one;
    ``Unknown`` must name the device after ``Health unknown for devices:``. Anything else
    is returned as ``("?", message)`` and never matches.
    """
    cond = _condition(pod)
    if cond is None:
        return None
    status, message = cond.get("status"), str(cond.get("message") or "")
    if status == "True":
        return ("Healthy", "")
    if status == "Unknown" and f"{resource} (" in condition_unknown(pod):
        return ("Unknown", "")
    prefix = f"Unhealthy devices: {resource} (claim "
    if status == "False" and message.startswith(prefix):
        rest = message[len(prefix) :].partition(")")[2]
        return ("Unhealthy", rest[2:] if rest.startswith(": ") else "")
    return ("?", message)


def condition_unknown(pod: Mapping[str, Any]) -> str:
    """The part of the sidecar's condition message that names Unknown devices."""
    cond = _condition(pod)
    return str((cond or {}).get("message") or "").partition("Health unknown for devices:")[2]


def same(seen: tuple[str, str] | None, expected: tuple[str, str]) -> bool:
    """Whether ``seen`` shows ``expected``; a condition message cut at its 1,024-byte cap
    (ending in ``...``) shows a longer message it is a prefix of."""
    if seen == expected:
        return True
    if seen is None or seen[0] != expected[0] or not seen[1].endswith("..."):
        return False
    kept = seen[1][:-3]
    return len(kept.encode()) >= CUT_AT_LEAST and expected[1].startswith(kept)


@dataclasses.dataclass
class Lost:
    pod: str
    since: float
    seen: Any
    expected: Any


class Convergence:
    """Per pod: how long it has differed from what it must show, and every lag."""

    def __init__(self, world: World, start: float, *, condition: bool = False) -> None:
        self.world = world
        #: Read the sidecar's condition (beside a kubelet), else the field.
        self.condition = condition
        self.start = start
        self.devices = pod_devices()
        self.behind: dict[str, float] = {}
        self.lags: list[float] = []
        self.lost: list[Lost] = []
        self._reported: set[str] = set()

    def wrong(self, pods: Mapping[str, Mapping[str, Any]], now: float) -> dict[str, Any]:
        """Pods that differ now (ambiguous ones excluded): name -> (seen, expected, since)."""
        out = {}
        for name, (driver, device) in self.devices.items():
            expected, since = self.world.expected(driver, device, now)
            if expected is None:
                continue
            pod, resource = pods.get(name, {}), parts.resource_id(driver, device)
            if self.condition:
                seen = condition_health(pod, resource)
            else:
                seen = pod_health(pod).get(resource)
            if not same(seen, expected):
                out[name] = (seen, expected, since)
        return out

    def sample(self, pods: Mapping[str, Mapping[str, Any]], now: float) -> int:
        """One sample: returns how many pods differ now."""
        wrong = self.wrong(pods, now)
        blocked = self.world.blocked_until(now)
        for name in self.devices:
            if name not in wrong:
                if name in self.behind:
                    self.lags.append(now - self.behind.pop(name))
                self._reported.discard(name)
                continue
            seen, expected, since = wrong[name]
            cause = max(since, blocked)
            self.behind[name] = max(self.behind.get(name, cause), cause)
            if now - self.behind[name] > BOUND and name not in self._reported:
                self._reported.add(name)
                self.lost.append(Lost(name, self.behind[name] - self.start, seen, expected))
        return len(wrong)


def blips(
    world: World, writes: Iterable[Any], start: float, *, condition: bool = False
) -> list[str]:
    """Accepted status writes showing Unknown for a device whose lease was still running.

    ``condition`` (beside a kubelet): the stored pod's field is the kubelet's unless the
    write carried it, so the devices read are those the sidecar's condition calls
    Unknown, and the field's only from writes that sent it.
    """
    by_id = {
        parts.resource_id(d, i): (d, i) for d in range(plan.DRIVERS) for i in range(plan.DEVICES)
    }
    found = []
    for write in writes:
        ours = write.sent_field or not condition
        unknown = set(_unknown_resources(write.stored)) if ours else set()
        if condition:
            named = condition_unknown(write.stored)
            unknown |= {r for r in by_id if f"{r} (" in named}
        for resource in sorted(unknown):
            key = by_id.get(resource)
            if key is not None and world.lease_running(key[0], write.at):
                found.append(f"{write.at - start:.1f} s {write.pod}: {resource} Unknown")
    return found


def pooled_slope(samples: Sequence[tuple[int, float, float]]) -> float | None:
    """Slope (units per second) of a linear fit with one intercept per sidecar life.

    ``samples`` are ``(life, t, value)``. The sidecar is killed and restarted through
    the run, so its RSS, fds and tasks start again from a new base at each life; a
    single line through the sawtooth would hide a leak that grows inside every life.
    Each life's samples are centred on their own means and one slope is fitted to all
    of them (the within estimator of a fixed-effects regression): a leak of ``x`` per
    second in every life reads as ``x``. ``None`` without two samples of one life.
    """
    lives: dict[int, list[tuple[float, float]]] = {}
    for life, t, value in samples:
        lives.setdefault(life, []).append((t, value))
    num = den = 0.0
    for points in lives.values():
        if len(points) < 2:
            continue
        mean_t = sum(t for t, _ in points) / len(points)
        mean_v = sum(v for _, v in points) / len(points)
        num += sum((t - mean_t) * (v - mean_v) for t, v in points)
        den += sum((t - mean_t) ** 2 for t, _ in points)
    return num / den if den > 0 else None


def now() -> float:
    return time.time()
