"""The node's pods (list + watch, field selector) and the claims they reference (GET each).

Part of ``kube``. Kubelet counterpart: the pod manager's view of the node's pods (its pod
config source), with one GET per referenced ResourceClaim instead of an informer
(:class:`NodePods`). After a broken watch the node waits before it lists again with full
jitter (:func:`relist_delay`), so that when an apiserver restart breaks every node's watch
at once the fleet's relists spread over the step instead of arriving together.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
from collections.abc import Callable
from typing import Any

from kubelet_dra import clock as clock_mod
from kubelet_dra import errors
from kubelet_dra.kube import api as kube_api
from kubelet_dra.kube import calls
from kubelet_dra.kube import writer as kube_writer
from kubelet_dra.status import claims, podjson
from kubelet_dra.status.podjson import Obj

logger = logging.getLogger(__name__)

_DONE = object()


def relist_delay(step: float, rng: random.Random) -> float:
    """How long to wait before listing again: full jitter, uniform in ``[0, step]``.

    ``step`` doubles per failure up to the cap; drawing the whole wait (not a
    +-20 % band around it) is what desynchronises nodes whose watches broke
    at the same instant: after k failures their attempts are sums of k
    independent draws, so they no longer land on the same instants.
    """
    return rng.uniform(0.0, step)


class NodePods:
    """The node's pods (list + watch) and the claims they reference (GET each).

    Pods are listed and watched with ``spec.nodeName=<node>`` (field selector; 410 Gone
    relists) and fed to the claim index and the status writer. For each claim those pods
    reference it GETs that one ResourceClaim, retrying while it is missing or not allocated
    yet. There is no cluster-wide claim list or watch: the API load of a node grows with its
    own pods only. No per-claim watch is needed either: a claim reserved for a pod that runs on
    this node cannot change its allocation until the pod is gone, and a pod that references a
    new claim arrives through the pod watch.
    """

    def __init__(
        self,
        *,
        api: kube_api.Api,
        node_name: str,
        index: claims.ClaimIndex,
        writer: kube_writer.StatusWriter,
        clock: clock_mod.Clock,
        limiter: calls.TokenBucket | None = None,
        watch_timeout: int = 300,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        rng: random.Random | None = None,
        page_size: int = 10,
        observer: Callable[[Obj, bool], None] | None = None,
    ) -> None:
        self.node = node_name
        self._page_size = page_size  # pods per LIST page; 0: the whole list at once
        # Told of each pod indexed (False) or forgotten (True): the names client.
        self._observer = observer or (lambda pod, removed: None)
        self.pods_synced = False
        self._api, self._index, self._writer, self._clock = api, index, writer, clock
        self._limiter = limiter
        self._watch_timeout = watch_timeout
        self._backoff = (backoff_initial, backoff_max)
        self._rng = rng or random.Random()
        self._pods: dict[str, Obj] = {}
        self._claim_tasks: dict[claims.ClaimKey, asyncio.Task[None]] = {}
        self._fetched: set[claims.ClaimKey] = set()

    @property
    def claims_synced(self) -> bool:
        """Every claim the node's pods reference has been read at least once."""
        return self.pods_synced and self._index.referenced_claims() <= self._fetched

    @property
    def claims_fetching(self) -> frozenset[claims.ClaimKey]:
        """Claims still being read again: absent or not allocated at their last GET.

        ``claims_synced`` counts a claim once read, even when that GET answered 404 or
        an unallocated claim (a pod may reference a claim that never comes); its
        reads go on, with backoff, until it is allocated. A caller that knows the claim
        is there now (a test's API stand-in) waits for this to drop it.
        """
        return frozenset(self._claim_tasks)

    def get(self, uid: str) -> Obj | None:
        """The node's pod with this UID as last listed or watched, or ``None``."""
        return self._pods.get(uid)

    async def run(self) -> None:
        """List and watch forever; reconnect with backoff, relist on 410."""
        delay = self._backoff[0]
        try:
            while True:
                try:
                    rv = await self._relist()
                    delay = self._backoff[0]
                    while True:
                        rv = await self._watch(rv)
                except kube_api.Gone:
                    logger.info("Pod watch on node %s expired; listing again", self.node)
                except errors.ApiError as exc:
                    logger.warning("Pod watch on node %s failed: %s", self.node, exc)
                    await self._clock.sleep(relist_delay(delay, self._rng))
                    delay = min(delay * 2, self._backoff[1])
        finally:
            for task in self._claim_tasks.values():
                task.cancel()

    # -- pods ----------------------------------------------------------------

    async def _relist(self) -> str:
        """List the node's pods, ``page_size`` at a time; return the list's resourceVersion.

        Pages, because a relist is the sidecar's largest burst of short-lived objects:
        the whole list decoded at once (30 pods of 4 KB: 0.7 MB at the peak,
        ``python -m benchmarks.relistburst``) can need fresh allocator arenas, and the
        few objects that outlive it (the pods that had changed) keep those pages resident
        for the rest of the process's life (an RSS step at every broken watch;
        docs/memory.md). A page at a time, only one page's objects are alive at once.
        Each page is applied as it comes: the pages are one snapshot, so applying them in
        turn is applying the list. If the snapshot expires between pages (410 on a
        ``continue`` token, after the server compacted), the list starts over in one
        answer, as client-go's pager does (``FullListIfExpired``).
        """
        present: set[str] = set()
        token, rv, size = "", "", self._page_size
        while True:
            if self._limiter is not None:
                await self._limiter.acquire()
            try:
                # The executor's future keeps its result until its worker thread moves
                # on, which can be after the next page is asked for: it keeps the box,
                # and the page dies when this loop drops it.
                page = (await asyncio.to_thread(self._list_page, size, token)).pop()
            except kube_api.Gone:
                if not token:
                    raise
                logger.info("Pod list on node %s expired between pages; listing whole", self.node)
                present.clear()
                token, size = "", 0
                continue
            for pod in page.get("items") or ():
                present.add(podjson.uid(pod))
                self._upsert(pod)
            rv = podjson.resource_version(page)
            token = str((page.get("metadata") or {}).get("continue") or "")
            del page  # this page's objects die before the next is decoded
            if not token:
                break
        for uid in set(self._pods) - present:
            self._remove(uid)
        self.pods_synced = True
        return rv

    def _list_page(self, size: int, token: str) -> list[Obj]:
        return [self._api.list_node_pods(self.node, limit=size, token=token)]

    async def _watch(self, rv: str) -> str:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        opened: list[Any] = []
        thread = threading.Thread(
            target=self._pump, args=(loop, queue, rv, opened), daemon=True,
            name=f"pod-watch-{self.node}",
        )  # fmt: skip
        thread.start()
        try:
            while True:
                item = await queue.get()
                if item is _DONE:
                    return rv
                if isinstance(item, BaseException):
                    raise item
                rv = self._apply(item) or rv
        finally:
            for response in opened:
                kube_api.close_response(response)

    def _pump(
        self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Any], rv: str,
        opened: list[Any],
    ) -> None:  # fmt: skip
        def put(item: Any) -> None:
            # RuntimeError: the loop is gone, we are shutting down.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(queue.put_nowait, item)

        try:
            events = self._api.watch_node_pods(
                self.node, rv, timeout=self._watch_timeout, on_open=opened.append
            )
            for event in events:
                put(event)
            put(_DONE)
        except Exception as exc:
            put(exc)

    def _apply(self, event: Obj) -> str:
        obj: Obj = event.get("object") or {}
        rv = podjson.resource_version(obj)
        kind = event.get("type")
        if kind in ("ADDED", "MODIFIED"):
            self._upsert(obj)
        elif kind == "DELETED":
            self._remove(podjson.uid(obj))
        return rv

    def _upsert(self, pod: Obj) -> None:
        uid = podjson.uid(pod)
        if not uid:
            logger.warning("Ignoring a pod without a UID from the API: %s", podjson.name(pod))
            return
        if podjson.node_name(pod) != self.node:
            self._remove(uid)  # not ours (a stale event): never indexed, never written
            return
        known = self._pods.get(uid)
        rv = podjson.resource_version(pod)
        if known is not None and rv and podjson.resource_version(known) == rv:
            # A relist's copy of a pod we hold at this very version: keep ours. Nothing
            # changed to index or plan, and the relist's copies all die with it, so the
            # allocator gets its pages back instead of keeping them for long-lived pods
            # (the soak's RSS steps at relists; docs/memory.md).
            return
        self._pods[uid] = pod
        delta = self._index.set_pod(pod)
        self._writer.pod_updated(pod)
        self._claims_changed(delta)
        self._observer(pod, False)

    def _remove(self, uid: str) -> None:
        pod = self._pods.pop(uid, None)
        if pod is None:
            return
        self._observer(pod, True)
        delta = self._index.remove_pod(uid)
        self._writer.pod_deleted(uid)
        self._claims_changed(delta)

    # -- claims --------------------------------------------------------------

    def _claims_changed(self, delta: claims.Delta) -> None:
        for key in delta.claims_removed:
            task = self._claim_tasks.pop(key, None)
            if task is not None:
                task.cancel()
            self._fetched.discard(key)
        for key in delta.claims_added:
            if key not in self._claim_tasks:
                self._claim_tasks[key] = asyncio.get_running_loop().create_task(
                    self._fetch_claim(key), name=f"claim-{key}"
                )

    async def _fetch_claim(self, key: claims.ClaimKey) -> None:
        """GET one claim until it is allocated (or no pod references it any more)."""
        delay = self._backoff[0]
        try:
            while key in self._index.referenced_claims():
                obj = await self._get_claim(key)
                if obj is not None:
                    self._fetched.add(key)
                    self._writer.mark_dirty(self._index.set_claim(obj).pods)
                    if claims.is_allocated(obj):
                        return
                await self._clock.sleep(delay)
                delay = min(delay * 2, self._backoff[1])
        finally:
            if self._claim_tasks.get(key) is asyncio.current_task():
                del self._claim_tasks[key]

    async def _get_claim(self, key: claims.ClaimKey) -> Obj | None:
        if self._limiter is not None:
            await self._limiter.acquire()
        try:
            return await asyncio.to_thread(self._api.get_claim, key.namespace, key.name)
        except errors.ApiError as exc:
            if exc.status != 404:
                logger.warning("ResourceClaim %s not read: %s", key, exc)
            else:
                self._fetched.add(key)  # known absent: read, so the cache is synced
            return None
