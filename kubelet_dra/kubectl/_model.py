"""What ``kubectl dra-health`` shows, computed from plain API JSON; pure, no I/O.

Reads what the kubelet (or our writer, ``podstatus.py``) put in a pod:
``status.containerStatuses[].allocatedResourcesStatus`` (and ``initContainerStatuses`` for
restartable init containers) and the device-health condition. A pod is reduced to a
:class:`PodView` as soon as it is read, so a list of 10,000 pods keeps only their health
entries. :func:`resolve` maps a ``resourceID`` back to a device (its docstring has the
order of the rules); taints come from ``DeviceTaintRule`` objects (:class:`Taint`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from kubelet_dra.status import claims as claims_mod
from kubelet_dra.status import podjson, podstatus
from kubelet_dra.status.podjson import Obj

API_VERSION = "kubelet-dra.io/v1alpha1"
HEALTHY, UNHEALTHY, UNKNOWN = "Healthy", "Unhealthy", "Unknown"
HEALTH_VALUES = (HEALTHY, UNHEALTHY, UNKNOWN)
_SEVERITY = {HEALTHY: 0, UNKNOWN: 1, UNHEALTHY: 2}
_STATUS_FIELDS = (claims_mod.CONTAINERS, claims_mod.INIT_CONTAINERS)

DeviceId = tuple[str, str, str]  # driver, pool, device
# claims.device_name's form in a condition message: <driver>/<pool>/<device> (as K[, ours R]).
# A driver has no "/", a device no "/" (DNS labels); the pool may have some.
_NAMED = re.compile(
    r"(?<![^\s;:])([^\s/;:()]+)/(\S+)/([^\s/()]+) \(as ([^\s,()]+)(?:, ours ([^\s,()]+))?\)"
)


@dataclasses.dataclass(frozen=True, slots=True)
class Resource:
    """One ``ResourceHealth`` of one ``allocatedResourcesStatus`` entry of one container."""

    container: str
    entry: str  # the entry's name: claim:<ref> or claim:<ref>/<request> (or a device plugin's)
    resource_id: str
    health: str  # normalized to Healthy, Unhealthy or Unknown
    message: str


@dataclasses.dataclass(frozen=True, slots=True)
class Condition:
    status: str
    reason: str
    message: str
    last_transition: str


@dataclasses.dataclass(frozen=True, slots=True)
class PodView:
    """What the plugin keeps of a pod."""

    namespace: str
    name: str
    uid: str
    node: str
    claims: Mapping[str, str]  # pod claim reference -> ResourceClaim name (resolved ones)
    resources: tuple[Resource, ...]
    condition: Condition | None
    named: Mapping[str, DeviceId] = dataclasses.field(default_factory=dict)
    """resourceID -> device, as our condition names them (:func:`condition_names`)."""
    shared: frozenset[str] = frozenset()
    """The kubelet's resourceIDs our condition says several devices share."""

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name

    def claim_of(self, entry: str) -> claims_mod.ClaimKey | None:
        parsed = parse_entry(entry)
        name = self.claims.get(parsed[0]) if parsed else None
        return claims_mod.ClaimKey(self.namespace, name) if name else None


@dataclasses.dataclass(frozen=True, slots=True)
class Result:
    """One allocation result of a claim."""

    driver: str
    pool: str
    device: str
    request: str

    @property
    def device_id(self) -> DeviceId:
        return self.driver, self.pool, self.device


@dataclasses.dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str | None
    effect: str
    rule: str


@dataclasses.dataclass(frozen=True, slots=True)
class PodUse:
    namespace: str
    name: str
    container: str
    claim: str | None  # the ResourceClaim object's name


@dataclasses.dataclass(slots=True)
class DeviceRow:
    node: str
    resource_id: str
    health: str
    message: str
    pods: list[PodUse]
    device: DeviceId | None = None
    taints: list[Taint] = dataclasses.field(default_factory=list)
    claims: list[str] = dataclasses.field(default_factory=list)  # namespace/name


@dataclasses.dataclass(frozen=True, slots=True)
class PodRow:
    namespace: str
    name: str
    node: str
    container: str
    claim: str  # the entry's name
    resource_id: str
    health: str
    message: str
    condition: Condition | None


# -- pods ------------------------------------------------------------------------------------


def normalize_health(value: Any) -> str:
    """The kubelet's reading (``toResourceHealthStatus``): anything else is Unknown."""
    return str(value) if value in _SEVERITY else UNKNOWN


def pod_view(pod: Obj, condition_type: str) -> PodView:
    meta, spec, status = podjson.metadata(pod), podjson.spec(pod), podjson.status(pod)
    refs: dict[str, str] = {}
    for ref in spec.get("resourceClaims") or ():
        name, _ = claims_mod.resolve_claim_name(pod, str(ref.get("name", "")))
        if name:
            refs[str(ref["name"])] = str(name)
    resources: list[Resource] = []
    for field in _STATUS_FIELDS:
        for cs in _dicts(status.get(field)):
            for entry in _dicts(cs.get("allocatedResourcesStatus")):
                for res in _dicts(entry.get("resources")):
                    resources.append(
                        Resource(
                            str(cs.get("name", "")),
                            str(entry.get("name", "")),
                            str(res.get("resourceID", "")),
                            normalize_health(res.get("health")),
                            str(res.get("message") or ""),
                        )
                    )
    cond = podstatus.find_condition(status, condition_type) if condition_type else None
    condition = None
    if cond is not None:
        condition = Condition(
            str(cond.get("status", "")), str(cond.get("reason") or ""),
            str(cond.get("message") or ""), str(cond.get("lastTransitionTime") or ""),
        )  # fmt: skip
    named, shared = condition_names(condition.message if condition else "")
    return PodView(
        str(meta.get("namespace") or "default"), str(meta.get("name", "")),
        str(meta.get("uid", "")), str(spec.get("nodeName") or ""), refs, tuple(resources),
        condition, named, shared,
    )  # fmt: skip


def condition_names(message: str) -> tuple[dict[str, DeviceId], frozenset[str]]:
    """The resourceIDs our condition's message gives its devices, and the shared ones.

    ``d/p/x (as K)`` maps K to the device; ``d/p/x (as K, ours R)`` maps R to it and marks
    K shared (the kubelet's one entry for several devices). A K that two devices claim is
    shared too. Text of any other form adds nothing.
    """
    named: dict[str, DeviceId] = {}
    shared: set[str] = set()
    for match in _NAMED.finditer(message):
        driver, pool, device, kubelet_id, ours = match.groups()
        found = (driver, pool, device)
        if ours:
            shared.add(kubelet_id)
            named[ours] = found
        elif named.get(kubelet_id, found) != found:
            shared.add(kubelet_id)
        else:
            named[kubelet_id] = found
    for resource_id in shared:
        named.pop(resource_id, None)
    return named, frozenset(shared)


def _dicts(value: Any) -> list[Mapping[str, Any]]:
    """The objects of a list field; anything else reads as empty (a proxy or an old
    server may hand over odd shapes: the command shows what it can instead of failing)."""
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, Mapping)]


def parse_entry(entry: str) -> tuple[str, str] | None:
    """``claim:<ref>[/<request>]`` -> (ref, request); ``None`` for other entries."""
    if not entry.startswith("claim:"):
        return None
    ref, _, request = entry[len("claim:") :].partition("/")
    return ref, request


def worst(healths: Iterable[str]) -> str:
    return max(healths, key=lambda h: _SEVERITY.get(h, 1), default=HEALTHY)


# -- claims and resolution -----------------------------------------------------------------


def claim_results(claim: Obj) -> tuple[Result, ...]:
    parsed = claims_mod.claim_from_api(claim)
    return tuple(
        Result(d.driver, d.pool, d.device, d.request_names[0] if d.request_names else "")
        for d in parsed.devices
    )


def resolve(
    resource_id: str, entry: str, results: Sequence[Result], view: PodView | None = None
) -> DeviceId | None:
    """The device a ``resourceID`` of an entry names (see the module docstring).

    Devices are named by ``resourceID`` as the kubelet names them: the device's first CDI device
    ID if its driver returned one, else ``<driver>/<pool>/<device>``. :func:`resolve` maps one back
    to a device, in this order:

    1. an exact ``<driver>/<pool>/<device>`` match among the results of the pod's ResourceClaim
       (``status.allocation.devices.results``, which ``claims.claim_from_api`` parses);
    2. our pod condition: it names each device it mentions ``<driver>/<pool>/<device> (as <the
       kubelet's resourceID>)``, or ``(as <kubelet's>, ours <ours>)`` where the kubelet's ID is
       shared by several devices of a claim (``claims.device_name``); :func:`condition_names`
       reads that back. A shared kubelet ID resolves to no device (the kubelet's entry shows one
       of several devices' health), and :func:`resolve` tries nothing else for it;
    3. the only result the entry's request can see;
    4. for a CDI ID (``vendor/class=name``), the only result whose device name ends the CDI name
       (drivers commonly name CDI devices ``<claim uid>-<device>``): a guess, used last.

    Anything else stays unresolved (``None``). The condition names only devices that are not
    Healthy, so a healthy device with a CDI ID is resolved by 3 or 4, or not at all.
    """
    for r in results:
        if f"{r.driver}/{r.pool}/{r.device}" == resource_id:
            return r.device_id
    if view is not None:
        if resource_id in view.shared:
            return None
        if resource_id in view.named:
            return view.named[resource_id]
    parsed = parse_entry(entry)
    request = parsed[1] if parsed else ""
    seen = [r for r in results if _serves(r.request, request)]
    if len(seen) == 1:
        return seen[0].device_id
    if "=" in resource_id:
        name = resource_id.rsplit("=", 1)[1]
        named = {
            r.device_id
            for r in seen
            if name == r.device or name.endswith(("-" + r.device, "_" + r.device))
        }
        if len(named) == 1:
            return next(iter(named))
    return None


def _serves(result_request: str, request: str) -> bool:
    if not request or not result_request:
        return True
    return claims_mod.base_request(result_request) == claims_mod.base_request(request)


# -- devices -------------------------------------------------------------------------------


def device_groups(
    pods: Iterable[PodView], healths: frozenset[str] | None = None
) -> tuple[dict[tuple[str, str], list[tuple[PodView, Resource]]], int]:
    """Reported devices by (node, resourceID) with the pod entries reporting them, for the
    devices whose worst health is in ``healths`` (None: all); and how many devices there are.

    Two passes: the worst health of every device first (cheap), the members only of the
    devices kept, as a cluster reports tens of thousands of healthy devices.
    """
    pods = list(pods)
    severity: dict[tuple[str, str], int] = {}
    for pod in pods:
        for res in pod.resources:
            key = (pod.node, res.resource_id)
            level = _SEVERITY[res.health]
            if severity.get(key, -1) < level:
                severity[key] = level
    names = {level: health for health, level in _SEVERITY.items()}
    kept = {k for k, level in severity.items() if healths is None or names[level] in healths}
    groups: dict[tuple[str, str], list[tuple[PodView, Resource]]] = {}
    for pod in pods:
        for res in pod.resources:
            key = (pod.node, res.resource_id)
            if key in kept:
                groups.setdefault(key, []).append((pod, res))
    return groups, len(severity)


def device_row(
    key: tuple[str, str],
    members: Sequence[tuple[PodView, Resource]],
    results_of: Mapping[claims_mod.ClaimKey, Sequence[Result]],
) -> DeviceRow:
    """One device: the worst health any pod reports, and who uses it."""
    health = worst(r.health for _, r in members)
    message = next((r.message for _, r in members if r.health == health and r.message), "")
    uses: dict[PodUse, None] = {}
    claim_names: dict[str, None] = {}
    device: DeviceId | None = None
    for pod, res in members:
        claim = pod.claim_of(res.entry)
        uses[PodUse(pod.namespace, pod.name, res.container, claim.name if claim else None)] = None
        if claim is not None:
            claim_names[str(claim)] = None
            if device is None:
                device = resolve(res.resource_id, res.entry, results_of.get(claim, ()), pod)
    return DeviceRow(
        key[0], key[1], health, message,
        sorted(uses, key=lambda u: (u.namespace, u.name, u.container, u.claim or "")),
        device, claims=sorted(claim_names),
    )  # fmt: skip


def claims_of(members: Iterable[tuple[PodView, Resource]]) -> set[claims_mod.ClaimKey]:
    found: set[claims_mod.ClaimKey] = set()
    for pod, res in members:
        claim = pod.claim_of(res.entry)
        if claim is not None:
            found.add(claim)
    return found


def driver_matches(driver: str, device: DeviceId | None, resource_id: str) -> bool:
    """``--driver``: a resolved device's driver, else a ``<driver>/...`` resourceID."""
    if device is not None:
        return device[0] == driver
    return resource_id.startswith(driver + "/")


def sort_devices(rows: list[DeviceRow]) -> list[DeviceRow]:
    return sorted(rows, key=lambda r: (r.node, *(r.device or ("", "", "")), r.resource_id))


# -- taints --------------------------------------------------------------------------------


def taints_for(device: DeviceId | None, rules: Sequence[Obj]) -> list[Taint]:
    """The taints of ``device`` among these ``DeviceTaintRule`` objects.

    A rule taints a device when every criterion of its ``deviceSelector`` that we can evaluate
    (driver, pool, device) matches; a rule without a selector matches nothing, and one with
    criteria we cannot evaluate here (the CEL ``selectors`` or ``deviceClassName`` of the
    v1alpha3 API) is not shown.
    """
    if device is None:
        return []
    found = []
    for rule in rules:
        spec = podjson.spec(rule)
        if _selects(spec.get("deviceSelector"), device):
            taint = podjson.child(spec, "taint")
            value = taint.get("value")
            found.append(
                Taint(
                    str(taint.get("key", "")),
                    None if value is None else str(value),
                    str(taint.get("effect", "")),
                    str(podjson.metadata(rule).get("name", "")),
                )
            )
    return sorted(found, key=lambda t: (t.key, t.rule))


def _selects(selector: Any, device: DeviceId) -> bool:
    if not isinstance(selector, Mapping):
        return False  # no selector: no device
    for field in ("deviceClassName", "selectors"):
        if selector.get(field):
            return False  # criteria we cannot evaluate from a claim
    return all(
        selector.get(field) in (None, value)
        for field, value in zip(("driver", "pool", "device"), device, strict=True)
    )


# -- pod rows ------------------------------------------------------------------------------


def pod_rows(pods: Iterable[PodView]) -> list[PodRow]:
    rows = [
        PodRow(
            pod.namespace,
            pod.name,
            pod.node,
            res.container,
            res.entry,
            res.resource_id,
            res.health,
            res.message,
            pod.condition,
        )
        for pod in pods
        for res in pod.resources
    ]
    return sorted(rows, key=lambda r: (r.namespace, r.name, r.container, r.claim, r.resource_id))


# -- the documented JSON ---------------------------------------------------------------------


def device_list(rows: Sequence[DeviceRow]) -> tuple[dict[str, Any], Iterator[dict[str, Any]]]:
    """The ``DeviceHealthList``: its head and its items, made one at a time."""
    head = {"apiVersion": API_VERSION, "kind": "DeviceHealthList"}
    return head, (_device_item(r) for r in rows)


def _device_item(r: DeviceRow) -> dict[str, Any]:
    return {
        "node": r.node,
        "driver": r.device[0] if r.device else None,
        "pool": r.device[1] if r.device else None,
        "device": r.device[2] if r.device else None,
        "resourceID": r.resource_id,
        "health": r.health,
        "message": r.message,
        "pods": [
            {"namespace": u.namespace, "name": u.name, "container": u.container, "claim": u.claim}
            for u in r.pods
        ],
        "taints": [
            {"key": t.key, "value": t.value, "effect": t.effect, "rule": t.rule} for t in r.taints
        ],
    }


def pod_list(rows: Sequence[PodRow]) -> tuple[dict[str, Any], Iterator[dict[str, Any]]]:
    """The ``PodDeviceHealthList``: its head and its items, made one at a time."""
    head = {"apiVersion": API_VERSION, "kind": "PodDeviceHealthList"}
    return head, (_pod_item(r) for r in rows)


def _pod_item(r: PodRow) -> dict[str, Any]:
    condition = r.condition
    return {
        "namespace": r.namespace,
        "name": r.name,
        "node": r.node,
        "container": r.container,
        "claim": r.claim,
        "resourceID": r.resource_id,
        "health": r.health,
        "message": r.message,
        "condition": {"status": condition.status, "reason": condition.reason}
        if condition
        else None,
    }
