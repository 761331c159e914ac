"""The pod status writer: coalesced, rate-limited, conflict-safe, never losing the last state.

Counterpart of the kubelet's status manager (``pkg/kubelet/status``) and ``PatchPodStatus``
(``pkg/util/pod``). :class:`StatusWriter` runs the loop that writes each dirty pod's latest
desired status as a JSON patch planned by ``kube.patchplan``, with per-pod state in
``kube.podstate`` and the kubelet's and API server's handling of the field in ``kube.gates``;
its docstring says how a write is made, coalesced and retried, and how
``--container-status`` shares the field with the kubelet.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import logging
import random
import time
from collections.abc import Callable, Iterable
from typing import Any

from kubelet_dra import clock as clock_mod
from kubelet_dra import errors, models, settings
from kubelet_dra.kube import api as kube_api
from kubelet_dra.kube import calls, gates, patchplan, podstate
from kubelet_dra.kube import events as kube_events
from kubelet_dra.status import claims, podjson, podstatus
from kubelet_dra.status.podjson import Obj

logger = logging.getLogger(__name__)

#: Refusals not retried at once but again after the per-pod backoff: a restarted
#: kube-apiserver answers 403 to every non-admin user until its RBAC cache has
#: synced (seconds; measured in the fleet benchmark), and a rotated token
#: or a binding being created heals the same way. Dropping the write would lose
#: the change until the device changes again.
_LATER = (401, 403)

TERMINAL = frozenset({"Succeeded", "Failed"})
RESULTS = ("ok", "conflict", "retried", "failed", "unchanged", "gone")
MAX_CONFLICTS = 5


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
    kubelet_removes: bool = False  # the node's kubelet removes the field (its gate is off)
    field_removals: int = 0  # removals of our field seen, every pod
    field_rewrites: int = 0  # ``on``: rewrites of our field by the kubelet seen, every pod
    postmortem_records: int = 0
    pending: int = 0
    # Pods taken from the dirty set whose write has not ended yet: ``pending`` drops
    # when a round takes its pods, before their PATCH lands, so "nothing pending" alone
    # is no sign that the API holds what was decided (a reader that compares the pods
    # with another writer, as the conformance suite does, needs both at 0).
    in_flight: int = 0


class StatusWriter:
    """Writes pods' desired device status; fed by ``mark_dirty`` and pod updates.

    A write is a JSON patch of ``pods/<name>/status`` that sets only ``allocatedResourcesStatus``
    of each changed container status and our condition, with ``test`` operations on what it
    assumes (the pod UID, the container's name at its index, the entries it replaces, the
    condition's type at its index). The kubelet sends the whole atomic ``containerStatuses``
    list; we do not, so a kubelet changing other fields meanwhile is no conflict. A failed test
    (422) or a 409 means someone else wrote first: re-read, re-plan, send again. A re-read that
    finds another UID under the name (the pod was deleted and created again) gives the old pod up.

    Retries (tenacity, on the injected clock): 5xx, 429 (``Retry-After`` wins over the backoff)
    and lost connections. A pod is given up only when it is gone (404 or another UID); after the
    attempts run out it goes back into the dirty set with a per-pod exponential backoff (1 to
    30 s), so its last state is written eventually without a retry storm. A 401 or 403 takes
    that per-pod backoff at once (a restarted apiserver refuses non-admin users until its RBAC
    cache has synced; a fixed binding heals the same way). Jitter comes from an injected
    ``random.Random``, like the health streams' backoff.

    Coalescing: ``mark_dirty`` puts pods in a set with the time each is due. The window is
    leading-edge per pod: a pod not written within the last ``window`` is due at once; later
    changes wait until a window after its last write and coalesce meanwhile. Each round writes
    every due pod's *latest* desired status once, under the manager's one QPS/burst
    ``calls.TokenBucket`` (the taint bridge and Events take only spare tokens; pod lists,
    watches and claim reads take none), so each pod gets at most one write per window whatever
    the storm.

    ``--container-status``:

    - ``off`` never writes ``allocatedResourcesStatus``;
    - ``auto`` tells four cases apart (``podstate.kubelet_verdict``). The kubelet writes the
      field (entries for our names with resource IDs we would not produce, CDI IDs, or our
      entries changed by a later version): we leave it to the kubelet for that pod. The kubelet
      removes it (a later version lacks our entries where our write's answer had them; its
      ``ResourceHealthStatus`` gate is off): we stop writing the field on the whole node and say
      so once (``gates.KubeletGate``). The API server drops it (our own answer lacks it):
      ``gates.ServerGates``. Nobody touches it: we keep writing. The condition and Events go on
      in every case;
    - ``on`` always writes it, except that a field the kubelet removed, or rewrote with entries
      of its own (one under a CDI ID several devices share), is written again only after a
      per-pod backoff (``podstate.removal_backoff``: 10 s doubling to 5 min): at most one
      rewrite per pod per 5 minutes in steady state, not a write war.

    If the API server drops the field (its ``ResourceHealthStatus`` gate is off) the response
    says so: we log it once, count it, post one Event on the node and stop writing the field. A
    dropped ``message`` (gate ``ResourceHealthStatusMessage`` off) likewise stops us sending
    messages.

    Terminated pods (the kubelet forgets their devices, kubernetes #132978): when a pod turns
    Succeeded or Failed its claims and device health are frozen in a bounded, time-limited
    record, and its status is written from that record, so a failed batch pod shows the health
    its devices had when it failed.
    """

    def __init__(
        self,
        *,
        api: kube_api.Api,
        node_name: str,
        index: claims.ClaimIndex,
        health: models.HealthOf,
        config: settings.Settings,
        clock: clock_mod.Clock,
        limiter: calls.TokenBucket | None = None,
        events: kube_events.EventRecorder | None = None,
        concurrency: int | None = None,
        max_attempts: int = 5,
        rng: random.Random | None = None,
        kubelet_beside: Callable[[], bool] | None = None,
    ) -> None:
        self.node = node_name
        # Whether a kubelet runs on this node (the sidecar: its DRA checkpoint is there).
        self._kubelet_beside = kubelet_beside or (lambda: False)
        self.stats = WriterStats()
        self.mode = config.container_status
        self._api, self._index, self._health, self._clock = api, index, health, clock
        self._cfg = config
        self._events = events or kube_events.EventRecorder(
            node=node_name, clock=clock, interval=config.event_interval
        )
        self._rng = rng or random.Random()
        limiter = limiter or calls.TokenBucket(
            qps=config.api_qps, burst=config.api_burst, clock=clock
        )
        self._calls = calls.RetryingCaller(
            limiter=limiter,
            clock=clock, counts=self.stats, max_attempts=max_attempts, rng=self._rng,
        )  # fmt: skip
        self._gates = gates.ServerGates(node=node_name, events=self._events)
        self._kubelet = gates.KubeletGate(
            node=node_name, events=self._events, mode=self.mode,
            condition_type=config.pod_condition_type,
        )  # fmt: skip
        self._sem = asyncio.Semaphore(concurrency or config.write_concurrency)
        self._pods = podstate.PodStates()
        self._wake = clock_mod.Alarm(clock)  # marks, a finished flush, and when the next is due
        self._flushing: asyncio.Task[None] | None = None

    # -- inputs --------------------------------------------------------------

    def mark_dirty(self, pod_uids: Iterable[str]) -> None:
        """These pods' desired status may have changed; write them when due.

        The window is leading-edge per pod: a pod not written within the last
        window is due at once (a single change costs no wait), later changes
        wait until a window after its last write and are coalesced meanwhile.
        A pod the writer has not seen yet is marked when it arrives.
        """
        now = self._clock.now()
        for uid in pod_uids:
            self._pods.mark_dirty(uid, now, self._cfg.write_window)
        self._refresh_stats()
        if self._pods.pending:
            self._wake.set()

    def pod_updated(self, pod: Obj) -> None:
        """A pod as the API shows it now (from the watch)."""
        state = self._pods.get(podjson.uid(pod))
        if state is not None:
            known, seen = _rv(state.pod), _rv(pod)
            if known > seen or (known and known == seen):
                # Our own write's answer is newer than this watch event, or is this
                # very version (the echo of our write): nothing to plan again.
                return
        terminated = podjson.phase(pod) in TERMINAL and (
            state is None or podjson.phase(state.pod) not in TERMINAL
        )
        state = self._pods.put(pod)
        if terminated:
            self._record_termination(state)
        self.mark_dirty([state.uid])

    def pod_deleted(self, uid: str) -> None:
        """The pod is gone: forget all that was kept for it."""
        self._pods.drop(uid)
        self._refresh_stats()

    def state(self, uid: str) -> podstate.PodState | None:
        """What the writer keeps about a pod (read it, do not change it)."""
        return self._pods.get(uid)

    def has_record(self, uid: str) -> bool:
        """Whether a terminated pod's post-mortem record is kept."""
        state = self._pods.get(uid)
        return state is not None and state.record is not None

    @property
    def kubelet(self) -> gates.KubeletGate:
        """What the node's kubelet does with the field we write (read it, do not change it)."""
        return self._kubelet

    @property
    def events(self) -> kube_events.EventRecorder:
        """The recorder of device-health Events (flushed by each round)."""
        return self._events

    # -- the loop ------------------------------------------------------------

    async def run(self) -> None:
        """Write dirty pods forever: each round writes the pods that are due.

        Events are flushed by a task of their own on spare tokens, so the next
        round's status writes never wait behind an Event request.
        """
        try:
            await self._run()
        finally:
            await clock_mod.cancel_and_wait(self._flushing)
            await self._wake.aclose()
            await self.aclose()

    async def aclose(self) -> None:
        """Close the status PATCH's idle connections (writing again opens new ones)."""
        await self._api.aclose()

    async def _run(self) -> None:
        while True:
            delay = self._until_due()
            if delay is None:
                await self._wake.wait()  # nothing planned: the next mark wakes us
            elif delay > 0:
                # Until then, or at once when a pod is marked meanwhile. The loop
                # always waits on the one alarm (armed, it sets itself when the time
                # comes; an earlier armed time stays): a change arriving while a later
                # round is planned costs no task set-up and tear-down, as asyncio.wait
                # on a sleep would, and
                # a pod due now is written without looking at the events first
                # (measured: together 0.1 ms of a write's latency with the window).
                self._wake.clear()
                self._wake.arm(delay)
                await self._wake.wait()
                pods_due = self._pods.next_due()
                if pods_due is None or pods_due > self._clock.now():
                    continue
            self._wake.clear()
            await self._write_due()
            self._start_flush()

    def _until_due(self) -> float | None:
        """Seconds until a pod or a folded event occurrence is due; ``None``: nothing is."""
        # Folded event occurrences are sent once their interval passed,
        # even when no pod is dirty by then.
        flushing = self._flushing is not None and not self._flushing.done()
        events_due = None if flushing else self._events.next_due()
        due = [d for d in (self._pods.next_due(), events_due) if d is not None]
        return min(due) - self._clock.now() if due else None

    def _start_flush(self) -> None:
        if self._flushing is not None and not self._flushing.done():
            return
        events_due = self._events.next_due()
        if events_due is not None and events_due <= self._clock.now():
            self._flushing = asyncio.create_task(self._flush_events())
            self._flushing.add_done_callback(lambda _task: self._wake.set())

    async def round(self) -> None:
        """One coalescing round: write every due pod once, flush events, expire records."""
        await self._write_due()
        await self._flush_events()

    async def _write_due(self) -> None:
        self.stats.rounds += 1
        due = self._pods.take_due(self._clock.now())
        self.stats.in_flight = len(due)
        self._refresh_stats()
        try:
            if len(due) == 1:
                await self._guarded_sync(due[0])  # the usual single change: no task to schedule
            else:
                await asyncio.gather(*(self._guarded_sync(uid) for uid in due))
        finally:
            self.stats.in_flight = 0
        self._pods.expire_records(self._clock.now())
        self._refresh_stats()

    async def _flush_events(self) -> None:
        # Events take only tokens no status write is waiting for.
        await self._events.flush(
            functools.partial(self._calls.call, self._api.create_event, spare=True),
            functools.partial(self._calls.call, self._api.patch_event, spare=True),
        )

    # -- one pod -------------------------------------------------------------

    async def _guarded_sync(self, uid: str) -> None:
        async with self._sem:
            try:
                await self._sync(uid)
            except Exception:
                logger.exception("Writing the device status of pod %s failed", uid)
                self._requeue(uid, 1.0)

    async def _sync(self, uid: str) -> None:
        state = self._pods.get(uid)
        if state is None or podjson.node_name(state.pod) != self.node:
            return  # unknown, deleted, or not ours: never written
        desired = self._desired(state)
        for reason, kind, message in kube_events.health_transitions(
            desired.devices, state.seen_health, state.known_health
        ):
            self._events.record(kube_events.pod_ref(state.pod), reason, message, kind=kind)
        try:
            await self._write(state, desired)
        except errors.PodGone:
            # 404 on the write, or the re-read found another pod under the name.
            self.stats.results["gone"] += 1
            self.pod_deleted(uid)

    async def _write(self, state: podstate.PodState, desired: podstatus.Desired) -> None:
        """Plan, send; after a conflict re-read and plan again, at most MAX_CONFLICTS times."""
        pod = state.pod
        for _ in range(MAX_CONFLICTS):
            plan = self._plan(state, pod, desired)
            if plan is None:
                self.stats.results["unchanged"] += 1
                return
            state.sent(podstate.sent_entries((c.field, c.name), c.entries) for c in plan.containers)
            try:
                answer = await self._send(state, pod, list(plan.ops))
            except kube_api.CallError as exc:
                retry = await self._refused(state, pod, plan, exc)
                if retry is None:
                    return
                pod = retry
                if self._gates.sidecars_refused and claims.INIT_CONTAINERS in plan.fields:
                    desired = self._desired(state)  # plan again without them
                continue
            self._accepted(state, plan, answer, desired)
            if _listing(answer) != _listing(pod):
                # Listed by another writer (the kubelet starting the containers) after
                # the version we planned on, and applied before our patch: our ops test
                # only what they touch, so the answer holds that listing, and the watch
                # events after it are older than the answer or its echo. Plan again.
                self.mark_dirty([state.uid])
            return
        self._requeue(state.uid, self._cfg.write_window)

    async def _refused(
        self, state: podstate.PodState, pod: Obj, plan: patchplan.Plan, exc: kube_api.CallError
    ) -> Obj | None:
        """The pod to plan again with after a refusal, or ``None`` when done with it.

        Raises ``errors.PodGone`` when the re-read finds the pod gone or replaced.
        """
        if exc.status in (409, 422):
            fresh = await self._reread(state, pod)
            # A failed `test` (422) means the pod changed under us: a
            # conflict. If every test still holds, the 422 is the server
            # refusing the content: handled below.
            if exc.status == 409 or not patchplan.assumptions_hold(fresh, plan.ops):
                self.stats.results["conflict"] += 1
                if podjson.node_name(fresh) != self.node:
                    return None  # moved off this node meanwhile: not ours any more
                return fresh
        if self._gates.refused_sidecars(exc, plan):
            return pod
        self._failed(state, exc)
        return None

    def _desired(self, state: podstate.PodState) -> podstatus.Desired:
        record = state.record
        if record is not None:
            health: models.HealthOf = lambda k, _now: record.health.get(k, models.UNKNOWN_DEVICE)  # noqa: E731
            lookup: claims.DeviceLookup = record.lookup
            at = record.at
        else:
            health, lookup, at = self._health, self._index, self._clock.now()
        return podstatus.desired_status(
            state.pod, index=lookup, health_of=lambda key: health(key, at), now=at,
            condition_type=self._cfg.pod_condition_type,
            with_message=not self._gates.message_dropped,
            sidecars=not self._gates.sidecars_refused,
        )  # fmt: skip

    def _plan(
        self, state: podstate.PodState, pod: Obj, desired: podstatus.Desired
    ) -> patchplan.Plan | None:
        return patchplan.plan(
            pod, desired, now=self._clock.now(),
            container_status=self._container_status_on(state, pod, desired),
            condition=bool(self._cfg.pod_condition_type),
        )  # fmt: skip

    async def _send(
        self, state: podstate.PodState, pod: Obj, ops: list[dict[str, Any]]
    ) -> dict[str, Any]:
        started = time.perf_counter()
        state.last_write = self._clock.now()
        # Sent from the event loop (kube.asyncpatch): no hop into a worker thread.
        answer = await self._calls.call(
            self._api.json_patch_pod_status_async, podjson.namespace(pod), podjson.name(pod), ops
        )
        self.stats.latencies.append(time.perf_counter() - started)
        return answer

    async def _reread(self, state: podstate.PodState, pod: Obj) -> Obj:
        fresh = await self._calls.call(self._api.get_pod, podjson.namespace(pod), podjson.name(pod))
        if podjson.uid(fresh) != state.uid:
            raise errors.PodGone(f"pod {podjson.name(pod)} was replaced", status=409)
        _take_newer(state, fresh)
        return state.pod

    def _accepted(
        self,
        state: podstate.PodState,
        plan: patchplan.Plan,
        answer: Obj,
        desired: podstatus.Desired,
    ) -> None:
        self.stats.results["ok"] += 1
        state.failures = 0
        if podjson.uid(answer) == state.uid:
            _take_newer(state, answer)
        self._gates.check_answer(plan, answer)
        if plan.containers:
            entries = podstate.managed_entries(answer, desired)
            state.confirmed(podstate.Written(_rv(answer), entries))

    def _failed(self, state: podstate.PodState, exc: kube_api.CallError) -> None:
        self.stats.results["failed"] += 1
        state.failures += 1
        # One warning per streak of failures, not one per retry of a long outage.
        logger.log(
            logging.WARNING if state.failures == 1 else logging.DEBUG,
            "Device status of pod %s/%s not written (attempt %d): %s",
            podjson.namespace(state.pod), podjson.name(state.pod), state.failures, exc,
        )  # fmt: skip
        if kube_api.is_transient(exc) or exc.status in _LATER:
            # Still transient: never drop the last state, but back off per pod
            # so an outage is no retry storm.
            self._requeue(state.uid, podstate.failure_backoff(state.failures, self._rng))

    def _requeue(self, uid: str, delay: float) -> None:
        self._pods.requeue(uid, self._clock.now() + delay)
        self._refresh_stats()
        if self._pods.pending:
            self._wake.set()

    # -- modes ---------------------------------------------------------------

    def _container_status_on(
        self, state: podstate.PodState, pod: Obj, desired: podstatus.Desired
    ) -> bool:
        if self.mode is settings.ContainerStatusMode.OFF or self._gates.health_dropped:
            return False
        beside = self._kubelet_beside()
        verdict = podstate.kubelet_verdict(
            state.written, pod, desired, kubelet_beside=beside, unconfirmed=state.unconfirmed
        )
        if verdict is podstate.Verdict.KUBELET_REMOVES:
            self._kubelet_removed(state, pod)
        if self.mode is settings.ContainerStatusMode.ON:
            if state.rewritten(verdict):
                self._kubelet_rewrote(state, pod)
            return self._rewrite_due(state)
        if self._kubelet.removes:
            return False  # the kubelet's gate is off: node-wide, said once
        if verdict is podstate.Verdict.KUBELET_WRITES and not state.kubelet_owned:
            self._pods.mark_kubelet_owned(state)
            logger.info(
                "The kubelet writes device health for pod %s; leaving that field to it",
                podjson.name(pod),
            )
        return not state.kubelet_owned and not (beside and self._held(state, pod, desired))

    def _held(self, state: podstate.PodState, pod: Obj, desired: podstatus.Desired) -> bool:
        """``auto`` beside a kubelet: the field waits ``kubelet_field_grace`` for its entries.

        A kubelet with its gate on writes the field at its next status sync after
        the device's health reaches it; racing it would cost a write it then
        overwrites (e2e: once in three runs). So the first field write of a pod
        waits; the condition does not. If the kubelet's entries appear meanwhile,
        the pod is the kubelet's (``kubelet_verdict``); if not, we write, and a
        kubelet whose gate is off shows itself by removing it. The wait starts
        once a container of ours is listed: before, there is nothing to write.
        """
        grace = self._cfg.kubelet_field_grace
        if state.written is not None or grace <= 0 or not _listed(pod, desired):
            return False
        now = self._clock.now()
        if state.field_hold_until is None:
            state.field_hold_until = now + grace
        if now >= state.field_hold_until:
            return False
        self._pods.defer(state.uid, state.field_hold_until)
        return True

    def _kubelet_removed(self, state: podstate.PodState, pod: Obj) -> None:
        state.taken_back(self._clock.now())
        self._kubelet.removed(pod)
        self._refresh_stats()

    def _kubelet_rewrote(self, state: podstate.PodState, pod: Obj) -> None:
        # ``on`` only: in ``auto`` a rewrite leaves the pod's field to the kubelet for good.
        state.taken_back(self._clock.now())
        self._kubelet.rewrote(pod)
        self._refresh_stats()

    def _rewrite_due(self, state: podstate.PodState) -> bool:
        """``on``: whether the field may be written now; if not, when it will be."""
        at = state.rewrite_at
        if at is None or self._clock.now() >= at:
            return True
        # The condition is written now; the field once the backoff is over.
        self._pods.defer(state.uid, at)
        return False

    # -- terminated pods -----------------------------------------------------

    def _record_termination(self, state: podstate.PodState) -> None:
        now = self._clock.now()
        lookup = self._index.snapshot(state.uid)
        health = {k: self._health(k, now) for k in lookup.device_keys()}
        record = podstate.PostMortem(lookup, health, now, now + self._cfg.terminated_pod_ttl)
        self._pods.set_record(state, record, limit=self._cfg.terminated_pod_max)
        self._refresh_stats()

    # -- internals -----------------------------------------------------------

    def _refresh_stats(self) -> None:
        self.stats.pending = self._pods.pending
        self.stats.kubelet_owned_pods = self._pods.kubelet_owned
        self.stats.postmortem_records = self._pods.records
        self.stats.gate_off = self._gates.health_dropped
        self.stats.message_gate_off = self._gates.message_dropped
        self.stats.gate_off_detected = self._gates.detected
        self.stats.kubelet_removes = self._kubelet.removes
        self.stats.field_removals = self._kubelet.removals
        self.stats.field_rewrites = self._kubelet.rewrites


_rv = podjson.resource_version_number


def _take_newer(state: podstate.PodState, pod: Obj) -> None:
    """Keep ``pod`` (an answer or a re-read) unless the watch already brought a newer one.

    An answer travels on its own connection and can arrive after the watch event of a
    later change (the kubelet listing the containers right after our write): taking
    it would put that change out of sight until the next health change (the watch's
    own older events are dropped in ``pod_updated`` for the same reason).
    """
    if _rv(pod) >= _rv(state.pod) or not _rv(pod):
        state.pod = pod


def _listing(pod: Obj) -> set[tuple[str, str]]:
    """The container statuses the pod lists, by field and name."""
    status = podjson.status(pod)
    return {
        (field, str(cs.get("name", "")))
        for field in patchplan.FIELDS
        for cs in podjson.items(status, field)
    }


def _listed(pod: Obj, desired: podstatus.Desired) -> bool:
    """Whether the pod's status lists a container we have entries for."""
    status = podjson.status(pod)
    return any(
        podjson.find_named(podjson.items(status, field), container) is not None
        for field, container in desired.containers
    )
