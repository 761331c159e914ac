"""The taint bridge's policy: when a device should carry a taint, and which (pure).

No kubelet counterpart: the kubelet stops at ``allocatedResourcesStatus``. Pure (``now`` is
always an argument, nothing is read or written); ``loop`` runs it against the health cache,
``planner`` turns its decisions into DeviceTaintRules. Per device it keeps a :class:`Track`,
and :func:`step` applies the thresholds (its docstring has them). Every change of health
restarts the clock, so a device that flaps faster than the thresholds never changes its
taint: no rule churn.
"""

from __future__ import annotations

import dataclasses

from kubelet_dra import models

MESSAGE_MAX_BYTES = 256
"""The driver's message in a decided taint is cut to this many bytes: enough to read the
reason, small enough that thousands of rules stay cheap to list."""


@dataclasses.dataclass(frozen=True, slots=True)
class Thresholds:
    """The bridge's settings in seconds; ``unknown_after`` ``None`` never taints Unknown."""

    effect: str
    key: str
    taint_after: float = 10.0
    unknown_after: float | None = None
    untaint_after: float = 60.0


@dataclasses.dataclass(frozen=True, slots=True)
class Taint:
    """A decided taint: its value (the health), when it was decided, the driver's message."""

    value: str
    time_added: float
    message: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Track:
    """What the bridge remembers of one device (persisted across restarts)."""

    health: models.HealthStatus
    since: float
    taint: Taint | None = None

    @property
    def forgettable(self) -> bool:
        """Healthy and untainted: nothing to remember."""
        return self.taint is None and self.health is models.HealthStatus.HEALTHY


def observe(track: Track | None, health: models.HealthStatus, now: float) -> Track:
    """The track after the device was seen with ``health`` at ``now``."""
    if track is None:
        return Track(health, now)
    if track.health is health:
        return track
    return Track(health, now, track.taint)


def step(
    track: Track, thresholds: Thresholds, now: float, message: str = ""
) -> tuple[Track, float | None]:
    """Apply the thresholds at ``now``: the new track and when to look again (or ``None``).

    Per device it keeps a :class:`Track`: the health the device shows, since when it shows it
    without interruption, and the taint the bridge decided on (if any). :func:`step` applies
    the thresholds:

    - untainted, ``Unhealthy`` for ``taint_after`` seconds without interruption: taint with
      value ``Unhealthy``; ``Unknown`` for ``taint_unknown_after`` (if set): value ``Unknown``;
    - tainted, ``Healthy`` for ``untaint_after`` seconds without interruption: untaint;
    - tainted ``Unknown`` and then ``Unhealthy`` for ``taint_after``: the value becomes
      ``Unhealthy``. ``Unknown`` never replaces ``Unhealthy``: it says nothing new about a
      device known to be broken.

    Every change of health restarts the clock, so a device that flaps faster than the
    thresholds never changes its taint: no rule churn. The driver's message is the one of the
    moment of the decision; later messages do not rewrite the rule (drivers put counters and
    temperatures in messages).
    """
    held = now - track.since
    health = models.HealthStatus
    if track.taint is None:
        after = _taint_threshold(track.health, thresholds)
        if after is None:
            return track, None
        if held >= after:
            taint = Taint(track.health.value, now, _cut(message))
            return dataclasses.replace(track, taint=taint), None
        return track, track.since + after
    if track.health is health.HEALTHY:
        if held >= thresholds.untaint_after:
            return dataclasses.replace(track, taint=None), None
        return track, track.since + thresholds.untaint_after
    if track.health is health.UNHEALTHY and track.taint.value != health.UNHEALTHY.value:
        if held >= thresholds.taint_after:
            taint = Taint(health.UNHEALTHY.value, track.taint.time_added, _cut(message))
            return dataclasses.replace(track, taint=taint), None
        return track, track.since + thresholds.taint_after
    return track, None


def _taint_threshold(health: models.HealthStatus, thresholds: Thresholds) -> float | None:
    if health is models.HealthStatus.UNHEALTHY:
        return thresholds.taint_after
    if health is models.HealthStatus.UNKNOWN:
        return thresholds.unknown_after
    return None


def _cut(message: str) -> str:
    raw = message.encode("utf-8")
    if len(raw) <= MESSAGE_MAX_BYTES:
        return message
    return raw[: MESSAGE_MAX_BYTES - 3].decode("utf-8", errors="ignore") + "..."
