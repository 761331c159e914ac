"""The device health cache: leases, changed-device sets and deadlines.

Counterpart of the kubelet's ``pkg/kubelet/cm/dra/healthinfo.go``
(``healthInfoCache``), with the same visible semantics:

- a report replaces a device's record and restarts its lease at receive time
  (the driver's ``last_updated_time`` is kept for display, never trusted);
- the lease is the device's positive ``health_check_timeout_seconds``, else the
  node default (30 s);
- an update returns the devices whose visible state (health, message, lease)
  changed; an identical report changes nothing.

Where the kubelet has known bugs this cache does better:

- expiry is eager: :meth:`HealthCache.next_deadline` and
  :meth:`HealthCache.expire` let the caller act at the deadline (kubelet
  #140819 only notices on the next report or status rebuild);
- records remember the endpoint that reported them, so the end of one
  endpoint's stream turns only *its* devices ``Unknown`` (kubelet #140818
  clears the whole driver) and the caller gets them back to notify pods
  (the kubelet's ``clearDriver`` notifies nobody);
- changes are computed against what a reader saw, so a report that revives an
  expired device is a change even if the stale record said the same thing.

The module is pure: ``now`` is always an argument and persistence is a
:class:`Sink` the caller provides (``store.HealthStore``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Protocol

from kubelet_dra import models

DEFAULT_HEALTH_TIMEOUT = 30.0
"""The kubelet's ``DefaultHealthTimeout``."""

MESSAGE_MAX_BYTES = 1024
"""``v1.ResourceHealthMessageMaxLength``: the API limit, in bytes."""

_ELLIPSIS = "..."

Key = tuple[str, str]  # (pool, device) inside one driver


class Sink(Protocol):
    """Where the cache hands records to be persisted (see ``store``)."""

    def stage(self, key: models.DeviceKey, record: models.DeviceHealth) -> None: ...


def truncate_message(message: str) -> str:
    """Cut a message to the API's byte limit the way the kubelet does.

    The kubelet keeps the first 1021 bytes and appends ``...``; Go slices
    bytes and may split a UTF-8 character, which the API server then rejects.
    We drop the partial character instead.
    """
    raw = message.encode("utf-8")
    if len(raw) <= MESSAGE_MAX_BYTES:
        return message
    head = raw[: MESSAGE_MAX_BYTES - len(_ELLIPSIS)].decode("utf-8", errors="ignore")
    return head + _ELLIPSIS


class HealthCache:
    """Health of every device of every driver, with eager lease expiry."""

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
        # Lazy-deletion heap of (deadline, driver, pool, device); an entry is
        # stale when the record's deadline moved or it is already Unknown.
        self._heap: list[tuple[float, str, str, str]] = []

    # -- reading -----------------------------------------------------------

    def get(self, key: models.DeviceKey, now: float) -> models.DeviceHealth:
        """The record as a reader sees it at ``now`` (``Unknown`` if expired)."""
        record = self._drivers.get(key.driver, {}).get((key.pool, key.device))
        if record is None:
            return models.UNKNOWN_DEVICE
        if record.expired(now) and (record.health, record.message) != _UNKNOWN_VIEW:
            return _expired_copy(record, now)
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

        Devices missing from the report keep their record until their own
        lease runs out (the reference's subset semantics); leases that ran out
        by ``now`` are expired here too, as the kubelet does on every report.
        Within one report a device named twice counts once, the last wins.
        """
        devices = self._drivers.setdefault(driver, {})
        changed: dict[models.DeviceKey, None] = {}
        for report in reports:
            key = (report.pool, report.device)
            new = models.DeviceHealth(
                health=report.health,
                message=report.message,
                lease=self.lease_for(report.timeout_seconds),
                last_report=now,
                driver_time=report.driver_time,
                endpoint=endpoint,
            )
            old = devices.get(key)
            devices[key] = new
            heapq.heappush(self._heap, (new.deadline, driver, report.pool, report.device))
            device_key = models.DeviceKey(driver, report.pool, report.device)
            if old is None or _view(old, now) != _view(new, now):
                changed[device_key] = None
            if self._sink is not None:
                self._sink.stage(device_key, new)
        for expired in self.expire(now):
            changed[expired] = None
        return list(changed)

    def next_deadline(self) -> float | None:
        """The earliest time a lease runs out, or ``None`` if none can."""
        while self._heap:
            deadline, driver, pool, device = self._heap[0]
            record = self._drivers.get(driver, {}).get((pool, device))
            if record is not None and _is_live_entry(record, deadline):
                return deadline
            heapq.heappop(self._heap)
        return None

    def expire(self, now: float) -> list[models.DeviceKey]:
        """Turn every lease that ran out by ``now`` into ``Unknown``.

        Returns the devices that changed, so the caller can update their pods
        at the deadline rather than lazily.
        """
        changed: list[models.DeviceKey] = []
        while self._heap and self._heap[0][0] < now:
            deadline, driver, pool, device = heapq.heappop(self._heap)
            devices = self._drivers.get(driver, {})
            record = devices.get((pool, device))
            if record is None or not _is_live_entry(record, deadline):
                continue
            self._set(driver, pool, device, _expired_copy(record, now))
            changed.append(models.DeviceKey(driver, pool, device))
        return changed

    def end_endpoint(self, driver: str, endpoint: str, now: float) -> list[models.DeviceKey]:
        """A stream ended: its devices turn ``Unknown`` unless another endpoint owns them.

        Devices last reported by a different endpoint of the same driver (the
        new pod of a rolling upgrade) keep their health.
        """
        return self._unknown_where(driver, now, lambda r: r.endpoint == endpoint)

    def clear_driver(self, driver: str, now: float) -> list[models.DeviceKey]:
        """Every device of ``driver`` turns ``Unknown`` (the kubelet's clearDriver)."""
        return self._unknown_where(driver, now, lambda r: True)

    def load(self, records: Iterable[tuple[models.DeviceKey, models.DeviceHealth]]) -> None:
        """Restore records read back from the store (no sink writes)."""
        for key, record in records:
            self._drivers.setdefault(key.driver, {})[(key.pool, key.device)] = record
            if (record.health, record.message) != _UNKNOWN_VIEW:
                heapq.heappush(self._heap, (record.deadline, key.driver, key.pool, key.device))

    def snapshot(self, now: float) -> Mapping[models.DeviceKey, models.DeviceHealth]:
        """Every device as a reader sees it at ``now``."""
        return {key: self.get(key, now) for key, _ in self.records()}

    # -- internals ---------------------------------------------------------

    def _unknown_where(self, driver: str, now: float, owned: _Predicate) -> list[models.DeviceKey]:
        changed: list[models.DeviceKey] = []
        for (pool, device), record in list(self._drivers.get(driver, {}).items()):
            if not owned(record) or record.visible(now) == _UNKNOWN_VIEW:
                continue
            self._set(driver, pool, device, _expired_copy(record, now))
            changed.append(models.DeviceKey(driver, pool, device))
        return changed

    def _set(self, driver: str, pool: str, device: str, record: models.DeviceHealth) -> None:
        self._drivers.setdefault(driver, {})[(pool, device)] = record
        if self._sink is not None:
            self._sink.stage(models.DeviceKey(driver, pool, device), record)


class _Predicate(Protocol):
    def __call__(self, record: models.DeviceHealth, /) -> bool: ...


_UNKNOWN_VIEW = (models.HealthStatus.UNKNOWN, "")


def _view(record: models.DeviceHealth, now: float) -> tuple[models.HealthStatus, str, float]:
    health, message = record.visible(now)
    return health, message, record.lease


def _is_live_entry(record: models.DeviceHealth, deadline: float) -> bool:
    return record.deadline == deadline and (record.health, record.message) != _UNKNOWN_VIEW


def _expired_copy(record: models.DeviceHealth, now: float) -> models.DeviceHealth:
    # Like the kubelet: Unknown, message cleared, LastUpdated = now. The
    # endpoint is kept so a later end of that stream is a no-op.
    return models.DeviceHealth(
        health=models.HealthStatus.UNKNOWN,
        message="",
        lease=record.lease,
        last_report=now,
        driver_time=record.driver_time,
        endpoint=record.endpoint,
    )
