"""The device health cache: leases, changed-device sets and deadlines.

Counterpart of the kubelet's ``pkg/kubelet/cm/dra/healthinfo.go`` (``healthInfoCache``),
with the same visible semantics, a driver's device cap as v1.37.2 has it, and fixes where
the kubelet has known bugs (eager expiry, #140819; leases that outlive the stream, #140818):
:class:`HealthCache` says each rule. Pure apart from its log line: ``now`` is always an
argument and persistence is a :class:`Sink` the caller provides (``store.HealthStore``).
"""

from __future__ import annotations

import collections
import heapq
import logging
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from typing import Protocol

from kubelet_dra import models

logger = logging.getLogger(__name__)

DEFAULT_HEALTH_TIMEOUT = 30.0
"""The kubelet's ``DefaultHealthTimeout``."""

MESSAGE_MAX_BYTES = 1024
"""``v1.ResourceHealthMessageMaxLength``: the API limit, in bytes."""

MAX_DEVICES_PER_DRIVER = 16_384
"""The kubelet's ``maxDevicesPerDriver`` (v1.37.2+): records kept per driver."""

PERSIST_FRACTION = 0.5
"""A renewal is persisted once the persisted record has less than this part of its
lease left: a crash then costs a device at most this part of its lease."""

CAP_REASON = "device_cap"
"""The ``refused`` reason of a new device beyond :data:`MAX_DEVICES_PER_DRIVER`."""

_ELLIPSIS = "..."
_NEVER = float("-inf")  # the receive time of a record never persisted

Key = tuple[str, str]  # (pool, device) inside one driver
Entry = tuple[models.HealthStatus, str, int, int]
"""One reported device without its name: health, message, timeout_seconds, driver_time
(the fields of :class:`models.DeviceReport` after its key)."""
Entries = Mapping[Key, Entry]
"""One report as the stream converts it (``streams.convert``) and the cache applies it:
each device once, keyed as the cache keys a driver's records, in report order."""
StagedKey = tuple[str, str, str]
"""(driver, pool, device): a :class:`models.DeviceKey` or a plain tuple equal to it
(the hot path stages plain tuples; they hash and compare as the named tuple)."""


class Sink(Protocol):
    """Where the cache hands records to be persisted (see ``store``)."""

    def stage(self, key: models.DeviceKey, record: models.DeviceHealth) -> None: ...

    def stage_many(self, records: Iterable[tuple[StagedKey, models.DeviceHealth]]) -> None: ...

    def stage_delete(self, keys: Iterable[models.DeviceKey]) -> None: ...


def truncate_message(message: str) -> str:
    """Cut a message to the API's byte limit the way the kubelet does.

    The kubelet keeps the first 1021 bytes and appends ``...``; Go slices
    bytes and may split a UTF-8 character (still so in v1.38.0-beta.0), which
    the API server then rejects. We drop the partial character instead, a
    deliberate difference: our message can be up to 3 bytes shorter.
    """
    raw = message.encode("utf-8")
    if len(raw) <= MESSAGE_MAX_BYTES:
        return message
    head = raw[: MESSAGE_MAX_BYTES - len(_ELLIPSIS)].decode("utf-8", errors="ignore")
    return head + _ELLIPSIS


class HealthCache:
    """Health of every device of every driver, with eager lease expiry.

    The kubelet's visible semantics:

    - a report replaces a device's record and restarts its lease at receive time
      (the driver's ``last_updated_time`` is kept for display, never trusted);
    - the lease is the device's positive ``health_check_timeout_seconds``, else the
      node default (30 s);
    - an update returns the devices whose visible state (health, message, lease)
      changed; an identical report changes nothing.

    Like the kubelet v1.37.2 (and newer):

    - a driver holds at most :data:`MAX_DEVICES_PER_DRIVER` records; a report's
      new devices beyond it are refused (counted in :attr:`HealthCache.refused`,
      one log line per report), known devices are always updated;
    - a record the driver stopped reporting, whose lease ran out, is deleted at
      the driver's next report that does not carry it (in memory and, through the
      sink, on disk); a deleted device reads ``Unknown``.

    Where the kubelet has known bugs this cache does better:

    - expiry is eager: :meth:`HealthCache.next_deadline` and
      :meth:`HealthCache.expire` let the caller act at the deadline (kubelet
      #140819 only notices on the next report or status rebuild). The expired
      record stays, ``Unknown``, until that next report deletes it silently:
      the ``Unknown`` notification the kubelet sends with the deletion was sent
      at the deadline instead;
    - the lease outlives the stream: when an endpoint's stream ends (EOF, error,
      deregistration) its devices keep their last reported state until their
      lease runs out (the kubelet's ``clearDriver`` deletes the whole driver at
      once, #140818). Nothing changes at the stream end; another endpoint of the
      driver that reports a device takes it over; a device whose lease runs out
      first turns ``Unknown`` at its deadline through :meth:`HealthCache.expire`,
      as for a silent driver, and since no stream of its endpoint runs any more
      its record is deleted then (so the records of a driver that vanished go at
      the end of their leases). An endpoint counts as streaming from its first
      report until its stream ends (:meth:`HealthCache.end_endpoint`); records
      loaded from the state file belong to no streaming endpoint until theirs
      reports;
    - changes are computed against what a reader saw, so a report that revives an
      expired device is a change even if the stale record said the same thing.

    Persistence (the kubelet stores only changes, so its restart loses every
    lease): a report that changes a device's health, message, lease or endpoint
    is handed to the sink at once; a plain renewal only when the record last
    handed over would otherwise expire within half its lease
    (:data:`PERSIST_FRACTION`). So after a crash a device keeps at least half of
    the lease its last persisted report gave it, and a driver resending every
    second costs one row per device per half lease, not one per report.
    """

    def __init__(
        self,
        *,
        default_lease: float = DEFAULT_HEALTH_TIMEOUT,
        sink: Sink | None = None,
    ) -> None:
        if default_lease <= 0:
            raise ValueError("default_lease must be positive")
        self.default_lease = default_lease
        self._sink = sink
        self._drivers: dict[str, dict[Key, models.DeviceHealth]] = {}
        # Heap of (deadline, device) with at most one live entry per device,
        # whose deadline is in _scheduled; entries are settled lazily (_due).
        self._heap: list[tuple[float, models.DeviceKey]] = []
        # The latest time expire() ran up to: every heap entry before it is gone. A
        # record whose deadline lies before it has no entry left, even where its
        # deadline is still ahead of a report's time (a wall clock stepped back).
        self._expired_through = _NEVER
        # Keyed by DeviceKey; looked up with plain (driver, pool, device) tuples too.
        self._scheduled: dict[StagedKey, float] = {}
        # Per driver, the records whose lease ran out (found by _due): the
        # candidates for deletion at that driver's next report (kubelet
        # v1.37.2 "phase 2"), so a report costs O(overdue), not O(devices).
        self._overdue: dict[str, set[models.DeviceKey]] = {}
        # (driver, endpoint) that reported since its stream last ended: their
        # expired records wait, Unknown, for the driver's next report; any
        # other record is deleted when its lease runs out.
        self._streaming: set[tuple[str, str]] = set()
        # Per driver and device, the receive time of the record last handed to
        # the sink (what a restart would load): a renewal is persisted only when
        # that record is within PERSIST_FRACTION of its lease from running out.
        # Keyed as _drivers is, so a renewal looks it up with the report's key.
        self._persisted: dict[str, dict[Key, float]] = {}
        self.refused: collections.Counter[str] = collections.Counter()
        """Driver -> new devices refused because the driver was at the cap."""

    # -- reading -----------------------------------------------------------

    def get(self, key: models.DeviceKey, now: float) -> models.DeviceHealth:
        """The record as a reader sees it at ``now`` (``Unknown`` if expired)."""
        record = self._drivers.get(key.driver, {}).get((key.pool, key.device))
        if record is None:
            return models.UNKNOWN_DEVICE
        if record.expired(now) and (record.health, record.message) != _UNKNOWN_VIEW:
            return _expired_copy(record)
        return record

    def records(self) -> Iterator[tuple[models.DeviceKey, models.DeviceHealth]]:
        """Every stored record, as stored (no expiry applied)."""
        for driver, devices in self._drivers.items():
            for (pool, device), record in devices.items():
                yield models.DeviceKey(driver, pool, device), record

    def __len__(self) -> int:
        return sum(len(devices) for devices in self._drivers.values())

    def drivers(self) -> list[str]:
        return sorted(self._drivers)

    # -- writing -----------------------------------------------------------

    def lease_for(self, timeout_seconds: int) -> float:
        """The lease a report asks for: its positive timeout, else the default."""
        return float(timeout_seconds) if timeout_seconds > 0 else self.default_lease

    def update(
        self,
        driver: str,
        reports: Sequence[models.DeviceReport],
        *,
        now: float,
        endpoint: str = "",
    ) -> list[models.DeviceKey]:
        """Apply one report; return the devices whose visible state changed.

        As :meth:`update_entries`, but a device named twice is applied twice,
        in report order, as the kubelet's loop does (the last wins; a change
        between the two counts). Streams never do that: ``streams.convert``
        keeps the last entry and counts a ``duplicate``.
        """
        items = [((r[0], r[1]), (r[2], r[3], r[4], r[5])) for r in reports]
        return self._update(driver, items, {key for key, _ in items}, now, endpoint)

    def update_entries(
        self, driver: str, entries: Entries, *, now: float, endpoint: str = ""
    ) -> list[models.DeviceKey]:
        """Apply one report, already keyed; return the devices whose visible state changed.

        The kubelet's ``updateHealthInfo`` (v1.37.2): leases that ran out by
        ``now`` are expired first (what our deadline timer would have done);
        then each reported device is stored, except a new one while the
        driver holds :data:`MAX_DEVICES_PER_DRIVER` records (refused,
        counted, one log line for the report); then this driver's records
        whose lease ran out and that the report does not carry are deleted.
        """
        return self._update(driver, entries.items(), entries, now, endpoint)

    def _update(
        self,
        driver: str,
        items: Iterable[tuple[Key, Entry]],
        reported: Container[Key],
        now: float,
        endpoint: str,
    ) -> list[models.DeviceKey]:
        changed = dict.fromkeys(self.expire(now))
        self._streaming.add((driver, endpoint))
        devices = self._drivers.setdefault(driver, {})
        refused = self._apply(driver, devices, items, now, endpoint, changed=changed)
        if refused:
            self.refused[driver] += refused
            logger.error(
                "health report of driver %s names more devices than the %d kept per driver; "
                "ignored %d new devices (known devices are still updated)",
                driver, MAX_DEVICES_PER_DRIVER, refused,
            )  # fmt: skip
        self._delete_overdue(driver, reported, now)
        return list(changed)

    def _apply(
        self,
        driver: str,
        devices: dict[Key, models.DeviceHealth],
        items: Iterable[tuple[Key, Entry]],
        now: float,
        endpoint: str,
        *,
        changed: dict[models.DeviceKey, None],
    ) -> int:
        """Store each reported device; return how many new ones the cap refused."""
        # The hot path of the pipeline (every device of every report), measured
        # to matter at 10^5 devices a second: the report arrives keyed as `devices`
        # is, records are built with tuple.__new__ (a named tuple's own __new__ is
        # a Python call), old records are unpacked once, and a plain renewal (the
        # common case: a driver resending what it said) builds no key at all: the
        # persist note is kept per driver under the same key, the heap lookup is
        # skipped while the deadline does not move earlier, and the (driver, pool,
        # device) tuple is made only for a device staged, changed or scheduled.
        staged: list[tuple[StagedKey, models.DeviceHealth]] = []
        stage = staged.append
        default, record_of, key_of = self.default_lease, models.DeviceHealth, models.DeviceKey
        new_record = tuple.__new__
        schedule = self._schedule
        # Without a sink nothing is persisted, so nothing counts as persisted.
        sink = self._sink
        persisted = self._persisted.setdefault(driver, {}) if sink is not None else {}
        renew_after = 1.0 - PERSIST_FRACTION
        unknown = models.HealthStatus.UNKNOWN
        expired_through = self._expired_through
        refused = 0
        for key, (health, message, timeout, driver_time) in items:
            old = devices.get(key)
            lease = float(timeout) if timeout > 0 else default
            if old is None:
                # The cap counts every record held, overdue ones included: the
                # kubelet deletes those only after storing the report.
                if len(devices) >= MAX_DEVICES_PER_DRIVER:
                    refused += 1
                    continue
                visible = persist = True
                moved = True
            else:
                old_health, old_message, old_lease, old_report, _, old_endpoint = old
                if old_lease != lease:
                    visible = True
                elif now - old_report > old_lease:  # expired: it read Unknown, ""
                    visible = health != unknown or message != ""
                else:
                    visible = health != old_health or message != old_message
                # A changed record at once; a renewal once the persisted copy
                # has less than PERSIST_FRACTION of its lease left.
                persist = (
                    visible
                    or health != old_health
                    or message != old_message
                    or endpoint != old_endpoint
                    or now - persisted.get(key, _NEVER) >= renew_after * lease
                )
                # A record not past its deadline holds a heap entry no later than
                # that deadline (expire() and _due drop an entry only once its
                # record's deadline passed): while the deadline does not move
                # earlier, the renewal needs no lookup and no entry (see _schedule).
                # "Past" is counted by expire()'s clock, not this report's: after the
                # wall clock stepped back, a device expire() took has no entry.
                old_deadline = old_report + old_lease
                moved = not now <= old_deadline <= now + lease or old_deadline <= expired_through
            new = new_record(record_of, (health, message, lease, now, driver_time, endpoint))
            devices[key] = new
            if not (moved or visible or persist):
                continue
            staged_key = (driver, *key)
            if moved:  # new, revived or shortened: rare, so the call is affordable here
                schedule(new_record(key_of, staged_key), now + lease)
            if visible:
                changed[new_record(key_of, staged_key)] = None
            if persist:
                stage((staged_key, new))
                persisted[key] = now
        if sink is not None and staged:
            sink.stage_many(staged)
        return refused

    def _delete_overdue(self, driver: str, reported: Container[Key], now: float) -> None:
        # Every overdue record was turned Unknown (and reported as changed) by
        # expire() at its deadline, so deleting it notifies nobody.
        overdue = self._overdue.pop(driver, None)
        if not overdue:
            return
        devices = self._drivers[driver]
        gone = []
        for key in overdue:
            record = devices.get(key[1:])
            if key[1:] in reported or record is None or not record.expired(now):
                continue  # renewed since: scheduled again
            del devices[key[1:]]
            self._forget(key)
            gone.append(key)
        if gone and self._sink is not None:
            self._sink.stage_delete(gone)

    def _schedule(self, key: models.DeviceKey, deadline: float) -> None:
        # At most one heap entry per device: a renewal that moves the deadline
        # later is picked up when the earlier entry pops (see _due), so a
        # driver resending every second does not grow the heap every second.
        scheduled = self._scheduled.get(key)
        if scheduled is None or deadline < scheduled:
            self._scheduled[key] = deadline
            heapq.heappush(self._heap, (deadline, key))

    def _due(self, now: float | None) -> tuple[float, models.DeviceKey] | None:
        """Settle the heap's top; return it if it is a live deadline (before ``now``)."""
        while self._heap:
            deadline, key = self._heap[0]
            if now is not None and deadline >= now:
                return None
            if self._scheduled.get(key) != deadline:
                heapq.heappop(self._heap)  # superseded by an earlier entry
                continue
            record = self._drivers.get(key.driver, {}).get(key[1:])
            if record is None:
                heapq.heappop(self._heap)
                del self._scheduled[key]
                continue
            if record.deadline > deadline:  # renewed since the entry was pushed
                if now is None:
                    # A lower bound is enough for a timer: moving every renewed
                    # entry here would walk the heap on every report.
                    return deadline, key
                heapq.heapreplace(self._heap, (record.deadline, key))
                self._scheduled[key] = record.deadline
                continue
            if now is not None and (record.health, record.message) == _UNKNOWN_VIEW:
                # Nothing to announce (already Unknown): only overdue now.
                heapq.heappop(self._heap)
                del self._scheduled[key]
                self._retire(key, record, None)
                continue
            return deadline, key
        return None

    def next_deadline(self) -> float | None:
        """When to call :meth:`expire` next, or ``None`` if no lease can run out.

        Never later than the earliest lease deadline. It may be earlier when
        that lease was renewed since: :meth:`expire` at that time then returns
        nothing and settles the entry, and the next call gives a later time.
        """
        top = self._due(None)
        return None if top is None else top[0]

    def expire(self, now: float) -> list[models.DeviceKey]:
        """Turn every lease that ran out by ``now`` into ``Unknown``.

        Returns the devices that changed, so the caller can update their pods
        at the deadline rather than lazily. A record whose endpoint streams
        stays until its driver's next report that does not carry it (see
        :meth:`update`); any other (its stream ended, or it was loaded and its
        endpoint has not reported since) is deleted now.
        """
        changed: list[models.DeviceKey] = []
        self._expired_through = max(self._expired_through, now)
        while (top := self._due(now)) is not None:
            _, key = top
            heapq.heappop(self._heap)
            del self._scheduled[key]
            self._retire(key, self._drivers[key.driver][key[1:]], _expired_copy)
            changed.append(key)
        return changed

    def end_endpoint(self, driver: str, endpoint: str, now: float) -> list[models.DeviceKey]:
        """A stream ended: its devices keep their state until their leases run out.

        Nothing visible changes: each device reads what it read, until its
        lease runs out (then :meth:`expire` turns it ``Unknown`` and deletes
        it) or an endpoint of the driver reports it (which takes it over and
        renews it). Only the endpoint's records whose lease already ran out go
        now, as they would at that deadline; returns those not announced as
        ``Unknown`` yet (the deadline task had not run), to notify their pods.
        """
        self._streaming.discard((driver, endpoint))
        return self._delete_where(driver, lambda r: r.endpoint == endpoint and r.expired(now))

    def clear_driver(self, driver: str) -> list[models.DeviceKey]:
        """Delete every device of ``driver`` (the kubelet's clearDriver)."""
        return self._delete_where(driver, lambda _: True)

    def load(self, records: Iterable[tuple[models.DeviceKey, models.DeviceHealth]]) -> None:
        """Restore records read back from the store (no sink writes)."""
        drivers, scheduled, heap = self._drivers, self._scheduled, self._heap
        persisted = self._persisted
        for key, record in records:
            device = (key.pool, key.device)
            drivers.setdefault(key.driver, {})[device] = record
            persisted.setdefault(key.driver, {})[device] = record.last_report  # on disk
            # Unknown records too: once their lease ran out they are overdue.
            # As _schedule, with one heapify at the end instead of a push each.
            deadline = record.last_report + record.lease
            current = scheduled.get(key)
            if current is None or deadline < current:
                scheduled[key] = deadline
                heap.append((deadline, key))
        heapq.heapify(heap)

    def attach(self, sink: Sink) -> None:
        """Persist every later change to ``sink`` (a store opened after the cache was built).

        The cache a caller holds stays the live one: the manager builds it
        before its state file is open and attaches the file once it is.
        """
        self._sink = sink

    # -- internals ---------------------------------------------------------

    def _delete_where(self, driver: str, owned: _Predicate) -> list[models.DeviceKey]:
        # Like the kubelet's clearDriver the records go (so they no longer
        # count towards the cap, and a device reported again is new). A record
        # that expired but was not expired yet (stored view not Unknown) is
        # announced too: its heap entry dies with it.
        devices = self._drivers.get(driver, {})
        changed: list[models.DeviceKey] = []
        gone: list[models.DeviceKey] = []
        for (pool, device), record in list(devices.items()):
            if not owned(record):
                continue
            key = models.DeviceKey(driver, pool, device)
            del devices[pool, device]
            self._overdue.get(driver, set()).discard(key)
            self._forget(key)
            gone.append(key)
            if (record.health, record.message) != _UNKNOWN_VIEW:
                changed.append(key)
        if not devices:
            self._drivers.pop(driver, None)
        if gone and self._sink is not None:
            self._sink.stage_delete(gone)
        return changed

    def _retire(
        self,
        key: models.DeviceKey,
        record: models.DeviceHealth,
        expired: Callable[[models.DeviceHealth], models.DeviceHealth] | None,
    ) -> None:
        """A lease ran out: keep the record (``expired``, overdue) while its endpoint streams."""
        if (key.driver, record.endpoint) in self._streaming:
            if expired is not None:
                self._set(key.driver, key.pool, key.device, expired(record))
            self._overdue.setdefault(key.driver, set()).add(key)
            return
        devices = self._drivers[key.driver]
        del devices[key[1:]]
        self._forget(key)  # else every device ever seen stays noted
        if not devices:
            del self._drivers[key.driver]
        if self._sink is not None:
            self._sink.stage_delete([key])

    def _set(self, driver: str, pool: str, device: str, record: models.DeviceHealth) -> None:
        self._drivers.setdefault(driver, {})[(pool, device)] = record
        if self._sink is not None:
            key = models.DeviceKey(driver, pool, device)
            self._sink.stage(key, record)
            self._persisted.setdefault(driver, {})[(pool, device)] = record.last_report

    def _forget(self, key: models.DeviceKey) -> None:
        """Drop a deleted device's persist note (and its driver's, once empty)."""
        notes = self._persisted.get(key.driver)
        if notes is not None:
            notes.pop(key[1:], None)
            if not notes:
                del self._persisted[key.driver]


class _Predicate(Protocol):
    def __call__(self, record: models.DeviceHealth, /) -> bool: ...


_UNKNOWN_VIEW = (models.HealthStatus.UNKNOWN, "")


def _expired_copy(record: models.DeviceHealth) -> models.DeviceHealth:
    # Unknown, message cleared. Unlike the kubelet (LastUpdated = now, but it
    # deletes the entry right after) the receive time is kept: the lease
    # stays run out, so the driver's next report without the device deletes
    # it, as the kubelet's would; and ``cache show`` gives the real age.
    return models.DeviceHealth(
        health=models.HealthStatus.UNKNOWN,
        message="",
        lease=record.lease,
        last_report=record.last_report,
        driver_time=record.driver_time,
        endpoint=record.endpoint,
    )
