"""A pod's ``allocatedResourcesStatus`` and device-health condition, pure.

Counterpart of the kubelet's ``UpdateAllocatedResourcesStatus`` in
``pkg/kubelet/cm/dra/manager.go``. :func:`desired_status` turns a pod, a claim index and
device health into a :class:`Desired` value (its docstring has the kubelet's rules);
:func:`merge` applies it to whatever status the API holds now and says whether anything
changed, so the writer can re-apply after a conflict. :func:`build_condition` is the pod
condition. :func:`update_allocated_resources_status` composes both as the kubelet's function
behaves; ``kube.patchplan`` calls :func:`merged_entries` and :func:`merged_condition`, the
two steps of :func:`merge`, so a status is compared once.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kubelet_dra import models
from kubelet_dra.state import healthinfo
from kubelet_dra.status import claims, podjson
from kubelet_dra.status.podjson import Obj

logger = logging.getLogger(__name__)

BoundHealthOf = Callable[[models.DeviceKey], models.DeviceHealth]
"""A :class:`models.HealthOf` bound to the computation's ``now`` (``lambda key: get(key, now)``)."""
REASON_HEALTHY = "AllDevicesHealthy"
REASON_UNHEALTHY = "DeviceUnhealthy"
REASON_UNKNOWN = "DeviceHealthUnknown"
CONDITION_MESSAGE_MAX = healthinfo.MESSAGE_MAX_BYTES
"""Our cap on the condition's message, in UTF-8 bytes: that of one device's message.

The API has none (``validatePodConditions`` checks only the type and
``observedGeneration``, v1.37.2 and v1.38.0-beta.0); the cap keeps a pod with
many failed devices from growing by kilobytes at every write."""
UNHEALTHY_TITLE = "Unhealthy devices: "
UNKNOWN_TITLE = "Health unknown for devices: "
_ORDER = (models.HealthStatus.UNHEALTHY, models.HealthStatus.UNKNOWN)
_STATUS_OF = {
    models.HealthStatus.HEALTHY: "True",
    models.HealthStatus.UNHEALTHY: "False",
    models.HealthStatus.UNKNOWN: "Unknown",
}


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceState:
    """One device of a pod as a reader sees it at ``now``."""

    key: models.DeviceKey
    resource_id: str
    claim_ref: str
    health: models.HealthStatus
    message: str
    kubelet_id: str = ""  # the kubelet's resourceID; "" means resource_id

    @property
    def name(self) -> str:
        """How messages name the device: ``<driver>/<pool>/<device> (as <kubelet's ID>)``."""
        return claims.device_name(self.key, self.kubelet_id or self.resource_id, self.resource_id)


@dataclasses.dataclass(frozen=True, slots=True)
class Desired:
    """What we want in one pod's status.

    ``containers`` maps (status field, container name) to the entries we
    manage for it: name -> ``ResourceStatus`` dict, or ``None`` for a name
    whose entry must go (its claim sees no device). ``condition`` is ``None``
    when disabled or when the pod has no devices.
    """

    pod_uid: str
    containers: Mapping[tuple[str, str], Mapping[str, dict[str, Any] | None]]
    condition: dict[str, Any] | None
    devices: tuple[DeviceState, ...]


def to_resource_health_status(value: str) -> models.HealthStatus:
    """The kubelet's ``toResourceHealthStatus``: anything unexpected is Unknown."""
    try:
        return models.HealthStatus(value)
    except ValueError:
        return models.HealthStatus.UNKNOWN


def resource_health(
    device: claims.PreparedDevice,
    health: models.HealthStatus | str,
    message: str,
    *,
    with_message: bool = True,
) -> dict[str, Any]:
    """The kubelet's ``buildResourceHealth``: one ``ResourceHealth`` dict."""
    if isinstance(health, models.HealthStatus):
        value = health.value  # already one of the API's values
    else:
        value = to_resource_health_status(str(health)).value
    entry: dict[str, Any] = {"resourceID": device.resource_id, "health": value}
    if with_message and message:
        entry["message"] = message
    return entry


def status_name(ref: str, request: str) -> str:
    """``claim:<ref>`` or ``claim:<ref>/<request>``."""
    return f"claim:{ref}/{request}" if request else f"claim:{ref}"


def desired_status(
    pod: Obj,
    *,
    index: claims.DeviceLookup,
    health_of: BoundHealthOf,
    now: float,
    condition_type: str = "",
    with_message: bool = True,
    sidecars: bool = True,
) -> Desired:
    """What ``pod``'s status should say about its devices at ``now``.

    For every container status whose container has ``resources.claims`` (containers without
    claims are left exactly as they are), each claim entry becomes one ``ResourceStatus``:

    - ``name`` is ``claim:<ref>`` or ``claim:<ref>/<request>``, where ``<ref>`` is the
      *pod-level* claim reference name, not the ResourceClaim object's name;
    - its ``resources`` are rebuilt from scratch: one ``ResourceHealth`` per device the claim
      entry sees (the request filter of ``claims``), with ``resourceID`` the device's first CDI
      device ID, else ``<driver>/<pool>/<device>``, except that devices of one claim sharing
      their first CDI ID each get an ID of their own where the kubelet would show one of them
      (``claims.own_resource_ids``); ``health`` ``Healthy``, ``Unhealthy`` or ``Unknown``;
      ``message`` only when non-empty; duplicates by ``resourceID`` dropped;
    - an entry left with no resources is removed; entries of unresolved claims and entries we
      do not produce (device plugins) are kept untouched;
    - the list is sorted as the kubelet v1.38 sorts it: each entry's ``resources`` by
      ``resourceID``, the entries by ``name``, byte order of the UTF-8 text (Go's
      ``cmp.Compare`` on strings). Older kubelets keep insertion order, which the API does not
      define (both lists are ``listType=map``), so the sorted order is right beside them too.
      Every container status we manage is sorted whole, device-plugin entries included, as the
      kubelet does; an order-only difference is no reason to write (see :func:`merge`).

    Restartable init containers (sidecars) get the same treatment in ``initContainerStatuses``,
    which the kubelet misses (kubernetes #139940).
    """
    uid = podjson.uid(pod)
    view = _Viewer(health_of, now)
    containers: dict[tuple[str, str], dict[str, dict[str, Any] | None]] = {}
    for cc in claims.container_claims(pod, sidecars=sidecars):
        devices = _claim_devices(pod, index, cc.ref)
        if devices is None:
            continue  # the kubelet skips unresolved or unknown claims: entry untouched
        entry = _resource_status(cc, devices, view, with_message=with_message)
        containers.setdefault((cc.field, cc.container), {})[entry["name"]] = (
            entry if entry["resources"] else None
        )
    states = pod_device_states(pod, index=index, view=view)
    condition = build_condition(condition_type, states) if condition_type else None
    return Desired(uid, containers, condition, states)


def pod_device_states(
    pod: Obj, *, index: claims.DeviceLookup, view: _Viewer
) -> tuple[DeviceState, ...]:
    """Every device of every claim the pod references, once, in a stable order."""
    seen: dict[models.DeviceKey, DeviceState] = {}
    for ref in sorted(str(r.get("name", "")) for r in podjson.resource_claims(pod)):
        for device in _claim_devices(pod, index, ref) or ():
            if device.key not in seen:
                health, message = view(device.key)
                seen[device.key] = DeviceState(
                    device.key, device.resource_id, ref, health, message, device.kubelet_id
                )
    return tuple(seen.values())


def build_condition(condition_type: str, states: Sequence[DeviceState]) -> dict[str, Any] | None:
    """The condition for these devices, without ``lastTransitionTime`` (see :func:`merge`).

    The condition (type from ``Settings.pod_condition_type``; ``""`` disables it) summarises
    every device of the pod's claims: ``True`` when all are Healthy, ``False`` (reason
    ``DeviceUnhealthy``) when any is Unhealthy, ``Unknown`` otherwise. The message carries each
    non-Healthy device's health (by section), name (:func:`device_name`) and message, so the
    health stays visible where ``allocatedResourcesStatus`` cannot (a kubelet with its
    ``ResourceHealthStatus`` gate off removes the field and keeps our condition). The API sets
    no limit on a pod condition's message; ours is :data:`CONDITION_MESSAGE_MAX` bytes, and past
    it the devices that do not fit are left out, last first, with a count of them by health.
    ``lastTransitionTime`` moves only when the condition's status changes.

    A Job can act on it with ``podFailurePolicy``: a rule with ``onPodConditions: [{type:
    DeviceHealthy, status: "False"}]`` and action ``FailJob``, ``Ignore`` or ``Count`` matches a
    failed pod that carries the condition. The Job controller looks at the pod when it is
    terminal, so the condition must be there by then: the writer writes it as soon as a device
    turns Unhealthy, and keeps a terminated pod's devices long enough to write its post-mortem
    status.
    """
    if not states:
        return None
    unhealthy = [s for s in states if s.health is models.HealthStatus.UNHEALTHY]
    unknown = [s for s in states if s.health is models.HealthStatus.UNKNOWN]
    if unhealthy:
        status, reason = "False", REASON_UNHEALTHY
    elif unknown:
        status, reason = "Unknown", REASON_UNKNOWN
    else:
        status, reason = "True", REASON_HEALTHY
    message = (
        condition_message(unhealthy + unknown)
        if unhealthy or unknown
        else f"All {len(states)} devices are healthy"
    )
    return {"type": condition_type, "status": status, "reason": reason, "message": message}


def device_name(state: DeviceState) -> str:
    """How the condition and Events name a device.

    The one place a device is named for readers, so that naming it
    differently (the kubelet's resourceID beside it) is one change:
    ``<driver>/<pool>/<device>``, with ``(as <kubelet's ID>)`` where it differs
    (``claims.device_name``).
    """
    return state.name


def condition_message(devices: Sequence[DeviceState], limit: int = CONDITION_MESSAGE_MAX) -> str:
    """The non-Healthy ``devices`` (Unhealthy first) described in at most ``limit`` bytes.

    Every device that fits is listed, in the given order, with its health (by
    section), name, claim and message. Past ``limit`` the last devices are left
    out and counted by health (``... (and 3 more devices: 2 Unhealthy, 1
    Unknown)``); when not even the first one fits, its text is cut to fit and
    ends in ``...``. The same devices always give the same message.
    """
    texts = [_device_text(d) for d in devices]

    def fits(kept: int) -> bool:
        return len(_render(devices, texts, kept).encode()) <= limit

    if fits(len(devices)):
        return _render(devices, texts, len(devices))
    low, high = 1, len(devices) - 1  # the most devices that fit: fits() is monotonic
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    if fits(low):
        return _render(devices, texts, low)
    over = len(_render(devices, texts, 1).encode()) - limit
    texts[0] = _cut(texts[0], len(texts[0].encode()) - over)
    return _render(devices, texts, 1)


def _device_text(state: DeviceState) -> str:
    part = f"{device_name(state)} (claim {state.claim_ref})"
    return f"{part}: {state.message}" if state.message else part


def _render(devices: Sequence[DeviceState], texts: Sequence[str], kept: int) -> str:
    sections = []
    for health, title in (
        (models.HealthStatus.UNHEALTHY, UNHEALTHY_TITLE),
        (models.HealthStatus.UNKNOWN, UNKNOWN_TITLE),
    ):
        listed = [t for d, t in zip(devices[:kept], texts, strict=False) if d.health is health]
        if listed:
            sections.append(title + "; ".join(listed))
    message = ". ".join(sections)
    left = devices[kept:]
    if left:
        counts = collections.Counter(d.health.value for d in left)
        by_health = ", ".join(f"{counts[h.value]} {h.value}" for h in _ORDER if counts[h.value])
        noun = "device" if len(left) == 1 else "devices"
        message += f" (and {len(left)} more {noun}: {by_health})"
    return message


def _cut(text: str, size: int) -> str:
    """``text`` in at most ``size`` UTF-8 bytes, ending in ``...`` when cut."""
    raw = text.encode()
    if len(raw) <= size:
        return text
    return raw[: max(0, size - 3)].decode("utf-8", errors="ignore") + "..."


def merge(
    status: Obj | None,
    desired: Desired,
    *,
    now: float,
    container_status: bool = True,
    condition: bool = True,
) -> tuple[dict[str, Any], bool]:
    """Apply ``desired`` to a copy of ``status``; return it and whether it changed.

    Everything we do not own is preserved: other containers' fields, entries
    of claims we could not resolve, device-plugin entries, other conditions.
    Order-only differences do not count as a change (both lists are
    ``listType=map`` in the API). ``status`` is never modified; the result
    shares the parts that did not change with it (copy on write: a deep copy
    of a whole pod status was most of the writer's time per pod).
    """
    new: dict[str, Any] = dict(status or {})
    changed = False
    if container_status:
        changed |= _merge_containers(new, desired.containers)
    if condition and desired.condition is not None:
        changed |= _merge_condition(new, desired.condition, now)
    return new, changed


def update_allocated_resources_status(
    pod: Obj,
    status: Obj | None,
    *,
    index: claims.DeviceLookup,
    health_of: BoundHealthOf,
    now: float,
    with_message: bool = True,
    sidecars: bool = True,
) -> dict[str, Any]:
    """The kubelet's ``UpdateAllocatedResourcesStatus`` on plain dicts (no condition).

    As in kubelet v1.38, the entries of every container status it manages
    come out sorted even when nothing else changed.
    """
    desired = desired_status(
        pod, index=index, health_of=health_of, now=now, with_message=with_message,
        sidecars=sidecars,
    )  # fmt: skip
    new, _ = merge(status, desired, now=now, condition=False)
    for field, name in desired.containers:
        _sort_container(new, field, name)
    return new


def merged_entries(
    current: Iterable[dict[str, Any]] | None, managed: Mapping[str, dict[str, Any] | None]
) -> list[dict[str, Any]] | None:
    """One container's ``allocatedResourcesStatus`` with ours applied; ``None`` if unchanged.

    ``[]`` means the field must go (no entry left). Like the kubelet, entries
    left without resources go, ours or not; entries we do not manage are kept.
    """
    before = list(current or ())
    kept = [
        e
        for e in before
        if (managed[e["name"]] if e.get("name") in managed else e.get("resources"))
    ]
    merged = [_copy_json(managed.get(e.get("name", "")) or e) for e in kept]
    present = {e.get("name") for e in merged}
    merged += [_copy_json(e) for n, e in managed.items() if e and n not in present]
    # Only content counts as a change (an API list of listType=map has no
    # order); what we send is in the kubelet v1.38 order.
    return None if normalized(merged) == normalized(before) else sort_entries(merged)


def merged_condition(
    current: Obj | None, wanted: Mapping[str, Any], now: float
) -> dict[str, Any] | None:
    """Our condition as it must read at ``now``; ``None`` if ``current`` already says it.

    ``lastTransitionTime`` moves only when the status changes (or was never set).
    """
    if current is None:
        return {**wanted, "lastTransitionTime": rfc3339(now)}
    if all(current.get(k) == wanted[k] for k in ("status", "reason", "message")):
        return None
    moved = current.get("status") != wanted["status"] or not current.get("lastTransitionTime")
    stamp = rfc3339(now) if moved else current["lastTransitionTime"]
    return {**current, **wanted, "lastTransitionTime": stamp}


def sort_entries(entries: Iterable[Obj]) -> list[dict[str, Any]]:
    """Kubelet v1.38 order: resources by ``resourceID``, entries by ``name``.

    Byte order of the UTF-8 text, as Go compares strings. Returns new dicts;
    the input is not modified.
    """
    out = []
    for entry in entries:
        copied = dict(entry)
        if isinstance(copied.get("resources"), list):
            copied["resources"] = sorted(
                copied["resources"], key=lambda r: _order_key(r.get("resourceID"))
            )
        out.append(copied)
    out.sort(key=lambda e: _order_key(e.get("name")))
    return out


def container_entries(status: Obj | None, field: str, container: str) -> list[dict[str, Any]]:
    """The ``allocatedResourcesStatus`` list of one container status (empty if none)."""
    cs = podjson.find_named(podjson.items(status or {}, field), container)
    return list((cs or {}).get("allocatedResourcesStatus") or ())


def find_condition(status: Obj | None, condition_type: str) -> dict[str, Any] | None:
    """The condition of ``condition_type`` in ``status`` (a copy), or ``None``."""
    cond = podjson.find_named(podjson.items(status or {}, "conditions"), condition_type, "type")
    return dict(cond) if cond is not None else None


def normalized(entries: Iterable[Obj] | None) -> list[tuple[str, tuple[tuple[str, str, str], ...]]]:
    """A comparable form of an ``allocatedResourcesStatus`` list (order-insensitive)."""
    return sorted(
        (str(e.get("name", "")), tuple(sorted(_resource_key(r) for r in e.get("resources") or ())))
        for e in entries or ()
    )


def _resource_key(resource: Obj) -> tuple[str, str, str]:
    return (
        str(resource.get("resourceID", "")),
        str(resource.get("health", "")),
        str(resource.get("message") or ""),
    )


def rfc3339(when: float) -> str:
    """``metav1.Time`` JSON: UTC, second precision."""
    moment = datetime.datetime.fromtimestamp(int(when), tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


# -- internals -------------------------------------------------------------------


class _Viewer:
    """Reads each device's visible health once per computation."""

    def __init__(self, health_of: BoundHealthOf, now: float) -> None:
        self._health_of = health_of
        self._now = now
        self._seen: dict[models.DeviceKey, tuple[models.HealthStatus, str]] = {}

    def __call__(self, key: models.DeviceKey) -> tuple[models.HealthStatus, str]:
        if key not in self._seen:
            self._seen[key] = self._health_of(key).visible(self._now)
        return self._seen[key]


def _copy_json(value: Any) -> Any:
    """A deep copy of decoded JSON (dicts, lists, scalars): ``copy.deepcopy``
    without its memo, several times faster on the entries a write copies."""
    if isinstance(value, dict):
        return {k: _copy_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_json(v) for v in value]
    return value


def _resource_status(
    cc: claims.ContainerClaim,
    devices: Sequence[claims.PreparedDevice],
    view: _Viewer,
    *,
    with_message: bool,
) -> dict[str, Any]:
    resources: list[dict[str, Any]] = []
    seen: set[str] = set()
    for device in devices:
        if not device.serves(cc.request) or device.resource_id in seen:
            continue
        seen.add(device.resource_id)
        health, message = view(device.key)
        resources.append(resource_health(device, health, message, with_message=with_message))
    return {"name": status_name(cc.ref, cc.request), "resources": resources}


def _merge_containers(
    status: dict[str, Any],
    containers: Mapping[tuple[str, str], Mapping[str, dict[str, Any] | None]],
) -> bool:
    changed = False
    for (field, name), managed in containers.items():
        for i, cs in enumerate(podjson.items(status, field)):
            if cs.get("name") != name:
                continue
            merged = merged_entries(cs.get("allocatedResourcesStatus"), managed)
            if merged is None:
                continue
            updated = dict(cs)
            if merged:
                updated["allocatedResourcesStatus"] = merged
            else:
                updated.pop("allocatedResourcesStatus", None)
            statuses = list(status[field])
            statuses[i] = updated
            status[field] = statuses
            changed = True
    return changed


def _sort_container(status: dict[str, Any], field: str, name: str) -> None:
    # Copy on write: the container status list and the one status are new.
    for i, cs in enumerate(status.get(field) or ()):
        entries = cs.get("allocatedResourcesStatus")
        if cs.get("name") != name or not entries:
            continue
        ordered = sort_entries(entries)
        if ordered != entries:
            statuses = list(status[field])
            statuses[i] = {**cs, "allocatedResourcesStatus": ordered}
            status[field] = statuses


def _order_key(text: object) -> bytes:
    # Go's cmp.Compare on strings: byte order of UTF-8. For valid text this
    # is code point order too; encoding states it and copes with a lone
    # surrogate (JSON can carry one) without raising.
    return str(text if text is not None else "").encode("utf-8", "surrogatepass")


def _merge_condition(status: dict[str, Any], wanted: Mapping[str, Any], now: float) -> bool:
    conditions = list(podjson.items(status, "conditions"))
    at = next((i for i, c in enumerate(conditions) if c.get("type") == wanted["type"]), None)
    merged = merged_condition(conditions[at] if at is not None else None, wanted, now)
    if merged is None:
        return False
    if at is None:
        conditions.append(merged)
    else:
        conditions[at] = merged
    status["conditions"] = conditions
    return True


def _claim_devices(
    pod: Obj, index: claims.DeviceLookup, ref: str
) -> Sequence[claims.PreparedDevice] | None:
    name, _ = claims.resolve_claim_name(pod, ref)
    if not name:
        return None
    return index.devices_for(podjson.uid(pod), claims.ClaimKey(podjson.namespace(pod), name))
