"""Typed values passed between the pipeline's stages.

Each stage hands the next a small immutable value, never a protobuf message or a
``kubernetes`` client object (kubelet counterpart: ``pkg/kubelet/cm/dra/state``). The
hot-path values (:class:`DeviceKey`, :class:`DeviceReport`, :class:`DeviceHealth`) are named
tuples rather than pydantic models or frozen dataclasses: a busy driver sends hundreds of
thousands of device updates a second, and a named tuple costs a third of a frozen
dataclass's ``__init__``. Pydantic validates values where they cross a trust boundary
instead: settings, and records read back from disk (``store.StoredDevice``).
"""

from __future__ import annotations

import enum
from typing import NamedTuple, Protocol


class HealthStatus(enum.StrEnum):
    """A device's health, spelled as the pod status API spells it."""

    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"
    UNKNOWN = "Unknown"


class DeviceKey(NamedTuple):
    """A device as the health cache and the claim index name it."""

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        # The kubelet's resourceID when the driver returned no CDI device ID.
        return f"{self.driver}/{self.pool}/{self.device}"


class DeviceReport(NamedTuple):
    """One device from one health report, converted from the wire.

    ``timeout_seconds`` is the raw ``health_check_timeout_seconds``; zero or
    negative means "use the node default" (the cache resolves it).
    ``message`` is already truncated to the API's 1024-byte limit.
    """

    pool: str
    device: str
    health: HealthStatus
    message: str = ""
    timeout_seconds: int = 0
    driver_time: int = 0


class DeviceHealth(NamedTuple):
    """What the cache believes about one device.

    ``last_report`` is when *we* received the last report (the lease starts
    there, as in the kubelet); ``driver_time`` is the driver's own
    ``last_updated_time``, kept for display only. ``endpoint`` is the driver
    socket that reported it, so one endpoint's end does not wipe another's
    devices during a rolling upgrade.
    """

    health: HealthStatus
    message: str
    lease: float
    last_report: float
    driver_time: int = 0
    endpoint: str = ""

    @property
    def deadline(self) -> float:
        """When the lease runs out and the device becomes ``Unknown``."""
        return self.last_report + self.lease

    def expired(self, now: float) -> bool:
        # Strictly greater, as the kubelet's getHealthInfo.
        return now - self.last_report > self.lease

    def visible(self, now: float) -> tuple[HealthStatus, str]:
        """Health and message as a reader sees them at ``now``."""
        if self.expired(now):
            return HealthStatus.UNKNOWN, ""
        return self.health, self.message


UNKNOWN_DEVICE = DeviceHealth(HealthStatus.UNKNOWN, "", 0.0, 0.0)
"""What a device nobody reported reads as."""


class HealthOf(Protocol):
    """A device's stored record, read at ``now`` (``healthinfo.HealthCache.get``).

    The one signature for "look a device's health up": the status writer, the
    node-agent pod source and the taint bridge are each given one. The pod status
    functions take it bound to their ``now`` (:data:`kubelet_dra.status.podstatus.BoundHealthOf`).
    """

    def __call__(self, key: DeviceKey, now: float, /) -> DeviceHealth: ...
