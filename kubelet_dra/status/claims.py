"""Which pods, containers and claim references use which device, and back.

Counterpart of the kubelet's ``pkg/kubelet/cm/dra/claiminfo.go`` (the claim info cache)
plus the (pool, device) -> pod UIDs index that ``manager.go`` builds in
``HandleWatchResourcesStream``. :class:`ClaimIndex` is pure: it holds plain values, does no
I/O, is fed from the API (the sidecar) or by a node agent that prepares claims itself, and
keeps the kubelet's rules for resolving claim references and requests exactly (its
docstring lists them). Every mutation returns a :class:`Delta`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple, Protocol

from kubelet_dra import models
from kubelet_dra.status import podjson
from kubelet_dra.status.podjson import Obj

logger = logging.getLogger(__name__)

CONTAINERS = "containerStatuses"
INIT_CONTAINERS = "initContainerStatuses"


class ClaimKey(NamedTuple):
    """A ResourceClaim object: the kubelet's claim info key ``<namespace>/<name>``."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclasses.dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device of a claim, as ``claiminfo.go`` ``Device`` holds it."""

    driver: str
    pool: str
    device: str
    request_names: tuple[str, ...] = ()
    cdi_ids: tuple[str, ...] = ()
    share_id: str | None = None
    # Derived once: every status computation reads them for every device of
    # the pod (profiled: building them on each read was a tenth of a write's
    # time on the event loop).
    key: models.DeviceKey = dataclasses.field(init=False, repr=False, compare=False)
    """The device as the health cache knows it."""
    kubelet_id: str = dataclasses.field(init=False, repr=False, compare=False)
    """The kubelet's ``resourceID``: the first CDI device ID, else driver/pool/device."""
    resource_id: str = dataclasses.field(init=False, repr=False, compare=False)
    """Ours: :attr:`kubelet_id`, unless other devices of the claim share it
    (:func:`own_resource_ids`)."""

    def __post_init__(self) -> None:
        key = models.DeviceKey(self.driver, self.pool, self.device)
        object.__setattr__(self, "key", key)
        kubelet_id = self.cdi_ids[0] if self.cdi_ids else str(key)
        object.__setattr__(self, "kubelet_id", kubelet_id)
        object.__setattr__(self, "resource_id", kubelet_id)

    @property
    def name(self) -> str:
        """How every message names the device (:func:`device_name`)."""
        return device_name(self.key, self.kubelet_id, self.resource_id)

    def serves(self, request: str) -> bool:
        """Whether a container claim naming ``request`` sees this device."""
        if not request or not self.request_names:
            return True
        # As the kubelet: the container's base request among the names exactly as
        # the driver returned them (a driver that returns "req/sub" serves no one).
        return base_request(request) in self.request_names


@dataclasses.dataclass(frozen=True, slots=True)
class Claim:
    """A claim's devices; ``owners`` are controller pod UIDs (template claims).

    Build it with devices that went through :func:`own_resource_ids` (the
    index does) so that no two devices share a ``resource_id``.
    """

    key: ClaimKey
    uid: str = ""
    devices: tuple[PreparedDevice, ...] = ()
    owners: frozenset[str] = frozenset()
    pod_uids: frozenset[str] = frozenset()  # prepared claims: the kubelet's PodUIDs


class ContainerClaim(NamedTuple):
    """One entry of a container's ``resources.claims``."""

    field: str  # CONTAINERS or INIT_CONTAINERS: where its status lives
    container: str
    ref: str  # the pod-level claim reference name
    request: str


class DeviceUse(NamedTuple):
    """A device seen by one container through one claim reference (and request)."""

    pod_uid: str
    container: str
    claim_ref: str
    request: str


@dataclasses.dataclass(frozen=True, slots=True)
class PodClaims:
    """What the index keeps of a pod: identity, resolved references, container claims."""

    uid: str
    namespace: str
    name: str
    node: str
    refs: Mapping[str, ClaimKey]  # pod claim reference name -> resolved object
    templated: frozenset[str]  # reference names whose claim must be owned by the pod
    containers: tuple[ContainerClaim, ...]

    @property
    def claim_keys(self) -> frozenset[ClaimKey]:
        """Every ResourceClaim the pod's references resolve to."""
        return frozenset(self.refs.values())


@dataclasses.dataclass(frozen=True, slots=True)
class Delta:
    """What an index mutation changed."""

    pods: frozenset[str] = frozenset()
    claims_added: frozenset[ClaimKey] = frozenset()
    claims_removed: frozenset[ClaimKey] = frozenset()

    def __or__(self, other: Delta) -> Delta:
        return Delta(
            self.pods | other.pods,
            (self.claims_added | other.claims_added) - other.claims_removed,
            (self.claims_removed | other.claims_removed) - other.claims_added,
        )


class NameKey(NamedTuple):
    """A device of a claim as the kubelet's PodResources API names it."""

    driver: str
    pool: str
    device: str
    share_id: str | None = None


ClaimNames = Mapping[NameKey, tuple[str, ...]]
"""A claim's devices -> their CDI device IDs, as the kubelet holds them."""


class DeviceLookup(Protocol):
    """What pod status needs from an index: a claim's devices as seen by one pod."""

    def devices_for(self, pod_uid: str, key: ClaimKey) -> Sequence[PreparedDevice] | None:
        """A claim's devices as ``pod_uid`` sees them, ``None`` if unknown or not its."""
        ...


# -- naming ------------------------------------------------------------------------


def own_resource_ids(devices: Iterable[PreparedDevice]) -> tuple[PreparedDevice, ...]:
    """A claim's devices, each with a ``resource_id`` no other device of it has.

    The kubelet names a device by its first CDI device ID and keeps one
    resource per ID (``seenResourceIDs`` in ``UpdateAllocatedResourcesStatus``),
    so where a driver gives every device of a claim the same first ID (a
    claim-wide ID first, the per-device one second) its field shows one
    device and hides the health of the others. Here each device that shares
    its first ID with another device of the claim takes its first CDI ID that
    no other device of the claim has, else ``<driver>/<pool>/<device>``.
    Every other device keeps the kubelet's ID (``docs/pod-status.md``).
    """
    found = tuple(devices)
    firsts: dict[str, int] = {}
    for device in found:
        firsts[device.kubelet_id] = firsts.get(device.kubelet_id, 0) + 1
    if all(n == 1 for n in firsts.values()):
        return found
    out = []
    for i, device in enumerate(found):
        if firsts[device.kubelet_id] > 1 and device.cdi_ids:
            others = {c for j, d in enumerate(found) if j != i for c in d.cdi_ids}
            own = next((c for c in device.cdi_ids if c not in others), str(device.key))
            out.append(_with_resource_id(device, own))
        else:
            out.append(device)
    return tuple(out)


def _with_resource_id(device: PreparedDevice, resource_id: str) -> PreparedDevice:
    # resource_id is derived (init=False), so a copy gets it set the same way.
    copy = dataclasses.replace(device)
    object.__setattr__(copy, "resource_id", resource_id)
    return copy


def device_name(key: models.DeviceKey, kubelet_id: str, resource_id: str = "") -> str:
    """``<driver>/<pool>/<device>``, with the kubelet's ``resourceID`` where it differs.

    ``gpu.example.com/node/gpu-0 (as vendor.com/gpu=gpu0)``; where our
    ``resourceID`` differs from the kubelet's (the kubelet's is shared by
    several devices of the claim), both:
    ``... (as vendor.com/tpu=common, ours vendor.com/tpu=chip1)``. So ``ours``
    appears exactly when the kubelet's ID names more than this device. One
    form everywhere a device is named: the pod condition, Events, taint rules
    and ``cache show`` (``docs/pod-status.md``); ``kubectl dra-health`` reads it
    back from the condition.
    """
    plain = str(key)
    resource_id = resource_id or kubelet_id
    if resource_id != kubelet_id:
        return f"{plain} (as {kubelet_id}, ours {resource_id})"
    if kubelet_id != plain:
        return f"{plain} (as {kubelet_id})"
    return plain


# -- pure helpers on plain dicts ------------------------------------------------


def base_request(request: str) -> str:
    """``resourceclaim.BaseRequestRef``: the request part of ``<request>/<subrequest>``."""
    return request.split("/", 1)[0]


def resolve_claim_name(pod: Obj, ref: str) -> tuple[str | None, bool]:
    """The ResourceClaim object name a pod claim reference resolves to.

    Returns ``(name, templated)``; ``name`` is ``None`` when unresolved (no
    such reference, a template whose claim is not created yet, or a status
    entry saying no claim was needed). Status first, then
    ``resourceclaim.Name``, as the kubelet's ``UpdateAllocatedResourcesStatus``.
    """
    pod_ref = podjson.find_named(podjson.resource_claims(pod), ref)
    templated = bool(pod_ref and pod_ref.get("resourceClaimTemplateName"))
    status_entry = podjson.find_named(podjson.resource_claim_statuses(pod), ref)
    if status_entry is not None:
        return status_entry.get("resourceClaimName"), templated
    if pod_ref is not None and pod_ref.get("resourceClaimName"):
        return str(pod_ref["resourceClaimName"]), False
    return None, templated


def container_claims(pod: Obj, *, sidecars: bool = True) -> tuple[ContainerClaim, ...]:
    """Every container claim entry, regular containers first.

    Restartable init containers (sidecars) are included when ``sidecars`` is
    true; the kubelet skips them (kubernetes #139940).
    """
    spec = podjson.spec(pod)
    found = list(_claims_of(podjson.items(spec, "containers"), CONTAINERS))
    if sidecars:
        restartable = [c for c in podjson.items(spec, "initContainers") if _restartable(c)]
        found.extend(_claims_of(restartable, INIT_CONTAINERS))
    return tuple(found)


def pod_claims(pod: Obj) -> PodClaims:
    """Parse what the index needs from a pod dict (camelCase API JSON)."""
    namespace = podjson.namespace(pod)
    refs: dict[str, ClaimKey] = {}
    templated: set[str] = set()
    for entry in podjson.resource_claims(pod):
        name, is_template = resolve_claim_name(pod, str(entry.get("name", "")))
        if name:
            refs[str(entry["name"])] = ClaimKey(namespace, name)
            if is_template:
                templated.add(str(entry["name"]))
    return PodClaims(
        uid=podjson.uid(pod),
        namespace=namespace,
        name=podjson.name(pod),
        node=podjson.node_name(pod),
        refs=refs,
        templated=frozenset(templated),
        containers=container_claims(pod),
    )


def claim_from_api(obj: Obj) -> Claim:
    """A ``resource.k8s.io/v1`` ResourceClaim dict as the index holds it."""
    key = ClaimKey(podjson.namespace(obj), podjson.name(obj))
    results = podjson.items(_allocated_devices(obj), "results")
    devices = own_resource_ids(_device_from_result(r) for r in results)
    owners = frozenset(
        str(o["uid"])
        for o in podjson.items(podjson.metadata(obj), "ownerReferences")
        if o.get("kind") == "Pod" and o.get("controller") and o.get("uid")
    )
    return Claim(key=key, uid=podjson.uid(obj), devices=devices, owners=owners)


def is_allocated(obj: Obj) -> bool:
    """Whether a ResourceClaim dict has an allocation with devices."""
    return bool(_allocated_devices(obj))


def _allocated_devices(claim: Obj) -> Obj:
    """``status.allocation.devices`` of a ResourceClaim (empty when not allocated)."""
    allocation = podjson.status(claim).get("allocation") or {}
    devices: Obj = allocation.get("devices") or {}
    return devices


def _device_from_result(result: Obj) -> PreparedDevice:
    # Stored without the sub-request, as the kubelet stores a driver's answer
    # (manager.go compares a container's base request with these names).
    request = base_request(str(result.get("request") or ""))
    return PreparedDevice(
        driver=str(result.get("driver", "")),
        pool=str(result.get("pool", "")),
        device=str(result.get("device", "")),
        request_names=(request,) if request else (),
        share_id=result.get("shareID"),
    )


def _claims_of(containers: Iterable[Obj] | None, field: str) -> Iterator[ContainerClaim]:
    for container in containers or ():
        for claim in (container.get("resources") or {}).get("claims") or ():
            yield ContainerClaim(
                field, str(container.get("name", "")), str(claim.get("name", "")),
                str(claim.get("request") or ""),
            )  # fmt: skip


def _restartable(container: Obj) -> bool:
    return container.get("restartPolicy") == "Always"


# -- the index -----------------------------------------------------------------


class ClaimIndex:
    """Device <-> (pod, container, claim reference, request), updated incrementally.

    The index is pure: it holds plain values, does no I/O and is fed in two ways:

    1. from the API (the sidecar): pods as plain dicts (:meth:`ClaimIndex.set_pod`)
       and the ``resource.k8s.io/v1`` ResourceClaims they reference
       (:meth:`ClaimIndex.set_claim`), whose ``status.allocation.devices.results``
       name the devices;
    2. programmatically (a node agent that prepares claims itself):
       :meth:`ClaimIndex.add_prepared_claim` with the devices, request names and
       CDI device IDs the driver returned from ``NodePrepareResources``. A
       prepared claim wins over the API's view of the same claim, as the kubelet
       only knows the devices a driver returned.

    The sidecar adds the kubelet's names to API claims: the CDI device IDs the kubelet's
    PodResources API reports per device (:meth:`ClaimIndex.set_claim_names`, fed by
    ``state.podresources``) are laid over the API's devices, which keep their request names.

    Kubelet rules kept exactly:

    - a container's claim reference resolves to a ResourceClaim object name
      through ``status.resourceClaimStatuses`` first, then through
      ``resourceclaim.Name``: ``resourceClaimName`` directly, or the generated
      name recorded in the status for a template (:func:`resolve_claim_name`);
    - a container claim with a ``request`` sees only devices whose request names
      contain its base request (the part before the first ``/``); a device with no
      request names is seen by every request (:meth:`PreparedDevice.serves`). The
      container's side is always cut to its base request; the device's names are
      compared as stored. A claim read from the API is stored under the base
      request of each result (an allocation result ``req/sub``, a subrequest,
      serves ``req``), while names a driver returned are kept as it returned them,
      as the kubelet keeps them (a driver that answers ``req/sub`` serves no one);
    - devices are matched by driver, pool and device only: a shared device
      (different share IDs) notifies every pod that uses it.

    Every mutation returns a :class:`Delta`: the pods whose status may have
    changed and the claims that became (un)referenced, so the API side knows which
    claims to fetch or forget and the writer which pods to mark dirty.
    """

    def __init__(self, *, sidecars: bool = True) -> None:
        self.sidecars = sidecars
        self._pods: dict[str, PodClaims] = {}
        self._claim_pods: dict[ClaimKey, set[str]] = {}
        self._api: dict[ClaimKey, Claim] = {}
        self._prepared: dict[ClaimKey, Claim] = {}
        self._names: dict[ClaimKey, ClaimNames] = {}
        self._device_claims: dict[models.DeviceKey, set[ClaimKey]] = {}

    # -- pods --------------------------------------------------------------

    def set_pod(self, pod: Obj) -> Delta:
        """Add or replace a pod; the delta names it and its (un)referenced claims."""
        new = pod_claims(pod)
        if not self.sidecars:
            new = dataclasses.replace(
                new, containers=tuple(c for c in new.containers if c.field == CONTAINERS)
            )
        old = self._pods.get(new.uid)
        self._pods[new.uid] = new
        old_keys = old.claim_keys if old else frozenset()
        added = self._link(new.uid, new.claim_keys - old_keys)
        removed = self._unlink(new.uid, old_keys - new.claim_keys)
        return Delta(frozenset({new.uid}), added, removed)

    def remove_pod(self, uid: str) -> Delta:
        """Forget a pod; the delta names it and the claims no pod references any more."""
        old = self._pods.pop(uid, None)
        if old is None:
            return Delta()
        return Delta(frozenset({uid}), claims_removed=self._unlink(uid, old.claim_keys))

    def pod(self, uid: str) -> PodClaims | None:
        """What the index keeps of a pod, or ``None``."""
        return self._pods.get(uid)

    def pod_uids(self) -> frozenset[str]:
        """Every indexed pod."""
        return frozenset(self._pods)

    # -- claims ------------------------------------------------------------

    def set_claim(self, obj: Obj) -> Delta:
        """A ResourceClaim from the API; the pods using it are in the delta."""
        claim = claim_from_api(obj)
        old = self._effective(claim.key)
        self._api[claim.key] = _named(claim, self._names.get(claim.key))
        return self._claim_changed(claim.key, old)

    def set_claim_names(self, namespace: str, name: str, names: ClaimNames) -> Delta:
        """The kubelet's CDI device IDs of a claim's devices (its PodResources API).

        Laid over the API's view of the claim, now and whenever it is read again;
        kept until no indexed pod references the claim any more. Empty ``names``
        changes nothing: a kubelet that has not prepared the claim says nothing.
        """
        key = ClaimKey(namespace, name)
        if not names or self._names.get(key) == names:
            return Delta()
        self._names[key] = dict(names)
        api = self._api.get(key)
        if api is None:
            return Delta()
        old = self._effective(key)
        self._api[key] = _named(api, names)
        return self._claim_changed(key, old)

    def claim_names(self, namespace: str, name: str) -> ClaimNames | None:
        """The kubelet's names of a claim's devices, if learned."""
        return self._names.get(ClaimKey(namespace, name))

    def remove_claim(self, namespace: str, name: str) -> Delta:
        """Forget an API claim (a prepared claim of that name stays)."""
        key = ClaimKey(namespace, name)
        old = self._effective(key)
        if self._api.pop(key, None) is None:
            return Delta()
        return self._claim_changed(key, old)

    def add_prepared_claim(
        self,
        *,
        namespace: str,
        name: str,
        devices: Iterable[PreparedDevice],
        uid: str = "",
        pod_uids: Iterable[str] = (),
    ) -> Delta:
        """A claim a node agent prepared, with the devices its driver returned."""
        key = ClaimKey(namespace, name)
        old = self._effective(key)
        claim = Claim(
            key=key, uid=uid, devices=own_resource_ids(devices), pod_uids=frozenset(pod_uids)
        )
        self._prepared[key] = claim
        return self._claim_changed(key, old)

    def remove_prepared_claim(self, *, namespace: str, name: str) -> Delta:
        """Forget a claim a node agent prepared."""
        key = ClaimKey(namespace, name)
        old = self._effective(key)
        if self._prepared.pop(key, None) is None:
            return Delta()
        return self._claim_changed(key, old)

    def claim(self, key: ClaimKey) -> Claim | None:
        """The claim as the index uses it: the prepared one, else the API's."""
        return self._effective(key)

    def referenced_claims(self) -> frozenset[ClaimKey]:
        """Claims some indexed pod references: the ones the API side must fetch."""
        return frozenset(self._claim_pods)

    # -- queries -----------------------------------------------------------

    def devices_for(self, pod_uid: str, key: ClaimKey) -> Sequence[PreparedDevice] | None:
        """A claim's devices as seen by a pod, ``None`` if unknown or not the pod's.

        A template-generated claim counts only if the pod owns it (the kubelet's
        ``resourceclaim.IsForPod`` check at prepare time).
        """
        claim = self._effective(key)
        if claim is None:
            return None
        pod = self._pods.get(pod_uid)
        templated = pod is not None and any(
            pod.refs[ref] == key for ref in pod.templated if ref in pod.refs
        )
        if templated and claim.owners and pod_uid not in claim.owners:
            return None
        return claim.devices

    def pods_for_devices(self, keys: Iterable[models.DeviceKey]) -> frozenset[str]:
        """Every pod using any of these devices through any claim (shared devices too)."""
        pods: set[str] = set()
        for key in keys:
            for claim_key in self._device_claims.get(key, ()):
                pods |= self._pods_of_claim(claim_key)
        return frozenset(pods)

    def uses(self, key: models.DeviceKey) -> list[DeviceUse]:
        """Who sees a device: pod, container, claim reference and request."""
        found: list[DeviceUse] = []
        for claim_key in sorted(self._device_claims.get(key, ())):
            for pod_uid in sorted(self._claim_pods.get(claim_key, ())):
                found.extend(self._container_uses(pod_uid, claim_key, key))
        return found

    def devices_of_pod(self, uid: str) -> list[tuple[DeviceUse, PreparedDevice]]:
        """Every device a pod's containers see, with the use that sees it."""
        pod = self._pods.get(uid)
        if pod is None:
            return []
        found: list[tuple[DeviceUse, PreparedDevice]] = []
        for cc in pod.containers:
            key = pod.refs.get(cc.ref)
            for device in (self.devices_for(uid, key) or ()) if key else ():
                if device.serves(cc.request):
                    found.append((DeviceUse(uid, cc.container, cc.ref, cc.request), device))
        return found

    def snapshot(self, uid: str) -> FrozenClaims:
        """The claims of one pod as they are now (for a terminated pod's record)."""
        pod = self._pods.get(uid)
        claims: dict[ClaimKey, tuple[PreparedDevice, ...]] = {}
        for key in pod.claim_keys if pod else ():
            devices = self.devices_for(uid, key)
            if devices is not None:
                claims[key] = tuple(devices)
        return FrozenClaims(claims)

    def resource_ids(self, key: models.DeviceKey) -> tuple[str, str]:
        """The device's (kubelet's, our) ``resourceID``, for messages about the device alone.

        A device is named per claim; where claims name it differently (a
        shared device), the first claim in key order speaks for it. A device
        no claim holds is ``<driver>/<pool>/<device>`` for both.
        """
        for claim_key in sorted(self._device_claims.get(key, ())):
            claim = self._effective(claim_key)
            for device in claim.devices if claim else ():
                if device.key == key:
                    return device.kubelet_id, device.resource_id
        return str(key), str(key)

    def device_name(self, key: models.DeviceKey) -> str:
        """:func:`device_name` of a device as its claims name it."""
        return device_name(key, *self.resource_ids(key))

    def stats(self) -> dict[str, int]:
        """Sizes of the index, for metrics and debugging."""
        return {
            "pods": len(self._pods),
            "claims_referenced": len(self._claim_pods),
            "claims_api": len(self._api),
            "claims_prepared": len(self._prepared),
            "claims_named": len(self._names),
            "devices": len(self._device_claims),
        }

    # -- internals ---------------------------------------------------------

    def _effective(self, key: ClaimKey) -> Claim | None:
        return self._prepared.get(key) or self._api.get(key)

    def _pods_of_claim(self, key: ClaimKey) -> set[str]:
        claim = self._effective(key)
        extra = claim.pod_uids if claim else frozenset()
        return self._claim_pods.get(key, set()) | extra

    def _container_uses(
        self, pod_uid: str, claim_key: ClaimKey, device_key: models.DeviceKey
    ) -> Iterator[DeviceUse]:
        pod = self._pods[pod_uid]
        devices = [d for d in self.devices_for(pod_uid, claim_key) or () if d.key == device_key]
        for cc in pod.containers:
            if pod.refs.get(cc.ref) == claim_key and any(d.serves(cc.request) for d in devices):
                yield DeviceUse(pod_uid, cc.container, cc.ref, cc.request)

    def _claim_changed(self, key: ClaimKey, old: Claim | None) -> Delta:
        new = self._effective(key)
        old_devices = {d.key for d in old.devices} if old else set()
        new_devices = {d.key for d in new.devices} if new else set()
        for device in old_devices - new_devices:
            self._drop_device_claim(device, key)
        for device in new_devices - old_devices:
            self._device_claims.setdefault(device, set()).add(key)
        pods = self._pods_of_claim(key) | (old.pod_uids if old else frozenset())
        return Delta(frozenset(pods) if old != new else frozenset())

    def _drop_device_claim(self, device: models.DeviceKey, key: ClaimKey) -> None:
        claims = self._device_claims.get(device)
        if claims is not None:
            claims.discard(key)
            if not claims:
                del self._device_claims[device]

    def _link(self, uid: str, keys: Iterable[ClaimKey]) -> frozenset[ClaimKey]:
        added: set[ClaimKey] = set()
        for key in keys:
            pods = self._claim_pods.setdefault(key, set())
            if not pods:
                added.add(key)
            pods.add(uid)
        return frozenset(added)

    def _unlink(self, uid: str, keys: Iterable[ClaimKey]) -> frozenset[ClaimKey]:
        removed: set[ClaimKey] = set()
        for key in keys:
            pods = self._claim_pods.get(key)
            if pods is None:
                continue
            pods.discard(uid)
            if not pods:
                del self._claim_pods[key]
                removed.add(key)
                self._names.pop(key, None)
                self._forget_api_claim(key)
        return frozenset(removed)

    def _forget_api_claim(self, key: ClaimKey) -> None:
        # An unreferenced API claim is dropped so memory follows the node's pods;
        # a prepared claim stays until its agent removes it.
        old = self._effective(key)
        if self._api.pop(key, None) is not None:
            self._claim_changed(key, old)


def _named(claim: Claim, names: ClaimNames | None) -> Claim:
    """An API claim with the kubelet's CDI device IDs on its devices.

    A device is matched by driver, pool, device and share ID, else by the first
    three (a kubelet line before share IDs reports none); one the kubelet did not
    name keeps ``<driver>/<pool>/<device>``.
    """
    if not names:
        return claim
    loose = {NameKey(k.driver, k.pool, k.device): ids for k, ids in names.items()}
    devices = []
    for d in claim.devices:
        ids = names.get(NameKey(d.driver, d.pool, d.device, d.share_id))
        if ids is None:
            ids = loose.get(NameKey(d.driver, d.pool, d.device), ())
        devices.append(dataclasses.replace(d, cdi_ids=ids))
    return dataclasses.replace(claim, devices=own_resource_ids(devices))


@dataclasses.dataclass(frozen=True, slots=True)
class FrozenClaims:
    """A pod's claims captured at one moment; implements :class:`DeviceLookup`."""

    claims: Mapping[ClaimKey, tuple[PreparedDevice, ...]]

    def devices_for(self, pod_uid: str, key: ClaimKey) -> Sequence[PreparedDevice] | None:
        """The captured devices of ``key`` (every pod of the record sees them)."""
        return self.claims.get(key)

    def device_keys(self) -> frozenset[models.DeviceKey]:
        """Every device of the captured claims."""
        return frozenset(d.key for devices in self.claims.values() for d in devices)
