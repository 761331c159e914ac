"""The pod status writer: coalesced, rate-limited, conflict-safe, never losing the last state.

Part of ``kube``. Counterpart of the kubelet's status manager and
``pkg/util/pod`` ``PatchPodStatus``, and no request when nothing changed.

How a write is made (see :func:`json_patch`):

- a JSON patch of ``pods/<name>/status`` that sets only
  ``allocatedResourcesStatus`` of each changed container status and our
  condition, with ``test`` operations on what it assumes (the pod UID, the
  container's name at its index, the entries it replaces, the condition's
  type at its index). The kubelet sends the whole atomic ``containerStatuses``
  list; we do not, so a kubelet changing other fields meanwhile is no
  conflict. A failed test (422) or a 409 means someone else wrote first:
  re-read, re-plan, send again.
- Retries (tenacity, on the injected clock): 5xx, 429 (``Retry-After`` wins
  over the backoff) and lost connections. A pod is given up only when it is
  gone (404 or another UID); after the attempts run out it goes back into the
  dirty set with a per-pod exponential backoff (1 to 30 s), so its last state
  is written eventually without a retry storm.

Coalescing: ``mark_dirty`` puts pods in a set with the time each is due. The
window is leading-edge per pod: a pod not written within the last ``window``
is due at once; later changes wait until a window after its last write and
coalesce meanwhile. Each round writes every due pod's *latest* desired status
once, under a QPS/burst token bucket shared with every other request, so each
pod gets at most one write per window whatever the storm.

``--container-status``:

- ``on`` always writes ``allocatedResourcesStatus``; ``off`` never does;
- ``auto`` writes it unless the kubelet on this node writes it for that pod:
  entries for our names with resource IDs we would not produce (CDI IDs), or
  entries changed by someone else after our last write (a kubelet that
  rewrites container statuses without them). Then we leave the field to the
  kubelet for that pod and keep only the condition and events: no write war.

If the API server drops the field (its ``ResourceHealthStatus`` gate is off)
the response says so: we log it once, count it, post one Event on the node
and stop writing the field. A dropped ``message`` (gate
``ResourceHealthStatusMessage`` off) likewise stops us sending messages.

Terminated pods (the kubelet forgets their devices, kubernetes #132978): when
a pod turns Succeeded or Failed its claims and device health are frozen in a
bounded, time-limited record, and its status is written from that record, so
a failed batch pod shows the health its devices had when it failed.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import logging
import random
import re
import time
from collections.abc import Callable, Iterable
from typing import Any

import tenacity

from kubelet_dra import claims, errors, models, podstatus, settings
from kubelet_dra import clock as clock_mod
from kubelet_dra.kube import api as kube_api
from kubelet_dra.kube import events as kube_events

logger = logging.getLogger(__name__)

Obj = dict[str, Any]
HealthLookup = Callable[[models.DeviceKey, float], models.DeviceHealth]
TERMINAL = frozenset({"Succeeded", "Failed"})
RESULTS = ("ok", "conflict", "retried", "failed", "unchanged", "gone")
MAX_CONFLICTS = 5
_FIELDS = (claims.CONTAINERS, claims.INIT_CONTAINERS)
_EVENT_REASON = {
    models.HealthStatus.UNHEALTHY: (kube_events.DEVICE_UNHEALTHY, "Warning"),
    models.HealthStatus.HEALTHY: (kube_events.DEVICE_HEALTHY, "Normal"),
    models.HealthStatus.UNKNOWN: (kube_events.DEVICE_HEALTH_UNKNOWN, "Warning"),
}


class TokenBucket:
    """QPS/burst limiter on the injected clock (client-go's token bucket)."""

    def __init__(self, *, qps: float, burst: int, clock: clock_mod.Clock) -> None:
        self.qps, self.burst = qps, burst
        self._clock = clock
        self._tokens = float(burst)
        self._stamp = clock.now()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        async with self._lock:
            self._refill()
            while self._tokens < 1:
                await self._clock.sleep((1 - self._tokens) / self.qps)
                self._refill()
            self._tokens -= 1

    def _refill(self) -> None:
        now = self._clock.now()
        self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.qps)
        self._stamp = now


@dataclasses.dataclass
class WriterStats:
    """Plain counters for the metrics module to read at scrape time."""

    results: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    latencies: collections.deque[float] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=4096)
    )  # seconds per successful write, newest last
    requests: int = 0
    rounds: int = 0  # coalescing rounds run: the bound on writes per pod
    gate_off: bool = False
    message_gate_off: bool = False
    gate_off_detected: int = 0
    kubelet_owned_pods: int = 0
    postmortem_records: int = 0
    pending: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class _PostMortem:
    lookup: claims.FrozenClaims
    health: dict[models.DeviceKey, models.DeviceHealth]
    at: float
    expires: float


@dataclasses.dataclass(frozen=True, slots=True)
class _Written:
    rv: int
    entries: tuple[Any, ...]


class StatusWriter:
    """Writes pods' desired device status; fed by ``mark_dirty`` and pod updates."""

    def __init__(
        self,
        *,
        api: kube_api.Api,
        node_name: str,
        index: claims.ClaimIndex,
        health: HealthLookup,
        config: settings.Settings,
        clock: clock_mod.Clock,
        limiter: TokenBucket | None = None,
        events: kube_events.EventRecorder | None = None,
        concurrency: int = 8,
        max_attempts: int = 5,
    ) -> None:
        self.node = node_name
        self.stats = WriterStats()
        self.mode = config.container_status
        self._api, self._index, self._health, self._clock = api, index, health, clock
        self._cfg = config
        self._limiter = limiter or TokenBucket(
            qps=config.api_qps, burst=config.api_burst, clock=clock
        )
        self._events = events or kube_events.EventRecorder(
            node=node_name, clock=clock, interval=config.event_interval
        )
        self._sem = asyncio.Semaphore(concurrency)
        self._max_attempts = max_attempts
        self._pods: dict[str, Obj] = {}
        self._dirty: dict[str, float] = {}  # uid -> not before
        self._wake = asyncio.Event()
        self._records: collections.OrderedDict[str, _PostMortem] = collections.OrderedDict()
        self._written: dict[str, _Written] = {}
        self._last_write: dict[str, float] = {}  # uid -> when its last write was sent
        self._failures: dict[str, int] = {}  # uid -> failed writes in a row
        self._owned: set[str] = set()
        self._seen_health: dict[str, dict[models.DeviceKey, models.HealthStatus]] = {}
        self._known_health: dict[str, set[models.DeviceKey]] = {}
        self._with_message = True
        self._sidecars = True

    # -- inputs --------------------------------------------------------------

    def mark_dirty(self, pod_uids: Iterable[str]) -> None:
        """These pods' desired status may have changed; write them when due.

        The window is leading-edge per pod: a pod not written within the last
        window is due at once (a single change costs no wait), later changes
        wait until a window after its last write and are coalesced meanwhile.
        """
        now = self._clock.now()
        window = self._cfg.write_window
        for uid in pod_uids:
            due = max(now, self._last_write.get(uid, now - window) + window)
            self._dirty[uid] = min(self._dirty.get(uid, due), due)
        self.stats.pending = len(self._dirty)
        if self._dirty:
            self._wake.set()

    def pod_updated(self, pod: Obj) -> None:
        """A pod as the API shows it now (from the watch)."""
        uid = _uid(pod)
        old = self._pods.get(uid)
        if old is not None and _rv(old) > _rv(pod):
            return  # our own write's answer is newer than this watch event
        self._pods[uid] = pod
        if _phase(pod) in TERMINAL and (old is None or _phase(old) not in TERMINAL):
            self._record_termination(uid)
        self.mark_dirty([uid])

    def pod_deleted(self, uid: str) -> None:
        self._pods.pop(uid, None)
        self._dirty.pop(uid, None)
        self._records.pop(uid, None)
        self._written.pop(uid, None)
        self._last_write.pop(uid, None)
        self._failures.pop(uid, None)
        self._seen_health.pop(uid, None)
        self._known_health.pop(uid, None)
        self._owned.discard(uid)
        self._refresh_stats()

    # -- the loop ------------------------------------------------------------

    async def run(self) -> None:
        """Write dirty pods forever: each round writes the pods that are due."""
        while True:
            events_due = self._events.next_due()
            if not self._dirty and events_due is None:
                await self._wake.wait()
            self._wake.clear()
            # Folded event occurrences are sent once their interval passed,
            # even when no pod is dirty by then.
            due = [*self._dirty.values(), *([events_due] if events_due is not None else [])]
            soonest = min(due, default=self._clock.now())
            delay = soonest - self._clock.now()
            if delay > 0:
                # A pod marked meanwhile may be due earlier: wake for it too.
                await self._sleep_or_wake(delay)
                continue
            await self.round()

    async def round(self) -> None:
        """One coalescing round: write every due pod once, flush events, expire records."""
        self.stats.rounds += 1
        now = self._clock.now()
        due = [uid for uid, not_before in self._dirty.items() if not_before <= now]
        for uid in due:
            del self._dirty[uid]
        self.stats.pending = len(self._dirty)
        await asyncio.gather(*(self._guarded_sync(uid) for uid in due))
        await self._events.flush(self._create_event, self._patch_event)
        self._expire_records(self._clock.now())
        self._refresh_stats()

    @property
    def events(self) -> kube_events.EventRecorder:
        return self._events

    # -- one pod -------------------------------------------------------------

    async def _guarded_sync(self, uid: str) -> None:
        async with self._sem:
            try:
                await self._sync(uid)
            except Exception:
                logger.exception("Writing the device status of pod %s failed", uid)
                self._requeue(uid, 1.0)

    async def _sync(self, uid: str) -> None:
        pod = self._pods.get(uid)
        if pod is None or _node(pod) != self.node:
            return  # unknown, deleted, or not ours: never written
        desired = self._desired(uid, pod)
        self._emit_transitions(pod, desired)
        for _ in range(MAX_CONFLICTS):
            body = self._plan(uid, pod, desired)
            if body is None:
                self.stats.results["unchanged"] += 1
                return
            ops = json_patch(pod, body)
            try:
                answer = await self._send(pod, ops)
            except errors.PodGone:
                self.stats.results["gone"] += 1
                self.pod_deleted(uid)
                return
            except kube_api.CallError as exc:
                if exc.status in (409, 422):
                    fresh = await self._reread(pod)
                    # A failed `test` (422) means the pod changed under us: a
                    # conflict. If every test still holds, the 422 is the
                    # server refusing the content: handled below.
                    if exc.status == 409 or not assumptions_hold(fresh, ops):
                        self.stats.results["conflict"] += 1
                        pod = fresh
                        if _node(pod) != self.node:
                            return  # moved off this node meanwhile: not ours any more
                        continue
                if self._rejected_sidecars(exc, body):
                    continue
                self._failed(uid, pod, exc)
                return
            self._accepted(uid, body, answer, desired)
            return
        self._requeue(uid, self._cfg.write_window)

    def _desired(self, uid: str, pod: Obj) -> podstatus.Desired:
        record = self._records.get(uid)
        if record is not None:
            health: HealthLookup = lambda k, _now: record.health.get(k, models.UNKNOWN_DEVICE)  # noqa: E731
            lookup: claims.DeviceLookup = record.lookup
            at = record.at
        else:
            health, lookup, at = self._health, self._index, self._clock.now()
        return podstatus.desired_status(
            pod, index=lookup, health_of=lambda key: health(key, at), now=at,
            condition_type=self._cfg.pod_condition_type, with_message=self._with_message,
            sidecars=self._sidecars,
        )  # fmt: skip

    def _plan(self, uid: str, pod: Obj, desired: podstatus.Desired) -> Obj | None:
        """The status fields that change, as ``{"status": {...}}`` (see :func:`json_patch`)."""
        status = pod.get("status") or {}
        with_containers = self._container_status_on(uid, pod, desired)
        new, changed = podstatus.merge(
            status, desired, now=self._clock.now(), container_status=with_containers,
            condition=bool(self._cfg.pod_condition_type),
        )  # fmt: skip
        if not changed:
            return None
        patch: Obj = {}
        for field in _FIELDS:
            if new.get(field) != status.get(field):
                patch[field] = new.get(field) or []
        ours = podstatus.find_condition(new, self._cfg.pod_condition_type)
        if ours is not None and ours != podstatus.find_condition(status, ours["type"]):
            patch["conditions"] = [ours]
        return {"status": patch} if patch else None

    async def _send(self, pod: Obj, ops: list[Obj]) -> Obj:
        meta = pod.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name"))
        started = time.perf_counter()
        self._last_write[_uid(pod)] = self._clock.now()
        answer = await self._call(self._api.json_patch_pod_status, namespace, name, ops)
        self.stats.latencies.append(time.perf_counter() - started)
        return answer

    async def _call(self, fn: Callable[..., Obj], *args: Any) -> Obj:
        retrying = tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception(_transient),
            wait=self._wait,
            stop=tenacity.stop_after_attempt(self._max_attempts),
            sleep=self._clock.sleep,
            before_sleep=self._count_retry,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                await self._limiter.acquire()
                self.stats.requests += 1
                return await asyncio.to_thread(fn, *args)
        raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover

    def _wait(self, state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        retry_after = getattr(exc, "retry_after", None)
        if retry_after is not None:
            return float(retry_after)
        return float(min(5.0, 0.1 * 2 ** (state.attempt_number - 1)) * random.uniform(0.5, 1.0))

    def _count_retry(self, state: tenacity.RetryCallState) -> None:
        self.stats.results["retried"] += 1

    async def _reread(self, pod: Obj) -> Obj:
        meta = pod.get("metadata") or {}
        fresh = await self._call(
            self._api.get_pod, str(meta.get("namespace") or "default"), str(meta.get("name"))
        )
        if _uid(fresh) != _uid(pod):
            raise errors.PodGone(f"pod {meta.get('name')} was replaced", status=409)
        self._pods[_uid(pod)] = fresh
        return fresh

    def _accepted(self, uid: str, body: Obj, answer: Obj, desired: podstatus.Desired) -> None:
        self.stats.results["ok"] += 1
        self._failures.pop(uid, None)
        if _uid(answer) == uid:
            self._pods[uid] = answer
        self._check_gates(body, answer)
        sent = body["status"]
        if any(field in sent for field in _FIELDS):
            self._written[uid] = _Written(_rv(answer), _managed_entries(answer, desired))

    def _failed(self, uid: str, pod: Obj, exc: kube_api.CallError) -> None:
        self.stats.results["failed"] += 1
        streak = self._failures[uid] = self._failures.get(uid, 0) + 1
        meta = pod.get("metadata") or {}
        # One warning per streak of failures, not one per retry of a long outage.
        logger.log(
            logging.WARNING if streak == 1 else logging.DEBUG,
            "Device status of pod %s/%s not written (attempt %d): %s",
            meta.get("namespace"), meta.get("name"), streak, exc,
        )  # fmt: skip
        if exc.status is None or exc.status == 429 or exc.status >= 500:
            # Still transient: never drop the last state, but back off per pod
            # (1, 2, 4 ... 30 s, with jitter) so an outage is no retry storm.
            delay = min(FAILED_RETRY_MAX, 2.0 ** (streak - 1)) * random.uniform(0.8, 1.2)
            self._requeue(uid, delay)

    def _requeue(self, uid: str, delay: float) -> None:
        if uid in self._pods:
            self._dirty[uid] = self._clock.now() + delay
            self.stats.pending = len(self._dirty)
            self._wake.set()

    def _rejected_sidecars(self, exc: kube_api.CallError, body: Obj) -> bool:
        # Validation of initContainerStatuses' health entries is not verified
        # upstream: if the server refuses them, stop sending them.
        if exc.status != 422 or claims.INIT_CONTAINERS not in body["status"] or not self._sidecars:
            return False
        logger.warning("API server refuses device health on init containers; skipping them")
        self._sidecars = False
        return True

    # -- modes and gates -----------------------------------------------------

    def _container_status_on(self, uid: str, pod: Obj, desired: podstatus.Desired) -> bool:
        if self.mode is settings.ContainerStatusMode.OFF or self.stats.gate_off:
            return False
        if self.mode is settings.ContainerStatusMode.ON:
            return True
        if uid not in self._owned and self._kubelet_writes(uid, pod, desired):
            self._owned.add(uid)
            logger.info(
                "The kubelet writes device health for pod %s; leaving that field to it",
                (pod.get("metadata") or {}).get("name"),
            )
        return uid not in self._owned

    def _kubelet_writes(self, uid: str, pod: Obj, desired: podstatus.Desired) -> bool:
        status = pod.get("status") or {}
        last = self._written.get(uid)
        if last is not None:
            current = _managed_entries(pod, desired)
            return _rv(pod) > last.rv and current != last.entries
        for (field, container), managed in desired.containers.items():
            for entry in podstatus.container_entries(status, field, container):
                want = managed.get(entry.get("name", ""))
                if entry.get("name") in managed and _ids(entry) != _ids(want):
                    return True
        return False

    def _check_gates(self, body: Obj, answer: Obj) -> None:
        sent, got = body["status"], answer.get("status") or {}
        for field in _FIELDS:
            for cs in sent.get(field) or ():
                entries = cs.get("allocatedResourcesStatus")
                echoed = podstatus.container_entries(got, field, cs.get("name", ""))
                if entries and not echoed:
                    self._gate_off()
                    return
                if _has_message(entries) and not _has_message(echoed):
                    self._message_gate_off()

    def _gate_off(self) -> None:
        if self.stats.gate_off:
            return
        self.stats.gate_off = True
        self.stats.gate_off_detected += 1
        logger.error(
            "The API server drops containerStatuses[].allocatedResourcesStatus: its "
            "ResourceHealthStatus feature gate is off. Writing only the pod condition from now on."
        )
        self._events.record(
            kube_events.node_ref(self.node), "ResourceHealthStatusDisabled",
            "The API server drops allocatedResourcesStatus (feature gate ResourceHealthStatus "
            "off); only the device-health condition is written", kind="Warning",
        )  # fmt: skip

    def _message_gate_off(self) -> None:
        if not self.stats.message_gate_off:
            self.stats.message_gate_off = True
            self._with_message = False
            logger.warning(
                "The API server drops allocatedResourcesStatus messages "
                "(feature gate ResourceHealthStatusMessage off); sending health without them"
            )

    # -- terminated pods -----------------------------------------------------

    def _record_termination(self, uid: str) -> None:
        now = self._clock.now()
        lookup = self._index.snapshot(uid)
        health = {k: self._health(k, now) for k in lookup.device_keys()}
        self._records[uid] = _PostMortem(lookup, health, now, now + self._cfg.terminated_pod_ttl)
        while len(self._records) > self._cfg.terminated_pod_max:
            self._records.popitem(last=False)
        self._refresh_stats()

    def _expire_records(self, now: float) -> None:
        for uid in [u for u, r in self._records.items() if r.expires <= now]:
            del self._records[uid]

    def has_record(self, uid: str) -> bool:
        return uid in self._records

    # -- events --------------------------------------------------------------

    def _emit_transitions(self, pod: Obj, desired: podstatus.Desired) -> None:
        uid = _uid(pod)
        seen = self._seen_health.setdefault(uid, {})
        known = self._known_health.setdefault(uid, set())
        for state in desired.devices:
            before = seen.get(state.key)
            seen[state.key] = state.health
            # Until a device was once Healthy or Unhealthy (a fresh pod, a
            # sidecar restart), Unknown and then Healthy are not news.
            first_and_boring = (
                state.key not in known and state.health is not models.HealthStatus.UNHEALTHY
            )
            if state.health is not models.HealthStatus.UNKNOWN:
                known.add(state.key)
            if before == state.health or first_and_boring:
                continue
            reason, kind = _EVENT_REASON[state.health]
            message = f"Device {state.key} (claim {state.claim_ref}) is {state.health}"
            message += f": {state.message}" if state.message else ""
            self._events.record(kube_events.pod_ref(pod), reason, message, kind=kind)

    async def _create_event(self, namespace: str, body: Obj) -> Obj:
        return await self._call(self._api.create_event, namespace, body)

    async def _patch_event(self, namespace: str, name: str, body: Obj) -> Obj:
        return await self._call(self._api.patch_event, namespace, name, body)

    # -- internals -----------------------------------------------------------

    async def _sleep_or_wake(self, delay: float) -> None:
        sleeper = asyncio.ensure_future(self._clock.sleep(delay))
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({sleeper, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            woken.cancel()

    def _refresh_stats(self) -> None:
        self.stats.pending = len(self._dirty)
        self.stats.kubelet_owned_pods = len(self._owned)
        self.stats.postmortem_records = len(self._records)


_ARS = "allocatedResourcesStatus"
FAILED_RETRY_MAX = 30.0
"""Longest wait before retrying a pod whose write failed transiently, seconds."""


def json_patch(pod: Obj, plan: Obj) -> list[Obj]:
    """The write of ``plan`` (the changed status fields) as a JSON patch that
    tests what it assumes.

    Only our field of each changed container status is sent, with a ``test``
    of the container's name at that index and of the entries it replaces (so
    a concurrent writer's device-plugin entries are never clobbered); our
    condition replaces the one of its type at a tested index. Only adding a
    first condition or a whole list (never expected) is guarded by the
    resourceVersion. Compared with sending the whole atomic
    ``containerStatuses`` list under a resourceVersion precondition, a
    kubelet updating other fields meanwhile causes no conflict, and the
    request is a fraction of the size.
    """
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    ops: list[Obj] = [{"op": "test", "path": "/metadata/uid", "value": meta.get("uid")}]
    sent = plan["status"]
    for field in _FIELDS:
        if field in sent:
            ops += _container_ops(field, status.get(field) or [], sent[field], meta)
    for condition in sent.get("conditions") or ():
        ops += _condition_ops(status.get("conditions"), condition, meta)
    return ops


def _rv_test(meta: Obj) -> Obj:
    return {"op": "test", "path": "/metadata/resourceVersion", "value": meta.get("resourceVersion")}


def _container_ops(field: str, old: list[Obj], new: list[Obj], meta: Obj) -> list[Obj]:
    if [c.get("name") for c in old] != [c.get("name") for c in new]:
        # merge() never adds or drops container statuses; be safe anyway.
        return [_rv_test(meta), {"op": "add", "path": f"/status/{field}", "value": new}]
    ops: list[Obj] = []
    for i, (before, after) in enumerate(zip(old, new, strict=True)):
        if before.get(_ARS) == after.get(_ARS):
            continue
        path = f"/status/{field}/{i}"
        ops.append({"op": "test", "path": f"{path}/name", "value": after.get("name")})
        if _ARS in before:
            ops.append(_guard(f"{path}/{_ARS}", before[_ARS], meta))
        if _ARS in after:
            ops.append({"op": "add", "path": f"{path}/{_ARS}", "value": after[_ARS]})
        else:
            ops.append({"op": "remove", "path": f"{path}/{_ARS}"})
    return ops


def _guard(path: str, value: Any, meta: Obj) -> Obj:
    """A ``test`` that ``path`` still holds ``value``, or the resourceVersion's.

    The apiserver's JSON patch library compares scalars by their raw JSON
    text, and the client escapes differently from Go (non-ASCII, ``<>&``,
    control characters): such a value would never test equal, found with a
    real kube-apiserver. Those fall back to the resourceVersion.
    """
    text = json.dumps(value)
    if text.isascii() and not _GO_ESCAPED.search(text):
        return {"op": "test", "path": path, "value": value}
    return _rv_test(meta)


_GO_ESCAPED = re.compile(r"[<>&]|\\u00|\\[bf]")


def _condition_ops(old: list[Obj] | None, ours: Obj, meta: Obj) -> list[Obj]:
    for j, condition in enumerate(old or ()):
        if condition.get("type") == ours["type"]:
            path = f"/status/conditions/{j}"
            return [
                {"op": "test", "path": f"{path}/type", "value": ours["type"]},
                {"op": "replace", "path": path, "value": ours},
            ]
    if old is None:
        return [_rv_test(meta), {"op": "add", "path": "/status/conditions", "value": [ours]}]
    return [_rv_test(meta), {"op": "add", "path": "/status/conditions/-", "value": ours}]


def assumptions_hold(pod: Obj, ops: list[Obj]) -> bool:
    """Whether every ``test`` of ``ops`` holds on ``pod``."""
    return all(_resolve(pod, op["path"]) == op["value"] for op in ops if op["op"] == "test")


_MISSING = object()


def _resolve(doc: Any, pointer: str) -> Any:
    for raw in pointer.split("/")[1:]:
        token = raw.replace("~1", "/").replace("~0", "~")
        try:
            doc = doc[int(token)] if isinstance(doc, list) else doc[token]
        except (KeyError, IndexError, ValueError, TypeError):
            return _MISSING
    return doc


def _transient(exc: BaseException) -> bool:
    return (
        isinstance(exc, kube_api.CallError)
        and not isinstance(exc, errors.PodGone)
        and (exc.transient)
    )


def _managed_entries(pod: Obj, desired: podstatus.Desired) -> tuple[Any, ...]:
    """Normalized entries of the containers we manage, to compare across writes."""
    status = pod.get("status") or {}
    keys = sorted(desired.containers)
    return tuple(
        (key, podstatus.normalized(podstatus.container_entries(status, *key))) for key in keys
    )


def _ids(entry: Obj | None) -> set[str]:
    return {str(r.get("resourceID")) for r in (entry or {}).get("resources") or ()}


def _has_message(entries: Iterable[Obj] | None) -> bool:
    return any(r.get("message") for e in entries or () for r in e.get("resources") or ())


def _uid(pod: Obj) -> str:
    return str((pod.get("metadata") or {}).get("uid", ""))


def _node(pod: Obj) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def _phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def _rv(pod: Obj) -> int:
    try:
        return int((pod.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0
