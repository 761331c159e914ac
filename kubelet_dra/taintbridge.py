"""The taint bridge: DeviceTaintRules for this node's unhealthy devices, reconciled.

No kubelet counterpart (the kubelet stops at pod status); the pattern is KEP-5055's
"an external health monitor creates DeviceTaintRules". Off unless ``--taint-effect`` names
an effect. :class:`TaintBridge` runs as one task of the manager:

1. **Start**: load the tracks (``_taint_state``), wait until the streams are primed (the
   manager starts it after ``startup_grace``), discover the API version (``kube.taintrules``)
   and list this node's rules by label. If no version serves ``devicetaintrules``, or the
   API answers 403 (RBAC or the admission policy), the bridge turns *off*: one log line,
   the ``kubelet_dra_taint_bridge{state="off"}`` metric and a ``/readyz`` detail naming
   what is missing. Health still reaches pods; the bridge retries silently every resync
   interval and resumes if the API or the permission appears.
2. **Observe**: every health change the pipeline sees (``observe``, called from the
   manager's change callback) updates the device's :class:`taints.Track`.
3. **Reconcile**: each round applies the thresholds (:func:`taints.step`), compares the
   desired rules with this node's rules and creates, updates or deletes only what
   differs, then saves the tracks. Rounds run on every change (after the write window, so
   bursts coalesce), at the next threshold deadline, after a failure (backoff 1 to 30 s,
   relisting first) and every resync interval (a relist corrects what others changed).

Only rules labelled with this node and ``managed-by: kubelet-dra-health`` are listed,
changed or deleted; a name taken by someone else's rule makes the bridge use the hashed
name. Requests share the status writer's QPS/burst budget (:class:`SharedBudget`): status
writes go first, the bridge takes what is left.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Iterable
from typing import Any

from kubelet_dra import _taint_state, errors, kube, metrics, models, taints
from kubelet_dra import clock as clock_mod
from kubelet_dra import settings as settings_mod
from kubelet_dra.kube import taintrules
from kubelet_dra.status import claims

logger = logging.getLogger(__name__)

Obj = dict[str, Any]
HealthLookup = Callable[[models.DeviceKey, float], models.DeviceHealth]
STATES = ("starting", "active", "off")
OPS = ("create", "update", "delete")
EFFECTS = ("None", "NoSchedule", "NoExecute")
DEVICE_TAINTED = "DeviceTainted"
DEVICE_UNTAINTED = "DeviceUntainted"
BACKOFF_INITIAL = 1.0
BACKOFF_MAX = 30.0


class SharedBudget(kube.TokenBucket):
    """The status writer's QPS/burst token bucket with a second, lower-priority door.

    The writer calls :meth:`acquire` as before; the bridge calls :meth:`acquire_spare`,
    which takes a token only while no status write is waiting for one (and, since issue
    15, only while more than half the burst would be left, as the writer's Events do:
    ``kube.calls.TokenBucket``). So the two share one budget (the node's load on the API
    server stays what ``--api-qps``/``--api-burst`` allow) and a storm of pod writes is
    never slowed down by taint rules.
    """

    async def acquire_spare(self) -> None:
        await self.acquire(spare=True)


class BridgeOff(Exception):
    """The bridge cannot work here; ``detail`` says what is missing."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class TaintBridge:
    """DeviceTaintRules for one node; see the module docstring. Run :meth:`run` as a task."""

    def __init__(
        self,
        *,
        client: Any,
        node: str,
        settings: settings_mod.Settings,
        clock: clock_mod.Clock,
        health: HealthLookup,
        devices: Callable[[], Iterable[models.DeviceKey]],
        resource_ids: Callable[[models.DeviceKey], tuple[str, str]] | None = None,
        budget: SharedBudget | None = None,
        api_factory: Callable[[Any, str], taintrules.TaintRules] = taintrules.TaintRules,
        discover: Callable[[Any], str | None] = taintrules.discover,
    ) -> None:
        self.node = node
        self.thresholds = taints.Thresholds(
            effect=settings.taint_effect.value,
            key=settings.taint_key,
            taint_after=settings.taint_after,
            unknown_after=settings.taint_unknown_after,
            untaint_after=settings.untaint_after,
        )
        self.state = "starting"
        self.detail = "waiting for the first health reports"
        self.version: str | None = None
        self.writes: collections.Counter[tuple[str, str]] = collections.Counter()
        self.tracks: dict[models.DeviceKey, taints.Track] = {}
        self.rounds = 0  # reconcile rounds done (tests wait on it)
        self.events = kube.EventRecorder(node=node, clock=clock, interval=settings.event_interval)
        self._client, self._clock, self._health, self._devices = client, clock, health, devices
        # The device's (kubelet's, our) resourceID, to name it as pods do (claims.device_name).
        self._resource_ids = resource_ids or (lambda key: (str(key), str(key)))
        self._budget = budget or SharedBudget(
            qps=settings.api_qps, burst=settings.api_burst, clock=clock
        )
        self._api_factory, self._discover = api_factory, discover
        self._api: taintrules.TaintRules | None = None
        self._store = _taint_state.TaintState(settings.state_dir)
        self._window = settings.write_window
        self._resync = settings.taint_resync_interval
        self._rules: dict[str, Obj] | None = None  # name -> our rule, None: list first
        self._known: dict[str, Obj] = {}  # the last rules listed, for metrics while relisting
        self._observing = False
        self._adopt = False
        self._dirty = False
        self._wake = asyncio.Event()
        self._backoff = BACKOFF_INITIAL
        self._retry_at: float | None = None
        self._resync_at = 0.0
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
        new = taints.observe(old, self._health(key, now).health, now)
        if new is not old:
            self.tracks[key] = new
            self._dirty = True

    # -- outputs ----------------------------------------------------------------------

    def readiness(self) -> str:
        if self.state == "active":
            return "ok"
        return f"{self.state}: {self.detail}"

    def metric_state(self) -> metrics.TaintState:
        rules = dict.fromkeys(EFFECTS, 0)
        for rule in (self._rules if self._rules is not None else self._known).values():
            effect = str(((rule.get("spec") or {}).get("taint") or {}).get("effect") or "")
            rules[effect] = rules.get(effect, 0) + 1
        writes = {(op, result): 0 for op in OPS for result in ("ok", "failed")}
        writes.update(self.writes)
        return metrics.TaintState(self.state, rules, writes)

    # -- the task ---------------------------------------------------------------------

    async def run(self) -> None:
        loaded, existed = await asyncio.to_thread(self._load)
        self.tracks = loaded
        # Without a state file, rules found in the API are adopted: a lost state dir must
        # not untaint a device that is still broken.
        self._adopt = not existed
        if not taints.valid_label_value(self.node):
            self._turn_off(
                f"node name {self.node!r} cannot be the value of label {taints.NODE_LABEL} "
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

    def _load(self) -> tuple[dict[models.DeviceKey, taints.Track], bool]:
        existed = self._store.path.exists()
        return self._store.load(), existed

    async def _start(self) -> bool:
        """Discover the version and list; ``False`` (off, or retry later) if not possible."""
        delay = BACKOFF_INITIAL
        while True:
            try:
                await self._budget.acquire_spare()
                version = await asyncio.to_thread(self._discover, self._client)
                if version is None:
                    raise BridgeOff(
                        f"API: {taintrules.GROUP} serves no {taintrules.RESOURCE} in "
                        f"{', '.join(taintrules.VERSIONS)} (Kubernetes 1.33+ with "
                        "DRADeviceTaintRules; GA in 1.37)"
                    )
                self._api = self._api_factory(self._client, version)
                await self._relist()
            except BridgeOff as exc:
                self._turn_off(exc.detail)
                return False
            except kube.CallError as exc:
                if exc.status == 403:
                    self._turn_off(_forbidden(exc))
                    return False
                if self.state == "off":
                    return False  # still off: the silent recheck failed
                self.detail = f"API not reachable yet: {exc}"
                logger.warning("taint bridge: %s; retrying in %.0f s", exc, delay)
                await self._clock.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX)
                continue
            if self.state == "off":
                logger.warning("taint bridge: %s usable again; resuming", version)
            elif self.version is None:
                logger.info(
                    "taint bridge on: %s/%s, effect %s, key %s, node %s",
                    taintrules.GROUP, version, self.thresholds.effect, self.thresholds.key,
                    self.node,
                )  # fmt: skip
            self.version = version
            self.state, self.detail = "active", ""
            return True

    async def _wait_until_usable(self) -> None:
        """Off: look again every resync interval (RBAC applied later, an upgraded API)."""
        while True:
            await self._clock.sleep(self._resync)
            if await self._start():
                return

    def _turn_off(self, detail: str) -> None:
        if self.state != "off" or self.detail != detail:
            logger.error("taint bridge off: %s; device health still reaches pods", detail)
        self.state, self.detail = "off", detail

    async def _loop(self) -> None:
        while True:
            now = self._clock.now()
            deadline = self._step(now)
            if self._retry_at is None or now >= self._retry_at:
                await self._reconcile()
            if self.state == "off":
                await self._wait_until_usable()
                continue
            await self._save()
            await self.events.flush(self._create_event, self._patch_event)
            self.rounds += 1
            wake_at = min(
                t
                for t in (deadline, self._retry_at, self._resync_at, self.events.next_due())
                if t is not None
            )
            await self._sleep_or_wake(wake_at - self._clock.now())
            await self._clock.sleep(self._window)  # let a burst of changes coalesce

    def _step(self, now: float) -> float | None:
        """Apply the thresholds to every track; the earliest deadline ahead."""
        deadline: float | None = None
        for key, track in list(self.tracks.items()):
            new, due = taints.step(track, self.thresholds, now, self._health(key, now).message)
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
            if self._rules is None or self._clock.now() >= self._resync_at:
                await self._relist()
            await self._apply()
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

    def _retry_later(self, why: str) -> None:
        # The API may have done more than it answered: list again first. The metrics keep
        # showing the last rules known meanwhile.
        self._known = self._rules if self._rules is not None else self._known
        self._rules = None
        self._retry_at = self._clock.now() + self._backoff
        logger.warning("taint bridge: %s; retrying in %.0f s", why, self._backoff)
        self._backoff = min(self._backoff * 2, BACKOFF_MAX)

    async def _relist(self) -> None:
        api = self._require_api()
        await self._budget.acquire_spare()
        items = await asyncio.to_thread(api.list, taints.node_selector(self.node))
        # The label selector already filters; checking again costs nothing and keeps a
        # misbehaving server (or a selector typo) from ever handing us another's rule.
        self._rules = {
            str(rule["metadata"]["name"]): rule
            for rule in items
            if self._is_ours(rule) and rule["metadata"].get("name")
        }
        self._resync_at = self._clock.now() + self._resync
        if self._adopt:
            self._adopt = False
            self._adopt_rules(self._clock.now())

    def _adopt_rules(self, now: float) -> None:
        for rule in (self._rules or {}).values():
            key = taints.device_of(rule)
            if key is None:
                continue
            track = self.tracks.get(key)
            if track is None or track.taint is None:
                health = self._health(key, now).health
                self.tracks[key] = taints.Track(health, now, taints.taint_from_rule(rule, now))
                self._dirty = True

    def _is_ours(self, rule: Obj) -> bool:
        if not isinstance(rule.get("metadata"), dict):
            return False
        labels = rule["metadata"].get("labels") or {}
        return bool(
            labels.get(taints.MANAGED_BY_LABEL) == taints.MANAGED_BY
            and labels.get(taints.NODE_LABEL) == self.node
        )

    async def _apply(self) -> None:
        rules = self._rules if self._rules is not None else {}
        desired = {key: t.taint for key, t in self.tracks.items() if t.taint is not None}
        existing: dict[models.DeviceKey, Obj] = {}
        surplus: list[Obj] = []
        for name in sorted(rules):
            key = taints.device_of(rules[name])
            if key is None or key not in desired or key in existing:
                surplus.append(rules[name])
            else:
                existing[key] = rules[name]
        for key, taint in sorted(desired.items()):
            current = existing.get(key)
            if current is None:
                await self._create(key, taint)
            else:
                body = taints.rule_body(
                    current["metadata"]["name"], self.node, key, taint, self.thresholds,
                    kubelet_id=self._resource_ids(key)[0],
                )  # fmt: skip
                if taints.differs(current, body):
                    await self._update(current, body)
        for rule in surplus:
            await self._delete(rule)

    async def _create(self, key: models.DeviceKey, taint: taints.Taint) -> None:
        api = self._require_api()
        for hashed in (False, True):
            name = taints.rule_name(self.node, key, hashed=hashed)
            body = taints.rule_body(
                name, self.node, key, taint, self.thresholds, kubelet_id=self._resource_ids(key)[0]
            )
            try:
                created = await self._write("create", api.create, body)
            except kube.CallError as exc:
                if exc.status != 409:
                    raise
                # The name exists: ours from a create whose answer was lost, or someone
                # else's. A relist tells; only ours is adopted, never another's touched.
                await self._relist()
                if any(taints.device_of(r) == key for r in (self._rules or {}).values()):
                    return
                logger.warning(
                    "taint bridge: DeviceTaintRule %s belongs to someone else; using a hashed name",
                    name,
                )
                continue
            assert self._rules is not None
            self._rules[name] = created
            self._emit(DEVICE_TAINTED, key, taint, name)
            return
        logger.error("taint bridge: no free name for a rule of device %s", key)

    async def _update(self, current: Obj, body: Obj) -> None:
        api = self._require_api()
        name = str(current["metadata"]["name"])
        answer = await self._write("update", api.replace, taints.updated(current, body))
        assert self._rules is not None
        self._rules[name] = answer

    async def _delete(self, rule: Obj) -> None:
        api = self._require_api()
        meta = rule["metadata"]
        name = str(meta["name"])
        try:
            await self._write(
                "delete", api.delete, name, str(meta.get("uid", "")),
                str(meta.get("resourceVersion", "")),
            )  # fmt: skip
        except kube.CallError as exc:
            if exc.status != 404:
                raise
        assert self._rules is not None
        self._rules.pop(name, None)
        key = taints.device_of(rule)
        if key is not None and key not in {k for k, t in self.tracks.items() if t.taint}:
            self._emit(DEVICE_UNTAINTED, key, None, name)

    async def _write(self, op: str, fn: Callable[..., Any], *args: Any) -> Any:
        await self._budget.acquire_spare()
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

    # -- events, persistence ----------------------------------------------------------

    def _emit(
        self, reason: str, key: models.DeviceKey, taint: taints.Taint | None, name: str
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

    async def _create_event(self, namespace: str, body: Obj) -> Obj:
        api = self._require_api()
        await self._budget.acquire_spare()
        answer: Obj = await asyncio.to_thread(api.create_event, namespace, body)
        return answer

    async def _patch_event(self, namespace: str, name: str, body: Obj) -> Obj:
        api = self._require_api()
        await self._budget.acquire_spare()
        answer: Obj = await asyncio.to_thread(api.patch_event, namespace, name, body)
        return answer

    async def _save(self) -> None:
        if not self._dirty:
            return
        snapshot = dict(self.tracks)
        self._dirty = False
        try:
            await asyncio.to_thread(self._store.save, snapshot)
        except errors.StoreError as exc:
            self._dirty = True
            if not self._store_failing:
                logger.error("%s; keeping the taint state in memory and retrying", exc)
            self._store_failing = True
            return
        if self._store_failing:
            logger.warning("taint state %s is writable again", self._store.path)
        self._store_failing = False

    async def _sleep_or_wake(self, delay: float) -> None:
        await clock_mod.sleep_or_wake(self._clock, delay, self._wake)
        self._wake.clear()


def _node_ref(node: str) -> Obj:
    # Node events live in "default", as the kubelet's do.
    return {"apiVersion": "v1", "kind": "Node", "name": node, "namespace": "default", "uid": node}


def _forbidden(exc: kube.CallError) -> str:
    return (
        f"RBAC or admission: {exc} (the ClusterRole needs create, list, update and delete on "
        f"{taintrules.GROUP} {taintrules.RESOURCE}; see deploy/clusterrole.yaml)"
    )
