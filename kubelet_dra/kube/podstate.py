"""What the status writer keeps per pod, in one object, and the table of them; pure.

Part of ``kube``. Kubelet counterpart: the status manager's ``podStatuses`` map
(``pkg/kubelet/status/status_manager.go``), one versioned status per pod UID. One
:class:`PodState` holds everything the writer knows about a pod; :class:`PodStates` is the
table and its scheduling, pure arithmetic on times the caller passes (its docstring says how).
:func:`kubelet_verdict` reads from pod versions who else touches the field.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import random
from collections.abc import Container, Iterable, Iterator
from typing import Any

from kubelet_dra import models
from kubelet_dra.status import claims, podjson, podstatus
from kubelet_dra.status.podjson import Obj

FAILED_RETRY_MAX = 30.0
"""Longest wait before retrying a pod whose write failed transiently, seconds."""


def failure_backoff(streak: int, rng: random.Random) -> float:
    """Seconds before retrying after ``streak`` failed writes in a row.

    1, 2, 4 ... 30 s with +-20 % jitter, so an API outage costs each pod fewer
    and fewer attempts and the pods of a node do not retry in step.
    """
    return min(FAILED_RETRY_MAX, 2.0 ** (streak - 1)) * rng.uniform(0.8, 1.2)


REMOVAL_BACKOFF_FIRST = 10.0
"""Seconds before the first rewrite of a field the kubelet removed or rewrote (``on``):
its status manager reconciles every 10 s, so sooner would only be taken back again."""

REMOVAL_BACKOFF_MAX = 300.0
"""At most one rewrite per pod per 5 minutes in steady state (``on``)."""


def removal_backoff(removals: int) -> float:
    """Seconds, after the ``removals``-th removal or rewrite seen, before writing the field again.

    10, 20, 40 ... 300 s, no jitter: the bound is a documented promise
    (``docs/sidecar.md``), and pods' removals already come at their own times.
    """
    return min(REMOVAL_BACKOFF_MAX, REMOVAL_BACKOFF_FIRST * 2.0 ** (max(removals, 1) - 1))


class Verdict(enum.Enum):
    """What a later pod version says about the other writers of our field."""

    NOBODY = "nobody"  # no sign of another writer: keep writing
    KUBELET_WRITES = "kubelet_writes"  # its own entries (CDI IDs) or ours changed
    KUBELET_REMOVES = "kubelet_removes"  # our entries gone from where the server kept them


@dataclasses.dataclass(frozen=True, slots=True)
class PostMortem:
    """A terminated pod's claims and device health, frozen when it terminated."""

    lookup: claims.FrozenClaims
    health: dict[models.DeviceKey, models.DeviceHealth]
    at: float
    expires: float
    seq: int = 0  # order of creation: the oldest record is evicted first


Sent = tuple[tuple[str, str], tuple[Any, ...]]
"""(status field, container name) and the normalized entries a write sent it."""

MAX_UNCONFIRMED = 16
"""Entries kept per pod of writes not answered yet: a long outage with changing health
sends a new set on each retry; only the newest can be what the server applied last."""


def sent_entries(key: tuple[str, str], entries: Iterable[Obj]) -> Sent:
    """What :meth:`PodState.sent` keeps of one container's entries."""
    return key, tuple(podstatus.normalized(entries))


@dataclasses.dataclass(frozen=True, slots=True)
class Written:
    """What our last accepted write left in the pod (to notice another writer)."""

    rv: int
    entries: tuple[Any, ...]


@dataclasses.dataclass(slots=True)
class PodState:
    """Everything the writer keeps about one pod."""

    pod: Obj  # the newest copy: from the watch, a re-read or our write's answer
    due: float | None = None  # dirty: write it not before this time
    last_write: float | None = None  # when our last write was sent
    failures: int = 0  # failed writes in a row
    written: Written | None = None
    record: PostMortem | None = None
    kubelet_owned: bool = False  # the kubelet writes this pod's device entries
    takebacks: int = 0  # times the kubelet was seen removing or rewriting the field we wrote
    rewrite_at: float | None = None  # ``on``: not before this time after a takeback
    field_hold_until: float | None = None  # ``auto`` beside a kubelet: first field write
    seen_health: dict[models.DeviceKey, models.HealthStatus] = dataclasses.field(
        default_factory=dict
    )  # what the last event computation saw
    known_health: set[models.DeviceKey] = dataclasses.field(default_factory=set)
    unconfirmed: dict[Sent, None] = dataclasses.field(default_factory=dict)
    """Entries our writes sent since ``written`` was last set, newest last (see ``sent``)."""

    @property
    def uid(self) -> str:
        """The pod's UID (the table's key)."""
        return podjson.uid(self.pod)

    def sent(self, entries: Iterable[Sent]) -> None:
        """A write is on its way with these entries: until its answer, a version showing
        them is ours. The answer can be lost after the server applied the write (a reset
        or a stalled connection): the retry's ``test`` then fails,
        the re-read shows our own entries, and reading them as a change by someone else
        left the field to "the kubelet" for good (a lost final state)."""
        for item in entries:
            self.unconfirmed.pop(item, None)
            self.unconfirmed[item] = None
        while len(self.unconfirmed) > MAX_UNCONFIRMED:
            del self.unconfirmed[next(iter(self.unconfirmed))]

    def confirmed(self, written: Written) -> None:
        """Our write's answer: what it left is known, and every earlier write is older."""
        self.written = written
        self.unconfirmed.clear()

    def rewritten(self, verdict: Verdict) -> bool:
        """Whether ``verdict`` is the kubelet rewriting entries our accepted write left.

        Its own entries in place of ours (one under the CDI ID several devices share,
        where we write one per device): with ``on`` this is backed off like a removal,
        or each side rewrites the other at every reconcile. Before our first write, or
        after a takeback, what is there was never ours: no rewrite.
        """
        return verdict is Verdict.KUBELET_WRITES and self.written is not None

    def taken_back(self, now: float) -> None:
        """The kubelet removed or rewrote what we wrote: forget it, back the field off.

        Counted once per takeback: what we wrote is forgotten until we write again.
        """
        self.written = None
        self.takebacks += 1
        self.rewrite_at = now + removal_backoff(self.takebacks)


class PodStates:
    """Every pod the writer knows, by UID, and which of them are dirty.

    One :class:`PodState` holds everything the writer knows about a pod:
    its newest copy, when it is due, its last write, its failure streak, its
    post-mortem record, whether the kubelet owns its device entries, and the
    device health its events last announced. Forgetting a pod is dropping one
    entry (:meth:`PodStates.drop`).

    Scheduling is pure arithmetic on times the caller passes: the write window is
    leading-edge per pod (:meth:`PodStates.mark_dirty`), a pod whose write
    failed transiently is retried after :func:`failure_backoff`, and with
    ``--container-status on`` a field the kubelet removed or rewrote is written
    again only after :func:`removal_backoff` (:meth:`PodState.taken_back`).

    Who else touches the field is read from pod versions by :func:`kubelet_verdict`
    (``--container-status``, four cases): the kubelet writes it,
    the kubelet removes it, or nobody touches it. The fourth, the API server
    dropping it, shows in our own write's answer (``kube.gates``), so what we wrote
    is recorded from that answer and a dropped field is never taken for a removal.
    """

    def __init__(self) -> None:
        self._states: dict[str, PodState] = {}
        self._dirty: set[str] = set()  # an index of the states whose ``due`` is set
        self._deferred: set[str] = set()  # dirty only for a planned rewrite (see ``defer``)
        self._records = 0
        self._owned = 0
        self._next_expiry: float | None = None
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, uid: object) -> bool:
        return uid in self._states

    def __iter__(self) -> Iterator[PodState]:
        return iter(list(self._states.values()))

    def get(self, uid: str) -> PodState | None:
        """The pod's state, or ``None`` when the pod is not known."""
        return self._states.get(uid)

    def put(self, pod: Obj) -> PodState:
        """Record ``pod`` as its newest copy; a new pod gets a fresh state."""
        uid = podjson.uid(pod)
        state = self._states.get(uid)
        if state is None:
            state = self._states[uid] = PodState(pod)
        else:
            state.pod = pod
        return state

    def drop(self, uid: str) -> None:
        """Forget the pod and all that was kept for it."""
        state = self._states.pop(uid, None)
        self._dirty.discard(uid)
        self._deferred.discard(uid)
        if state is not None:
            self._records -= state.record is not None
            self._owned -= state.kubelet_owned

    # -- scheduling ------------------------------------------------------------

    def mark_dirty(self, uid: str, now: float, window: float) -> None:
        """Due at once unless written within ``window``, then a window after that write.

        An already dirty pod keeps the earlier time: changes coalesce.
        """
        state = self._states.get(uid)
        if state is None:
            return  # not known (yet): its arrival marks it
        last = state.last_write if state.last_write is not None else now - window
        due = max(now, last + window)
        self._set_due(state, due if state.due is None else min(state.due, due))

    def requeue(self, uid: str, at: float) -> None:
        """Write the pod again at ``at`` (a retry: replaces any earlier time)."""
        state = self._states.get(uid)
        if state is not None:
            self._set_due(state, at)

    def defer(self, uid: str, at: float) -> None:
        """Write the pod again at ``at``, though nothing changed (a rewrite after a backoff).

        Not counted in :attr:`pending`: no change waits, only a planned rewrite.
        An already dirty pod keeps the earlier time and stays pending.
        """
        state = self._states.get(uid)
        if state is None:
            return
        if state.due is None:
            self._set_due(state, at)
            self._deferred.add(uid)
        else:
            state.due = min(state.due, at)

    def take_due(self, now: float) -> list[str]:
        """The pods due at ``now``, no longer dirty."""
        due = [uid for uid in self._dirty if self._due(uid) <= now]
        for uid in due:
            self._states[uid].due = None
            self._dirty.discard(uid)
            self._deferred.discard(uid)
        return due

    def next_due(self) -> float | None:
        """When the earliest dirty pod is due."""
        return min((self._due(uid) for uid in self._dirty), default=None)

    @property
    def pending(self) -> int:
        """How many pods wait for a write of a change (planned rewrites not counted)."""
        return len(self._dirty) - len(self._deferred)

    def _set_due(self, state: PodState, due: float) -> None:
        state.due = due
        self._dirty.add(state.uid)
        self._deferred.discard(state.uid)

    def _due(self, uid: str) -> float:
        due = self._states[uid].due
        assert due is not None, "a dirty pod has a due time"
        return due

    # -- post-mortem records ---------------------------------------------------

    def set_record(self, state: PodState, record: PostMortem, *, limit: int) -> None:
        """Keep ``record`` for the pod; beyond ``limit`` records the oldest goes."""
        if state.record is None:
            self._records += 1
        state.record = dataclasses.replace(record, seq=next(self._seq))
        if self._next_expiry is None or record.expires < self._next_expiry:
            self._next_expiry = record.expires
        while self._records > limit:
            oldest = min(
                (s for s in self._states.values() if s.record is not None),
                key=lambda s: s.record.seq if s.record is not None else 0,
            )
            self._clear_record(oldest)

    def expire_records(self, now: float) -> None:
        """Drop the records whose time is up (a scan only when one is due)."""
        if self._next_expiry is None or now < self._next_expiry:
            return
        self._next_expiry = None
        for state in self._states.values():
            if state.record is None:
                continue
            if state.record.expires <= now:
                self._clear_record(state)
            elif self._next_expiry is None or state.record.expires < self._next_expiry:
                self._next_expiry = state.record.expires

    @property
    def records(self) -> int:
        """How many post-mortem records are kept."""
        return self._records

    def _clear_record(self, state: PodState) -> None:
        state.record = None
        self._records -= 1

    # -- counts ----------------------------------------------------------------

    def mark_kubelet_owned(self, state: PodState) -> None:
        """The kubelet writes this pod's device entries: we leave them alone from now on."""
        if not state.kubelet_owned:
            state.kubelet_owned = True
            self._owned += 1

    @property
    def kubelet_owned(self) -> int:
        """How many pods' device entries the kubelet writes."""
        return self._owned


# -- who else writes the field ---------------------------------------------------


def managed_entries(pod: Obj, desired: podstatus.Desired) -> tuple[Any, ...]:
    """Normalized entries of the containers we manage, to compare across writes."""
    status = podjson.status(pod)
    return tuple(
        (key, podstatus.normalized(podstatus.container_entries(status, *key)))
        for key in sorted(desired.containers)
    )


def kubelet_verdict(
    written: Written | None,
    pod: Obj,
    desired: podstatus.Desired,
    *,
    kubelet_beside: bool = False,
    unconfirmed: Container[Sent] = (),
) -> Verdict:
    """What ``pod`` says about the kubelet, given what our last accepted write left.

    - Entries under our names with resource IDs we would not produce (CDI
      IDs), or entries we wrote changed by a later version: the kubelet writes
      the field. Beside a kubelet (``kubelet_beside``), entries under our
      names that this process did not write are the kubelet's too, whatever
      their IDs: with the checkpoint's CDI IDs ours equal the kubelet's, and a
      restarted sidecar must not take the field back (a kubelet whose gate is
      off removes whatever is there, so leaving it costs nothing).
    - A later version in which every container we wrote entries for (and
      which is still listed) has none of our entry names left: the kubelet
      removes it. Its status manager sends the whole atomic
      ``containerStatuses`` list, without the field when its
      ``ResourceHealthStatus`` gate is off.
    - Otherwise nobody touches it. ``written`` comes from our own write's
      answer, so a field the API server dropped is empty there: no removal.
      Entries one of our writes sent whose answer we have not seen
      (``unconfirmed``) are ours too, never evidence of another writer.
    """
    if written is None:
        theirs = _foreign_ids(pod, desired) or (
            kubelet_beside and _named(pod, desired) and not _all_sent(pod, desired, unconfirmed)
        )
        return Verdict.KUBELET_WRITES if theirs else Verdict.NOBODY
    if podjson.resource_version_number(pod) <= written.rv:
        return Verdict.NOBODY
    status = podjson.status(pod)
    changed = removed = kept = False
    for key, before in written.entries:
        now = podstatus.normalized(podstatus.container_entries(status, *key))
        if now == before or (key, tuple(now)) in unconfirmed:
            continue
        changed = True
        ours = {name for name, _ in before} & set(desired.containers.get(key) or ())
        if not ours or podjson.find_named(podjson.items(status, key[0]), key[1]) is None:
            continue  # nothing of ours there, or the container is not listed: no evidence
        if ours & {name for name, _ in now}:
            kept = True
        else:
            removed = True
    if removed and not kept:
        return Verdict.KUBELET_REMOVES
    return Verdict.KUBELET_WRITES if changed else Verdict.NOBODY


def _foreign_ids(pod: Obj, desired: podstatus.Desired) -> bool:
    status = podjson.status(pod)
    for (field, container), managed in desired.containers.items():
        for entry in podstatus.container_entries(status, field, container):
            want = managed.get(entry.get("name", ""))
            if entry.get("name") in managed and _ids(entry) != _ids(want):
                return True
    return False


def _named(pod: Obj, desired: podstatus.Desired) -> bool:
    """Whether the pod lists an entry under one of our names."""
    status = podjson.status(pod)
    return any(
        entry.get("name") in managed
        for (field, container), managed in desired.containers.items()
        for entry in podstatus.container_entries(status, field, container)
    )


def _all_sent(pod: Obj, desired: podstatus.Desired, unconfirmed: Container[Sent]) -> bool:
    """Whether every container we manage shows no entries or ones our writes sent."""
    status = podjson.status(pod)
    for key in desired.containers:
        entries = podstatus.container_entries(status, *key)
        if entries and sent_entries(key, entries) not in unconfirmed:
            return False
    return True


def _ids(entry: Obj | None) -> set[str]:
    return {str(r.get("resourceID")) for r in (entry or {}).get("resources") or ()}
