"""The taint bridge's reconcile loop: DeviceTaintRules for this node's unhealthy devices.

No kubelet counterpart (the kubelet stops at pod status); the pattern is KEP-5055's "an
external health monitor creates DeviceTaintRules". Off unless ``--taint-effect`` names an
effect. :class:`TaintBridge` runs as one task of the manager: start, observe, reconcile
(its docstring has each step). Only rules labelled with this node and ``managed-by:
kubelet-dra-health`` are touched, and the bridge takes only the status writer's spare API
tokens.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import logging
from collections.abc import Callable, Iterable
from typing import Any

from kubelet_dra import clock as clock_mod
from kubelet_dra import errors, kube, models
from kubelet_dra import settings as settings_mod
from kubelet_dra.kube import taintrules
from kubelet_dra.status import claims, podjson
from kubelet_dra.status.podjson import MutableObj, Obj
from kubelet_dra.taints import planner, policy, statefile

logger = logging.getLogger(__name__)

DEVICE_TAINTED = "DeviceTainted"
DEVICE_UNTAINTED = "DeviceUntainted"
BACKOFF_INITIAL = 1.0
BACKOFF_MAX = 30.0


class BridgeState(enum.StrEnum):
    """The bridge's state, as the ``kubelet_dra_taint_bridge`` metric labels it."""

    STARTING = "starting"
    ACTIVE = "active"
    OFF = "off"


class BridgeOff(Exception):
    """The bridge cannot work here; ``detail`` says what is missing."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class RuleSync:
    """This node's DeviceTaintRules as last listed, and the writes that change them.

    Every request takes a spare token of the shared budget first. ``writes`` counts them
    by (operation, ok|failed); a 404 on delete is neither (the rule is gone either way).
    """

    def __init__(
        self,
        *,
        client: kube.ApiClient,
        node: str,
        thresholds: policy.Thresholds,
        budget: kube.TokenBucket,
        events: kube.EventRecorder,
        clock: clock_mod.Clock,
        resync: float,
        resource_ids: Callable[[models.DeviceKey], tuple[str, str]],
        api_factory: Callable[[Any, str], taintrules.TaintRules],
        discover: Callable[[Any], str | None],
    ) -> None:
        self.node, self.thresholds, self.events = node, thresholds, events
        self._clock, self._resync = clock, resync
        self.writes: collections.Counter[tuple[str, str]] = collections.Counter()
        self.rules: dict[str, Obj] | None = None  # name -> our rule, None: list first
        self.resync_at = 0.0
        self._known: dict[str, Obj] = {}  # the last rules listed, for metrics while relisting
        self._client, self._budget, self._resource_ids = client, budget, resource_ids
        self._api_factory, self._discover = api_factory, discover
        self._api: taintrules.TaintRules | None = None

    async def connect(self) -> str:
        """Discover the served version and use it; raises :class:`BridgeOff` if none."""
        await self._budget.acquire(spare=True)
        version = await asyncio.to_thread(self._discover, self._client)
        if version is None:
            raise BridgeOff(
                f"API: {taintrules.GROUP} serves no {taintrules.RESOURCE} in "
                f"{', '.join(taintrules.VERSIONS)} (Kubernetes 1.33+ with "
                "DRADeviceTaintRules; GA in 1.37)"
            )
        self._api = self._api_factory(self._client, version)
        return version

    def rules_by_effect(self) -> collections.Counter[str]:
        """This node's rules by taint effect (the last listed while a relist is due)."""
        rules = self.rules if self.rules is not None else self._known
        return collections.Counter(planner.effect_of(rule) for rule in rules.values())

    def forget(self) -> None:
        """List again before the next plan: the API may have done more than it answered."""
        self._known = self.rules if self.rules is not None else self._known
        self.rules = None

    async def relist(self) -> None:
        """List this node's rules; the next resync is an interval from now."""
        api = self._require_api()
        await self._budget.acquire(spare=True)
        items = await asyncio.to_thread(api.list, planner.node_selector(self.node))
        # The label selector already filters; checking again costs nothing and keeps a
        # misbehaving server (or a selector typo) from ever handing us another's rule.
        self.rules = {
            podjson.name(rule): rule
            for rule in items
            if planner.is_ours(rule, self.node) and rule["metadata"].get("name")
        }
        self.resync_at = self._clock.now() + self._resync

    async def apply(
        self,
        operations: Iterable[planner.Operation],
        tainted: Callable[[], set[models.DeviceKey]],
    ) -> None:
        """Send ``operations`` in order; ``tainted`` names the devices still to be tainted."""
        for op in operations:
            if isinstance(op, planner.Create):
                await self._create(op.key, op.taint)
            elif isinstance(op, planner.Update):
                await self._update(op.current, op.body)
            else:
                await self._delete(op.rule, tainted)

    async def _create(self, key: models.DeviceKey, taint: policy.Taint) -> None:
        api = self._require_api()
        for hashed in (False, True):
            name = planner.rule_name(self.node, key, hashed=hashed)
            body = planner.rule_body(
                name, self.node, key, taint, self.thresholds, kubelet_id=self._resource_ids(key)[0]
            )
            try:
                created = await self._write("create", api.create, body)
            except kube.CallError as exc:
                if exc.status != 409:
                    raise
                # The name exists: ours from a create whose answer was lost, or someone
                # else's. A relist tells; only ours is adopted, never another's touched.
                await self.relist()
                if any(planner.device_of(r) == key for r in (self.rules or {}).values()):
                    return
                logger.warning(
                    "taint bridge: DeviceTaintRule %s belongs to someone else; using a hashed name",
                    name,
                )
                continue
            assert self.rules is not None
            self.rules[name] = created
            self._emit(DEVICE_TAINTED, key, taint, name)
            return
        logger.error("taint bridge: no free name for a rule of device %s", key)

    async def _update(self, current: Obj, body: MutableObj) -> None:
        api = self._require_api()
        answer = await self._write("update", api.replace, planner.updated(current, body))
        assert self.rules is not None
        self.rules[podjson.name(current)] = answer

    async def _delete(self, rule: Obj, tainted: Callable[[], set[models.DeviceKey]]) -> None:
        api = self._require_api()
        name = podjson.name(rule)
        try:
            await self._write(
                "delete", api.delete, name, podjson.uid(rule), podjson.resource_version(rule)
            )
        except kube.CallError as exc:
            if exc.status != 404:
                raise
        assert self.rules is not None
        self.rules.pop(name, None)
        key = planner.device_of(rule)
        if key is not None and key not in tainted():
            self._emit(DEVICE_UNTAINTED, key, None, name)

    async def _write(self, op: str, fn: Callable[..., Any], *args: Any) -> Any:
        await self._budget.acquire(spare=True)
        try:
            answer = await asyncio.to_thread(fn, *args)
        except kube.CallError as exc:
            if not (op == "delete" and exc.status == 404):
                self.writes[(op, "failed")] += 1
            raise
        self.writes[(op, "ok")] += 1
        return answer

    def _require_api(self) -> taintrules.TaintRules:
        if self._api is None:
            raise errors.KubeletDraError("taint bridge used before discovery")
        return self._api

    # -- events -----------------------------------------------------------------------

    def _emit(
        self, reason: str, key: models.DeviceKey, taint: policy.Taint | None, name: str
    ) -> None:
        t = self.thresholds
        device = claims.device_name(key, *self._resource_ids(key))
        if taint is not None:
            message = (
                f"Device {device} is {taint.value}: DeviceTaintRule {name} taints it "
                f"{t.key}={taint.value}:{t.effect}"
            )
            message += f" ({taint.message})" if taint.message else ""
            self.events.record(_node_ref(self.node), reason, message, kind="Warning")
        else:
            message = (
                f"Device {device} is Healthy for {t.untaint_after:g} s: "
                f"DeviceTaintRule {name} deleted"
            )
            self.events.record(_node_ref(self.node), reason, message, kind="Normal")

    async def flush_events(self) -> None:
        await self.events.flush(self._create_event, self._patch_event)

    async def _create_event(self, namespace: str, body: MutableObj) -> MutableObj:
        api = self._require_api()
        await self._budget.acquire(spare=True)
        answer: MutableObj = await asyncio.to_thread(api.create_event, namespace, body)
        return answer

    async def _patch_event(self, namespace: str, name: str, body: MutableObj) -> MutableObj:
        api = self._require_api()
        await self._budget.acquire(spare=True)
        answer: MutableObj = await asyncio.to_thread(api.patch_event, namespace, name, body)
        return answer


class TaintBridge:
    """DeviceTaintRules for one node; see the module docstring. Run :meth:`run` as a task.

    1. **Start**: load the tracks (``statefile``), wait until the streams are primed (the
       manager starts it after ``startup_grace``), discover the API version (``kube.taintrules``)
       and list this node's rules by label. If no version serves ``devicetaintrules``, or the
       API answers 403 (RBAC or the admission policy), the bridge turns *off*: one log line,
       the ``kubelet_dra_taint_bridge{state="off"}`` metric and a ``/readyz`` detail naming
       what is missing. Health still reaches pods; the bridge retries silently every resync
       interval and resumes if the API or the permission appears.
    2. **Observe**: every health change the pipeline sees (``observe``, called from the
       manager's change callback) updates the device's :class:`policy.Track`.
    3. **Reconcile**: each round applies the thresholds (:func:`policy.step`), plans the
       operations from the desired taints and this node's rules (:func:`planner.plan`),
       sends them (:class:`RuleSync`), then saves the tracks. Rounds run on every change
       (after the write window, so bursts coalesce), at the next threshold deadline, after a
       failure (backoff 1 to 30 s, relisting first) and every resync interval (a relist
       corrects what others changed).

    Only rules labelled with this node and ``managed-by: kubelet-dra-health`` are listed,
    changed or deleted; a name taken by someone else's rule makes the bridge use the hashed
    name. Requests share the status writer's QPS/burst budget (one ``kube.TokenBucket``): the
    bridge takes only spare tokens (``acquire(spare=True)``), so status writes go first.
    """

    def __init__(
        self,
        *,
        client: kube.ApiClient,
        node: str,
        settings: settings_mod.Settings,
        clock: clock_mod.Clock,
        health: models.HealthOf,
        devices: Callable[[], Iterable[models.DeviceKey]],
        resource_ids: Callable[[models.DeviceKey], tuple[str, str]] | None = None,
        budget: kube.TokenBucket | None = None,
        api_factory: Callable[[Any, str], taintrules.TaintRules] = taintrules.TaintRules,
        discover: Callable[[Any], str | None] = taintrules.discover,
    ) -> None:
        self.node = node
        self.thresholds = thresholds_of(settings)
        self.state = BridgeState.STARTING
        self.detail = "waiting for the first health reports"
        self.version: str | None = None
        self.tracks: dict[models.DeviceKey, policy.Track] = {}
        self.rounds = 0  # reconcile rounds done (tests wait on it)
        self.events = kube.EventRecorder(node=node, clock=clock, interval=settings.event_interval)
        # The device's (kubelet's, our) resourceID, to name it as pods do (claims.device_name).
        self._resource_ids = resource_ids or (lambda key: (str(key), str(key)))
        self.sync = RuleSync(
            client=client,
            node=node,
            thresholds=self.thresholds,
            budget=budget
            or kube.TokenBucket(qps=settings.api_qps, burst=settings.api_burst, clock=clock),
            events=self.events,
            clock=clock,
            resync=settings.taint_resync_interval,
            resource_ids=self._resource_ids,
            api_factory=api_factory,
            discover=discover,
        )
        self.writes = self.sync.writes
        """DeviceTaintRule writes by (create|update|delete, ok|failed)."""
        self._clock, self._health, self._devices = clock, health, devices
        self._file = statefile.TaintStateFile(settings.state_dir)
        self._window = settings.write_window
        self._resync = settings.taint_resync_interval
        self._observing = False
        self._adopt = False
        self._dirty = False
        self._wake = clock_mod.Alarm(clock)
        self._backoff = BACKOFF_INITIAL
        self._retry_at: float | None = None
        self._store_failing = False

    # -- inputs -----------------------------------------------------------------------

    def observe(self, keys: Iterable[models.DeviceKey]) -> None:
        """Devices whose visible health may have changed (the manager's change callback)."""
        if not self._observing:
            return  # the first round observes every device
        now = self._clock.now()
        for key in keys:
            self._note(key, now)
        self._wake.set()

    def _note(self, key: models.DeviceKey, now: float) -> None:
        old = self.tracks.get(key)
        new = policy.observe(old, self._health(key, now).health, now)
        if new is not old:
            self.tracks[key] = new
            self._dirty = True

    # -- outputs ----------------------------------------------------------------------

    def readiness(self) -> str:
        if self.state is BridgeState.ACTIVE:
            return "ok"
        return f"{self.state}: {self.detail}"

    def rules_by_effect(self) -> collections.Counter[str]:
        """This node's DeviceTaintRules by effect (the manager turns them into metrics)."""
        return self.sync.rules_by_effect()

    # -- the task ---------------------------------------------------------------------

    async def run(self) -> None:
        loaded, existed = await asyncio.to_thread(self._load)
        self.tracks = loaded
        # Without a state file, rules found in the API are adopted: a lost state dir must
        # not untaint a device that is still broken.
        self._adopt = not existed
        if not planner.valid_label_value(self.node):
            self._turn_off(
                f"node name {self.node!r} cannot be the value of label {planner.NODE_LABEL} "
                "(at most 63 characters); the bridge does not run on this node"
            )
            return
        if not await self._start():
            await self._wait_until_usable()
        self._observing = True
        now = self._clock.now()
        for key in set(self._devices()) | set(self.tracks):
            self._note(key, now)
        await self._loop()

    def _load(self) -> tuple[dict[models.DeviceKey, policy.Track], bool]:
        existed = self._file.path.exists()
        return self._file.load(), existed

    async def _start(self) -> bool:
        """Discover the version and list; ``False`` (off, or retry later) if not possible."""
        delay = BACKOFF_INITIAL
        while True:
            try:
                version = await self.sync.connect()
                await self._relist()
            except BridgeOff as exc:
                self._turn_off(exc.detail)
                return False
            except kube.CallError as exc:
                if exc.status == 403:
                    self._turn_off(_forbidden(exc))
                    return False
                if self.state is BridgeState.OFF:
                    return False  # still off: the silent recheck failed
                self.detail = f"API not reachable yet: {exc}"
                logger.warning("taint bridge: %s; retrying in %.0f s", exc, delay)
                await self._clock.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX)
                continue
            if self.state is BridgeState.OFF:
                logger.warning("taint bridge: %s usable again; resuming", version)
            elif self.version is None:
                logger.info(
                    "taint bridge on: %s/%s, effect %s, key %s, node %s",
                    taintrules.GROUP, version, self.thresholds.effect, self.thresholds.key,
                    self.node,
                )  # fmt: skip
            self.version = version
            self.state, self.detail = BridgeState.ACTIVE, ""
            return True

    async def _wait_until_usable(self) -> None:
        """Off: look again every resync interval (RBAC applied later, an upgraded API)."""
        while True:
            await self._clock.sleep(self._resync)
            if await self._start():
                return

    def _turn_off(self, detail: str) -> None:
        if self.state is not BridgeState.OFF or self.detail != detail:
            logger.error("taint bridge off: %s; device health still reaches pods", detail)
        self.state, self.detail = BridgeState.OFF, detail

    async def _loop(self) -> None:
        while True:
            now = self._clock.now()
            deadline = self._step(now)
            if self._retry_at is None or now >= self._retry_at:
                await self._reconcile()
            if self.state is BridgeState.OFF:
                await self._wait_until_usable()
                continue
            await self._save()
            await self.sync.flush_events()
            self.rounds += 1
            wake_at = min(
                t
                for t in (deadline, self._retry_at, self.sync.resync_at, self.events.next_due())
                if t is not None
            )
            await self._sleep_or_wake(wake_at - self._clock.now())
            await self._clock.sleep(self._window)  # let a burst of changes coalesce

    def _step(self, now: float) -> float | None:
        """Apply the thresholds to every track; the earliest deadline ahead."""
        deadline: float | None = None
        for key, track in list(self.tracks.items()):
            message = self._health(key, now).message
            new, due = policy.step(track, self.thresholds, now, message)
            if new.forgettable:
                del self.tracks[key]
                self._dirty = True
                continue
            if new is not track:
                self.tracks[key] = new
                self._dirty = True
            if due is not None and (deadline is None or due < deadline):
                deadline = due
        return deadline

    # -- reconciling ------------------------------------------------------------------

    async def _reconcile(self) -> None:
        try:
            if self.sync.rules is None or self._clock.now() >= self.sync.resync_at:
                await self._relist()
            operations = planner.plan(
                self.tracks, self.sync.rules or {}, node=self.node, thresholds=self.thresholds,
                kubelet_id=lambda key: self._resource_ids(key)[0],
            )  # fmt: skip
            await self.sync.apply(operations, self._tainted)
        except kube.CallError as exc:
            if exc.status == 403:
                self._turn_off(_forbidden(exc))
                return
            self._retry_later(str(exc))
            return
        except Exception:
            # A bug, or an answer we did not expect, must not end the bridge's task.
            logger.exception("taint bridge: reconciling failed")
            self._retry_later("unexpected error")
            return
        self._retry_at = None
        self._backoff = BACKOFF_INITIAL

    def _tainted(self) -> set[models.DeviceKey]:
        return {key for key, track in self.tracks.items() if track.taint}

    def _retry_later(self, why: str) -> None:
        # The metrics keep showing the last rules known meanwhile.
        self.sync.forget()
        self._retry_at = self._clock.now() + self._backoff
        logger.warning("taint bridge: %s; retrying in %.0f s", why, self._backoff)
        self._backoff = min(self._backoff * 2, BACKOFF_MAX)

    async def _relist(self) -> None:
        await self.sync.relist()
        if self._adopt:
            self._adopt = False
            now = self._clock.now()
            found = planner.adopted(
                self.sync.rules or {}, self.tracks,
                health=lambda key: self._health(key, now).health, now=now,
            )  # fmt: skip
            if found:
                self.tracks.update(found)
                self._dirty = True

    # -- persistence ------------------------------------------------------------------

    async def _save(self) -> None:
        if not self._dirty:
            return
        snapshot = dict(self.tracks)
        self._dirty = False
        try:
            await asyncio.to_thread(self._file.save, snapshot)
        except errors.StoreError as exc:
            self._dirty = True
            if not self._store_failing:
                logger.error("%s; keeping the taint state in memory and retrying", exc)
            self._store_failing = True
            return
        if self._store_failing:
            logger.warning("taint state %s is writable again", self._file.path)
        self._store_failing = False

    async def _sleep_or_wake(self, delay: float) -> None:
        # A change observed meanwhile, due before the planned round, is not kept waiting.
        if delay > 0:
            await self._wake.sleep(delay)
        self._wake.clear()


def thresholds_of(settings: settings_mod.Settings) -> policy.Thresholds:
    """The policy's thresholds as ``--taint-*`` and ``--untaint-after`` set them."""
    return policy.Thresholds(
        effect=settings.taint_effect.value,
        key=settings.taint_key,
        taint_after=settings.taint_after,
        unknown_after=settings.taint_unknown_after,
        untaint_after=settings.untaint_after,
    )


def _node_ref(node: str) -> MutableObj:
    # Node events live in "default", as the kubelet's do.
    return {"apiVersion": "v1", "kind": "Node", "name": node, "namespace": "default", "uid": node}


def _forbidden(exc: kube.CallError) -> str:
    return (
        f"RBAC or admission: {exc} (the ClusterRole needs create, list, update and delete on "
        f"{taintrules.GROUP} {taintrules.RESOURCE}; see deploy/clusterrole.yaml)"
    )
