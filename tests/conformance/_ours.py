"""Our side of a conformance run: the library's ``DRAHealthManager`` as a node agent.

The manager runs in node-agent mode (``docs/library.md``): claims are added
programmatically, pods with ``set_pod``, statuses arrive through the
``on_status`` callback and are merged into the agent's own copy of each pod's
status, as an agent that owns pod status would write them. It takes the
commands the twin takes, with the same meaning:

- ``register``/``deregister``: the registration handler's events (the twin
  calls the kubelet's watcher handler directly, so both skip the registry
  directory and GetInfo; the endpoint and the advertised services are the
  same);
- ``prepare``: ``NodePrepareResources`` on the driver's socket for each claim
  of the pod, as the kubelet batches them per driver; the returned devices
  (request names, CDI IDs) become ``PreparedDevice`` values;
- ``unprepare``: the pod terminated. Like our status writer (kubernetes
  #132978), the pod keeps the health its devices had at that moment;
- ``announced``: the pods our pipeline marked for a status update because a
  device's health changed (the kubelet's ``Updates()`` channel);
- ``devices``: each device's health as our cache reads it now.

The health cache persists to a real SQLite store in the run's directory.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kubelet_dra import errors, models
from kubelet_dra import manager as manager_mod
from kubelet_dra import settings as settings_mod
from kubelet_dra.plugin import getinfo, registration
from kubelet_dra.status import claims, podstatus
from kubelet_dra.status.podjson import Obj
from tests.conformance import _drivers


class _Manager(manager_mod.DRAHealthManager):
    """The library manager, recording which pods each health change announces."""

    announced: set[str]

    async def _on_change(self, changed: list[models.DeviceKey]) -> None:
        self.announced |= self.index.pods_for_devices(changed)
        await super()._on_change(changed)


class Registrations:
    """The registration handler's events, as the twin takes them (its watcher handler):
    the validation of ``getinfo.make_plugin_info``, one driver per endpoint."""

    manager: manager_mod.DRAHealthManager
    endpoints: dict[str, getinfo.PluginInfo]

    async def register(self, driver: str, endpoint: str, services: Sequence[str]) -> str | None:
        """Register like the kubelet's handler; the refusal text, or None."""
        try:
            info = getinfo.make_plugin_info(driver, endpoint, list(services))
        except errors.RegistrationError as exc:
            return str(exc) or type(exc).__name__
        if endpoint in self.endpoints:
            return f"endpoint {endpoint} is already registered"
        self.endpoints[endpoint] = info
        await self.manager.plugins.handle(
            registration.PluginEvent(registration.EventKind.REGISTER, info)
        )
        return None

    async def deregister(self, driver: str, endpoint: str) -> None:
        info = self.endpoints.pop(endpoint, None)
        if info is not None:
            await self.manager.plugins.handle(
                registration.PluginEvent(registration.EventKind.DEREGISTER, info)
            )

    def stream_state(self, endpoint: str) -> tuple[str, int] | None:
        status = self.manager.plugins.endpoints.get(endpoint)
        return None if status is None else (status.state.value, status.reports)

    def driver_endpoint(self, driver: str) -> getinfo.PluginInfo | None:
        """The newest registered endpoint of a driver (the kubelet's ``GetPlugin``)."""
        found = [i for i in self.endpoints.values() if i.driver == driver]
        return found[-1] if found else None


class OurSide(Registrations):
    """The library in node-agent mode: it prepares, and its statuses arrive by callback."""

    manager: _Manager

    def __init__(self, state_dir: pathlib.Path, *, node: str, registry: pathlib.Path) -> None:
        self.settings = settings_mod.Settings(
            **run_settings(node, state_dir),
            plugins_registry=registry,
            role=settings_mod.Role.OWNER,
            pod_condition_type="",
        )
        self.manager = _Manager(self.settings, on_status=self._delivered, watch_registry=False)
        self.manager.announced = set()
        self.statuses: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, Obj] = {}
        self.claim_pods: dict[tuple[str, str], set[str]] = {}
        self.claim_devices: dict[tuple[str, str], list[claims.PreparedDevice]] = {}
        self.terminated: dict[str, tuple[claims.FrozenClaims, dict[models.DeviceKey, Any]]] = {}
        self.endpoints: dict[str, getinfo.PluginInfo] = {}

    async def start(self) -> None:
        await self.manager.start()

    async def stop(self) -> None:
        await self.manager.close()

    # -- pods and claims ---------------------------------------------------

    async def prepare(self, pod: Obj, claim_objects: Mapping[str, Obj]) -> str | None:
        """Prepare every claim of ``pod``; the error text, or None."""
        ns = str(pod["metadata"]["namespace"])
        uid = str(pod["metadata"]["uid"])
        todo: list[Obj] = []
        recorded = {
            str(entry.get("name"))
            for entry in pod.get("status", {}).get("resourceClaimStatuses") or ()
        }
        for ref in pod["spec"].get("resourceClaims") or ():
            name, _ = claims.resolve_claim_name(pod, str(ref["name"]))
            if ref.get("resourceClaimTemplateName") and str(ref["name"]) not in recorded:
                # resourceclaim.Name: the generated claim is not recorded yet.
                return "ResourceClaim not created yet"
            if name is None:
                continue  # recorded as "no claim needed"
            obj = claim_objects.get(name)
            if obj is None:
                return f"ResourceClaim {name} not found"
            todo.append(obj)
        for obj in todo:
            key = (ns, str(obj["metadata"]["name"]))
            if key not in self.claim_devices:
                devices, error = await self._prepare_claim(obj)
                if error:
                    return error
                self.claim_devices[key] = devices
        for obj in todo:
            key = (ns, str(obj["metadata"]["name"]))
            self.claim_pods.setdefault(key, set()).add(uid)
            self._publish(key, str(obj["metadata"]["uid"]))
        self.pods[uid] = pod
        self.statuses[uid] = _fresh_status(pod)
        self.manager.set_pod(pod)
        return None

    async def _prepare_claim(self, obj: Obj) -> tuple[list[claims.PreparedDevice], str]:
        meta = obj["metadata"]
        drivers: list[str] = []
        for result in obj["status"]["allocation"]["devices"]["results"]:
            if result["driver"] not in drivers:
                drivers.append(result["driver"])
        devices: list[claims.PreparedDevice] = []
        for driver in drivers:
            info = self.driver_endpoint(driver)
            if info is None:
                return [], f"DRA driver {driver} is not registered"
            version = info.dra_service.split(".")[0]
            claim = (str(meta["namespace"]), str(meta["uid"]), str(meta["name"]))
            try:
                answers = await _drivers.prepare(info.endpoint, version, [claim])
            except Exception as exc:
                return [], f"NodePrepareResources: {exc}"
            found, error = answers.get(claim[1], ([], "no result for the claim"))
            if error:
                return [], f"NodePrepareResources failed for ResourceClaim {claim[2]}: {error}"
            devices += [
                claims.PreparedDevice(
                    driver=driver,
                    pool=d.pool_name,
                    device=d.device_name,
                    request_names=tuple(d.request_names),
                    cdi_ids=tuple(d.cdi_device_ids),
                    share_id=d.share_id if d.HasField("share_id") else None,
                )
                for d in found
            ]
        return devices, ""

    def _publish(self, key: tuple[str, str], claim_uid: str) -> None:
        pods = self.claim_pods.get(key, set())
        if not pods:
            # Through the index alone: the pods left frozen (unprepare) are not recomputed.
            self.manager.index.remove_prepared_claim(namespace=key[0], name=key[1])
            self.claim_devices.pop(key, None)
            return
        self.manager.add_prepared_claim(
            namespace=key[0],
            name=key[1],
            uid=claim_uid,
            devices=self.claim_devices[key],
            pod_uids=sorted(pods),
        )

    def unprepare(self, pod: Obj) -> None:
        """The pod terminated: freeze its devices' health, release its claims."""
        uid = str(pod["metadata"]["uid"])
        if uid not in self.pods:
            return
        now = self.manager.clock.now()
        frozen = self.manager.index.snapshot(uid)
        health = {k: self.manager.cache.get(k, now) for k in frozen.device_keys()}
        self.terminated[uid] = (frozen, health)
        self.manager.remove_pod(uid)
        del self.pods[uid]
        for key, pods in list(self.claim_pods.items()):
            if uid in pods:
                pods.discard(uid)
                claim = self.manager.index.claim(claims.ClaimKey(*key))
                self._publish(key, claim.uid if claim else "")
                if not pods:
                    del self.claim_pods[key]

    # -- what is compared ----------------------------------------------------

    async def _delivered(self, update: manager_mod.PodHealthUpdate) -> None:
        current = self.statuses.get(update.pod_uid)
        if current is None:
            return
        now = self.manager.clock.now()
        merged, _ = podstatus.merge(current, update.desired, now=now, condition=False)
        self.statuses[update.pod_uid] = merged

    def settled(self) -> bool:
        """Our side has caught up with wall-clock time: no lease deadline is overdue (the
        deadline task ran) and every marked pod's status was delivered."""
        if not deadlines_caught_up(self.manager):
            return False
        # The manager's own queue of pods waiting for the callback (node-agent mode).
        return self.manager.agent.idle

    def take_announced(self) -> set[str]:
        out, self.manager.announced = self.manager.announced, set()
        return out

    def status_of(self, pod: Obj) -> dict[str, Any]:
        uid = str(pod["metadata"]["uid"])
        if uid in self.terminated:
            frozen, health = self.terminated[uid]
            desired = podstatus.desired_status(
                pod,
                index=frozen,
                health_of=lambda key: health.get(key, models.UNKNOWN_DEVICE),
                now=self.manager.clock.now(),
            )
            merged, _ = podstatus.merge(
                _fresh_status(pod), desired, now=self.manager.clock.now(), condition=False
            )
            return merged
        return self.statuses.get(uid) or _fresh_status(pod)

    def devices(self, keys: Iterable[tuple[str, str, str]]) -> dict[tuple[str, str, str], Any]:
        now = self.manager.clock.now()
        cache = self.manager.cache
        out = {}
        for key in keys:
            health, message = cache.get(models.DeviceKey(*key), now).visible(now)
            out[key] = (health.value, message)
        return out


def run_settings(node: str, state_dir: pathlib.Path) -> dict[str, Any]:
    """What our node agent and our sidecar of a run share (``Settings`` fields)."""
    return {
        "node_name": node,
        "state_dir": state_dir,
        "write_window": 0.02,
        "startup_grace": 0.0,
        # Reconnects well before the kubelet's fixed 5 s, never near it, so a sync
        # point can sit between the two or after both.
        "stream_backoff_initial": _runner_reconnect(),
        "stream_backoff_max": _runner_reconnect(),
        "store_flush_interval": 0.1,
        "metrics_address": "",
        # The twin's names come from its checkpoint (the library option), never from a
        # PodResources socket of this machine.
        "pod_resources_socket": None,
    }


def deadlines_caught_up(manager: manager_mod.DRAHealthManager) -> bool:
    """No lease deadline is overdue: the manager's deadline task kept up with the clock."""
    deadline = manager.cache.next_deadline()
    return deadline is None or deadline >= manager.clock.now() - 0.05


def _runner_reconnect() -> float:
    from tests.conformance import _runner

    return _runner.OUR_RECONNECT[1]


def _fresh_status(pod: Obj) -> dict[str, Any]:
    status = pod.get("status") or {}
    out: dict[str, Any] = {}
    for field in (claims.CONTAINERS, claims.INIT_CONTAINERS):
        if status.get(field):
            out[field] = [{"name": cs["name"]} for cs in status[field]]
    return out
