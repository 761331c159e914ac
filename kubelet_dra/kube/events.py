"""Kubernetes Events for device-health transitions, rate-limited and aggregated.

Part of ``kube``. Mirrors what client-go's ``EventCorrelator`` gives the kubelet's recorder:
repeats of one event series (same object, same reason) within ``interval`` become one Event
whose ``count`` and ``lastTimestamp`` are updated, the latest message winning. Events are
best effort: a failed send is retried at the next flush only if the failure was transient.
:meth:`EventRecorder.flush` takes the send functions, so the status writer's loop and token
bucket drive it; :func:`health_transitions` says which changes are worth an Event.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any

from kubelet_dra import clock as clock_mod
from kubelet_dra import models
from kubelet_dra.kube import api as kube_api
from kubelet_dra.status import podjson, podstatus
from kubelet_dra.status.podjson import Obj

logger = logging.getLogger(__name__)

COMPONENT = "kubelet-dra-health"
DEVICE_UNHEALTHY = "DeviceUnhealthy"
DEVICE_HEALTHY = "DeviceHealthy"
DEVICE_HEALTH_UNKNOWN = "DeviceHealthUnknown"
_REASON = {
    models.HealthStatus.UNHEALTHY: (DEVICE_UNHEALTHY, "Warning"),
    models.HealthStatus.HEALTHY: (DEVICE_HEALTHY, "Normal"),
    models.HealthStatus.UNKNOWN: (DEVICE_HEALTH_UNKNOWN, "Warning"),
}
Create = Callable[[str, dict[str, Any]], Awaitable[Obj]]
Patch = Callable[[str, str, dict[str, Any]], Awaitable[Obj]]


@dataclasses.dataclass(slots=True)
class _Series:
    involved: Obj
    reason: str
    kind: str  # Normal or Warning
    message: str
    first: float
    count: int = 0  # occurrences recorded
    sent_count: int = 0  # what the API object says
    name: str = ""  # the Event object, once created
    last_sent: float | None = None


class EventRecorder:
    """Collects event occurrences; :meth:`flush` sends what is due."""

    def __init__(
        self,
        *,
        node: str,
        clock: clock_mod.Clock,
        interval: float = 60.0,
        max_series: int = 10_000,
    ) -> None:
        self.node = node
        self.interval = interval
        self._clock = clock
        self._max = max_series
        self._series: collections.OrderedDict[tuple[str, str], _Series] = collections.OrderedDict()
        self.sent = 0  # API requests made (creates + updates)
        self.recorded = 0  # occurrences recorded

    def record(self, involved: Obj, reason: str, message: str, *, kind: str = "Warning") -> None:
        """One occurrence; sent now or folded into the series' next update."""
        key = (str(involved.get("uid") or involved.get("name")), reason)
        series = self._series.get(key)
        if series is None:
            series = _Series(involved, reason, kind, message, self._clock.now())
            self._series[key] = series
            self._evict()
        series.count += 1
        series.message = message
        self._series.move_to_end(key)
        self.recorded += 1

    def pending(self) -> int:
        """How many series have occurrences not sent yet."""
        return sum(1 for s in self._series.values() if s.count > s.sent_count)

    def next_due(self) -> float | None:
        """When the earliest unsent occurrence may be sent, or ``None``."""
        due = [
            s.last_sent + self.interval if s.last_sent is not None else s.first
            for s in self._series.values()
            if s.count > s.sent_count
        ]
        return min(due, default=None)

    async def flush(self, create: Create, patch: Patch) -> None:
        """Send every series with unsent occurrences whose interval has passed."""
        now = self._clock.now()
        for series in list(self._series.values()):
            if series.count == series.sent_count:
                continue
            if series.last_sent is not None and now - series.last_sent < self.interval:
                continue
            await self._send(series, now, create, patch)

    async def _send(self, series: _Series, now: float, create: Create, patch: Patch) -> None:
        namespace = _namespace(series.involved)
        try:
            if series.name:
                await patch(namespace, series.name, self._update_body(series, now))
            else:
                await self._create(series, namespace, now, create, patch)
        except Exception as exc:
            transient = kube_api.is_transient(exc)
            logger.log(
                logging.DEBUG if transient else logging.WARNING,
                "Event %s for %s not sent: %s", series.reason, _describe(series.involved), exc,
            )  # fmt: skip
            if not transient:
                series.sent_count = series.count  # give this occurrence up
            # Either way, wait an interval before the next attempt: a down API
            # server must not turn pending events into a request loop.
            series.last_sent = now
            return
        self.sent += 1
        series.sent_count = series.count
        series.last_sent = now

    async def _create(
        self, series: _Series, namespace: str, now: float, create: Create, patch: Patch
    ) -> None:
        body = self._create_body(series, now)
        name = body["metadata"]["name"]
        try:
            await create(namespace, body)
        except Exception as exc:
            # The name is derived from the series, so "already exists" means an
            # earlier create landed (its answer was lost, or two flushes raced):
            # the series is created; update it instead of giving up.
            if getattr(exc, "status", None) != 409:
                raise
            await patch(namespace, name, self._update_body(series, now))
        series.name = name

    def _create_body(self, series: _Series, now: float) -> dict[str, Any]:
        stamp = podstatus.rfc3339(now)
        digest = hashlib.sha256(
            f"{series.involved.get('uid')}/{series.reason}/{series.first}".encode()
        ).hexdigest()[:16]
        return {
            "metadata": {
                "name": f"{series.involved.get('name')}.{digest}",
                "namespace": _namespace(series.involved),
            },
            "involvedObject": series.involved,
            "reason": series.reason,
            "message": series.message,
            "type": series.kind,
            "count": series.count,
            "firstTimestamp": podstatus.rfc3339(series.first),
            "lastTimestamp": stamp,
            "source": {"component": COMPONENT, "host": self.node},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.node,
        }

    def _update_body(self, series: _Series, now: float) -> dict[str, Any]:
        return {
            "count": series.count,
            "message": series.message,
            "lastTimestamp": podstatus.rfc3339(now),
        }

    def _evict(self) -> None:
        while len(self._series) > self._max:
            self._series.popitem(last=False)


def health_transitions(
    devices: Iterable[podstatus.DeviceState],
    seen: dict[models.DeviceKey, models.HealthStatus],
    known: set[models.DeviceKey],
) -> Iterator[tuple[str, str, str]]:
    """The Events one pod's devices are worth now, as (reason, type, message).

    ``seen`` (health at the last look) and ``known`` (devices once Healthy or
    Unhealthy) are the pod's memory and are updated. Until a device was once
    Healthy or Unhealthy (a fresh pod, a sidecar restart), Unknown and then
    Healthy are not news; Unhealthy always is.
    """
    for device in devices:
        before = seen.get(device.key)
        seen[device.key] = device.health
        first_and_boring = (
            device.key not in known and device.health is not models.HealthStatus.UNHEALTHY
        )
        if device.health is not models.HealthStatus.UNKNOWN:
            known.add(device.key)
        if before == device.health or first_and_boring:
            continue
        reason, kind = _REASON[device.health]
        name = podstatus.device_name(device)
        message = f"Device {name} (claim {device.claim_ref}) is {device.health}"
        yield reason, kind, message + (f": {device.message}" if device.message else "")


def pod_ref(pod: Obj) -> dict[str, Any]:
    """The ``involvedObject`` of an Event about ``pod``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": podjson.metadata(pod).get("name"),
        "namespace": podjson.namespace(pod),
        "uid": podjson.metadata(pod).get("uid"),
    }


def node_ref(node: str) -> dict[str, Any]:
    """The ``involvedObject`` of an Event about the node (such events live in ``default``)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "name": node,
        "namespace": podjson.DEFAULT_NAMESPACE,
        "uid": node,
    }


def _namespace(involved: Obj) -> str:
    """Where the Event goes: the involved object's namespace (``default`` for a node)."""
    return str(involved.get("namespace") or podjson.DEFAULT_NAMESPACE)


def _describe(involved: Obj) -> str:
    return f"{involved.get('kind')} {involved.get('namespace')}/{involved.get('name')}"
