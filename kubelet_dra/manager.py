"""``DRAHealthManager``: the pipeline wired together.

Counterpart of the kubelet's DRA manager construction and wiring
(``pkg/kubelet/cm/dra/manager.go`` ``NewManager``/``Start`` and
``container_manager_linux.go``), for two kinds of users: the **sidecar**
(:class:`kubelet_dra.sidecar.Sidecar`, claims and pods from the API, our status writer) and
a **node agent** that owns pod status (claims added programmatically, a callback that
receives each pod's desired status). :class:`DRAHealthManager` has the start and stop order.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from kubelet_dra import agentpods, errors, kube, metrics, models
from kubelet_dra import clock as clock_mod
from kubelet_dra import settings as settings_mod
from kubelet_dra.plugin import getinfo, plugins, registration
from kubelet_dra.state import healthinfo, kubeletcheckpoint, podresources, store
from kubelet_dra.status import claims, podjson, podstatus
from kubelet_dra.taints import loop, planner

logger = logging.getLogger(__name__)
_T = TypeVar("_T")


PodHealthUpdate = agentpods.PodHealthUpdate
StatusCallback = agentpods.StatusCallback

POD_WRITE_RESULTS = ("ok", "conflict", "retried", "failed")
"""Results of pod status writes that are always exported, zero or not (the
writer also counts ``unchanged`` and ``gone``)."""


class DRAHealthManager:
    """The whole pipeline. Use as ``async with DRAHealthManager(...) as m``.

    With ``on_status`` the manager computes desired statuses and hands them to
    the callback (a node agent owns the API writes); without it, it watches
    the node's pods and claims through the Kubernetes API and writes status
    itself (``api_client`` or ``settings.kubeconfig``/in-cluster config).

    - the **sidecar** (:class:`kubelet_dra.sidecar.Sidecar`, ``kubelet-dra-health
      run``): observer role, claims and pods from the API, our status writer,
      metrics server;
    - a **node agent** that owns pod status: claims added programmatically
      (:attr:`DRAHealthManager.index`, :meth:`DRAHealthManager.set_pod`) and a
      callback that receives each pod's desired ``allocatedResourcesStatus`` and
      condition (:class:`kubelet_dra.agentpods.PodHealthUpdate`), coalesced like
      the writer's (:class:`kubelet_dra.agentpods.AgentPods`); agents that are not
      async run it with :class:`kubelet_dra.syncrunner.SyncRunner`.

    The health cache and the plugin manager are built once, in the constructor,
    and never replaced: whoever holds ``manager.cache`` or ``manager.plugins``
    before :meth:`DRAHealthManager.start` holds the live objects. ``start`` loads
    the state file into that cache and attaches the file as its sink.

    Start order: state file, cache, streams (with the lease-deadline task), API
    watches and writer, then the registry. Stop order is the reverse *except* that
    the writer and the state file are closed before the streams are cancelled:
    stopping the sidecar is not a driver failure and must not write ``Unknown``
    into pods or into the state file.
    """

    def __init__(
        self,
        settings: settings_mod.Settings | None = None,
        *,
        clock: clock_mod.Clock | None = None,
        on_status: StatusCallback | None = None,
        api_client: kube.ApiClient | None = None,
        static_plugins: Sequence[getinfo.PluginInfo] = (),
        watch_registry: bool = True,
    ) -> None:
        self.settings = settings or settings_mod.Settings()
        self.clock = clock or clock_mod.SystemClock()
        self.index = claims.ClaimIndex()
        self.store: store.HealthStore | None = None
        # Every call into the state file runs on this one thread, not on the default
        # pool that the API calls share (pod lists, claim reads, the taint bridge): a
        # renewal staged at half lease waited 5-8 s behind them at load 13-44 before
        # its commit began. One thread also keeps the file's calls in order.
        self._store_thread: concurrent.futures.ThreadPoolExecutor | None = None
        self.cache = healthinfo.HealthCache(default_lease=self.settings.health_timeout)
        """The live health cache, from construction on (the state file is attached at start)."""
        self._on_status = on_status
        self._api_client = api_client
        self._static = tuple(static_plugins)
        self._watch_registry = watch_registry
        self._tasks: list[asyncio.Task[Any]] = []
        self._closing = False
        self.agent = agentpods.AgentPods(
            index=self.index,
            health=self.cache.get,
            settings=self.settings,
            clock=self.clock,
            on_status=on_status,
        )
        """The node agent's pods (``set_pod``); their status goes to ``on_status``."""
        self.primed = asyncio.Event()
        """Set when pod writes may start (see ``Settings.startup_grace``)."""
        self.plugins = plugins.PluginManager(
            self.cache, settings=self.settings, clock=self.clock, on_change=self._on_change
        )
        self.watcher: registration.RegistryWatcher | None = None
        self.api: kube.Api | None = None
        self.writer: kube.StatusWriter | None = None
        self.pods: kube.NodePods | None = None
        self.taints: loop.TaintBridge | None = None
        """The taint bridge, when ``settings.taint_effect`` is not ``off`` (API mode only)."""
        self.names: podresources.PodResourcesClient | None = None
        """The kubelet's PodResources API, read for CDI device IDs (API mode, a socket set)."""
        self.checkpoint: kubeletcheckpoint.CheckpointWatcher | None = None
        """The kubelet's DRA checkpoint, read for CDI device IDs: a library option
        (``settings.kubelet_root_dir``) for harnesses without a PodResources socket;
        ``kubelet-dra-health run`` never sets it."""
        self._checkpoint_claims: frozenset[claims.ClaimKey] = frozenset()
        self.store_errors = 0
        self._expired_at_start = 0
        self.store_commit_latency: Callable[[float], None] = lambda seconds: None
        self.write_latency: Callable[[float], None] | None = None
        """Receives each pod write's seconds at :meth:`metric_state` (the sidecar's
        histogram); ``None`` leaves them in ``writer.stats.latencies``."""

    # -- lifecycle -------------------------------------------------------------

    async def __aenter__(self) -> DRAHealthManager:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Open the state file, start the streams, the API side or the callback, the registry."""
        # The file first: a pod already terminated when it is first listed has
        # its devices' health recorded at once (the writer's post-mortem), so
        # the API side must not start before the cache holds the file.
        await self._open_store()
        await self.plugins.start()
        if self._on_status is None:
            await self._start_kube()
        else:
            self._spawn(self._after_priming(self.agent.run()), "status-callback")
        self._spawn(self._flush_loop(), "store-flush")
        self.watcher = registration.RegistryWatcher(
            self.settings.plugins_registry if self._watch_registry else None,
            role=self.settings.role,
            settings=self.settings,
            clock=self.clock,
            on_event=self.plugins.handle,
            static=self._static,
        )
        await self.watcher.start()
        self._spawn(self._prime(), "startup-priming")

    async def _prime(self) -> None:
        """Set :attr:`primed` once every stream delivered a report or gave up.

        The registry was scanned by then (``RegistryWatcher.start``), so the
        endpoints known here are the drivers present at start-up.
        """
        await self.plugins.wait_primed(self.settings.startup_grace)
        self.primed.set()

    async def _after_priming(self, work: Coroutine[Any, Any, Any]) -> None:
        try:
            await self.primed.wait()
        except asyncio.CancelledError:
            work.close()
            raise
        await work

    async def close(self) -> None:
        """Stop without marking anything ``Unknown`` (see the module docstring)."""
        if self._closing:
            return
        self._closing = True
        if self.watcher is not None:
            await self.watcher.close()
        await self._drain_writer(timeout=2.0)
        await clock_mod.cancel_and_wait(*self._tasks)
        self._tasks.clear()
        if self.writer is not None:
            await self.writer.aclose()  # a drain may have opened connections after the writer
        if self.store is not None:
            await self._on_store_thread(self.store.close)
        if self._store_thread is not None:
            self._store_thread.shutdown(wait=False)
        await self.plugins.close()

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        self._tasks.append(asyncio.create_task(coro, name=name))

    # -- state file ------------------------------------------------------------

    async def _on_store_thread(self, call: Callable[..., _T], *args: Any) -> _T:
        if self._store_thread is None:
            self._store_thread = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="kubelet-dra-store"
            )
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._store_thread, functools.partial(call, *args))

    async def _open_store(self) -> None:
        opened = await self._on_store_thread(store.HealthStore.open, self.settings.state_dir)
        records = await self._on_store_thread(opened.load)
        self.store = opened
        with store.gc_paused():  # half a million acyclic objects (see store.gc_paused)
            self.cache.load(records)
        self.cache.attach(opened)
        # Leases that ran out while we were down turn Unknown now; their pods
        # are written once the pod cache has synced (every pod is checked then).
        expired = self.cache.expire(self.clock.now())
        self._expired_at_start = len(expired)
        logger.info(
            "health cache: %d devices loaded from %s, %d expired while down",
            len(records),
            opened.path,
            len(expired),
        )

    async def _flush_loop(self) -> None:
        assert self.store is not None
        failing = False
        while True:
            await self.clock.sleep(self.settings.store_flush_interval)
            failing = await self._flush_once(failing)

    async def _flush_once(self, failing: bool) -> bool:
        assert self.store is not None
        if await self._on_store_thread(self.store.replaced):
            # SQLite would keep writing to the deleted inode without an error.
            logger.error(
                "health cache %s was deleted or replaced; serving from memory, writing a new one",
                self.store.path,
            )
            await self._on_store_thread(self.store.reopen, list(self.cache.records()))
            self.store_errors += 1
            failing = True
        if not self.store.pending:
            return failing
        started = time.perf_counter()
        try:
            await self._on_store_thread(self.store.flush)
        except errors.StoreError as exc:
            self.store_errors += 1
            if not failing:
                logger.error("%s; serving from memory and retrying", exc)
            return True
        self.store_commit_latency(time.perf_counter() - started)
        if failing:
            logger.warning("health cache %s is writable again", self.store.path)
        return False

    # -- the API side ------------------------------------------------------------

    async def _start_kube(self) -> None:
        client = self._api_client
        if client is None:
            client = await asyncio.to_thread(kube.load_client, self.settings.kubeconfig)
        api = self.api = kube.Api(client)
        node = self.settings.node_name
        if not node:
            raise errors.ConfigError("node name is required to watch the node's pods")
        # One QPS/burst budget for every write: pod status first, taint rules after.
        budget = kube.TokenBucket(
            qps=self.settings.api_qps, burst=self.settings.api_burst, clock=self.clock
        )
        self.writer = kube.StatusWriter(
            api=api,
            node_name=node,
            index=self.index,
            health=self.cache.get,
            config=self.settings,
            clock=self.clock,
            limiter=budget,
            kubelet_beside=self._kubelet_beside,
        )
        self.pods = kube.NodePods(
            api=api, node_name=node, index=self.index, writer=self.writer, clock=self.clock,
            page_size=self.settings.pod_list_page_size, observer=self._pod_event,
        )  # fmt: skip
        self._start_names()
        self._start_checkpoint()
        self._spawn(self._after_priming(self.writer.run()), "status-writer")
        self._spawn(self.pods.run(), "node-pods")
        self._start_taints(client, budget)

    def _kubelet_beside(self) -> bool:
        """A kubelet answers beside us: on its PodResources socket, or by its checkpoint."""
        if self.names is not None and self.names.present:
            return True
        return self.checkpoint is not None and self.checkpoint.present

    def _start_names(self) -> None:
        """Learn the kubelet's CDI device IDs of the node's claims from its PodResources API."""
        socket = self.settings.pod_resources_socket
        if socket is None:
            return
        self.names = podresources.PodResourcesClient(
            socket, apply=self._apply_names, settings=self.settings, clock=self.clock
        )
        self._spawn(self.names.run(), "pod-resources")

    def _apply_names(self, key: claims.ClaimKey, names: claims.ClaimNames) -> None:
        delta = self.index.set_claim_names(key.namespace, key.name, names)
        if self.writer is not None and delta.pods:
            self.writer.mark_dirty(delta.pods)

    def _pod_event(self, pod: Mapping[str, Any], removed: bool) -> None:
        """The API side indexed or forgot a pod: the names client asks the kubelet for it."""
        if self.names is None:
            return
        namespace, name = podjson.namespace(pod), podjson.name(pod)
        if removed:
            self.names.pod_gone(namespace, name)
            return
        self.names.pod_seen(
            namespace,
            name,
            has_claims=bool(podjson.resource_claims(pod)),
            running=podjson.status(pod).get("phase") == "Running",
        )

    def _start_checkpoint(self) -> None:
        """Poll the kubelet's DRA checkpoint for the CDI device IDs of prepared claims.

        Read once before the writer starts, so the first writes already use the
        kubelet's resourceIDs; a missing or refused file changes nothing then.
        """
        root = self.settings.kubelet_root_dir
        if root is None:
            return
        self.checkpoint = kubeletcheckpoint.CheckpointWatcher(
            root,
            apply=self._apply_checkpoint,
            clock=self.clock,
            interval=self.settings.kubelet_checkpoint_interval,
        )
        self.checkpoint.poll()
        self._spawn(self.checkpoint.run(), "kubelet-checkpoint")

    def _apply_checkpoint(self, found: Sequence[kubeletcheckpoint.PreparedClaim]) -> None:
        """The checkpoint's claims into the index: they win over the API's view of a
        claim, and a claim that left the file falls back to it. Changed pods are dirty."""
        delta = claims.Delta()
        present = {c.key: c for c in found}
        for key in self._checkpoint_claims - present.keys():
            delta |= self.index.remove_prepared_claim(namespace=key.namespace, name=key.name)
        for key, claim in present.items():
            delta |= self.index.add_prepared_claim(
                namespace=key.namespace, name=key.name, devices=claim.devices,
                uid=claim.uid, pod_uids=claim.pod_uids,
            )  # fmt: skip
        self._checkpoint_claims = frozenset(present)
        if self.writer is not None and delta.pods:
            self.writer.mark_dirty(delta.pods)

    def _start_taints(self, client: kube.ApiClient, budget: kube.TokenBucket) -> None:
        """The taint bridge (docs/remediation.md), if an effect is configured."""
        if self.settings.taint_effect is settings_mod.TaintEffect.OFF:
            return
        self.taints = loop.TaintBridge(
            client=client,
            node=self.settings.node_name,
            settings=self.settings,
            clock=self.clock,
            health=self.cache.get,
            devices=lambda: [key for key, _ in self.cache.records()],
            resource_ids=self.index.resource_ids,
            budget=budget,
        )
        self._spawn(self._after_priming(self.taints.run()), "taint-bridge")

    async def _drain_writer(self, *, timeout: float) -> None:
        if self.writer is None or not self.writer.stats.pending:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.writer.round(), timeout)

    # -- health changes --------------------------------------------------------

    async def _on_change(self, changed: list[models.DeviceKey]) -> None:
        if self._closing or not changed:
            return
        pods = self.index.pods_for_devices(changed)
        if logger.isEnabledFor(logging.DEBUG):  # the device list is formatted eagerly
            logger.debug(
                "health changed for %d devices (%s); %d pods to update",
                len(changed),
                ", ".join(str(key) for key in changed[:5]) + (", ..." if len(changed) > 5 else ""),
                len(pods),
            )
        if self.writer is not None:
            self.writer.mark_dirty(pods)
        if self.taints is not None:
            self.taints.observe(changed)
        if self._on_status is not None and pods:
            self.agent.mark_dirty(pods)

    # -- node-agent mode (see agentpods.AgentPods) -------------------------------

    def set_pod(self, pod: Mapping[str, Any]) -> None:
        """A node agent's pod (a dict as the API shows it); its status is recomputed."""
        self.agent.set_pod(pod)

    def remove_pod(self, uid: str) -> None:
        """Forget a node agent's pod: no more callbacks for it."""
        self.agent.remove_pod(uid)

    def mark_pods(self, uids: Iterable[str]) -> None:
        """Recompute these pods' desired status (after changing claims, say)."""
        self.agent.mark_dirty(uids)

    def add_prepared_claim(
        self,
        *,
        namespace: str,
        name: str,
        devices: Iterable[claims.PreparedDevice],
        uid: str = "",
        pod_uids: Iterable[str] = (),
    ) -> claims.Delta:
        """``index.add_prepared_claim`` (after ``NodePrepareResources``), and the pods it
        changes recomputed: a pod set before its claim needs no :meth:`mark_pods`."""
        delta = self.index.add_prepared_claim(
            namespace=namespace, name=name, devices=devices, uid=uid, pod_uids=pod_uids
        )
        if delta.pods:
            self.mark_pods(delta.pods)
        return delta

    def remove_prepared_claim(self, *, namespace: str, name: str) -> claims.Delta:
        """``index.remove_prepared_claim`` (after ``NodeUnprepareResources``), and the
        pods it changes recomputed."""
        delta = self.index.remove_prepared_claim(namespace=namespace, name=name)
        if delta.pods:
            self.mark_pods(delta.pods)
        return delta

    def desired(self, uid: str) -> podstatus.Desired | None:
        """The desired device status of a known pod, now."""
        return self.agent.desired(uid)

    # -- observability ---------------------------------------------------------

    def metric_state(self) -> metrics.State:
        """A consistent snapshot for the metrics collector (call on the loop)."""
        self._drain_write_latencies()
        now = self.clock.now()
        devices: collections.Counter[tuple[str, str]] = collections.Counter()
        for key, record in self.cache.records():
            # Every health of a known driver is a series, zero included, so a
            # count that drops to zero reads 0 rather than vanishing.
            for health in models.HealthStatus:
                devices[(key.driver, health.value)] += 0
            devices[(key.driver, record.visible(now)[0].value)] += 1
        stats = self.writer.stats if self.writer is not None else None
        return metrics.State(
            streams=[
                metrics.StreamInfo(s.driver, s.endpoint, s.service, s.state.value, s.reconnects)
                for s in self.plugins.endpoints.values()
            ],
            reports={d: s.reports for d, s in self.plugins.drivers.items()},
            device_updates={d: s.device_updates for d, s in self.plugins.drivers.items()},
            last_report={
                d: s.last_report for d, s in self.plugins.drivers.items() if s.last_report
            },
            refused={
                **self.plugins.refused,
                **{(d, healthinfo.CAP_REASON): n for d, n in self.cache.refused.items()},
            },
            registrations_refused=dict(self.watcher.refused) if self.watcher else {},
            registration_failures=dict(self.watcher.attempt_failures) if self.watcher else {},
            registry_ignored=dict(self.watcher.ignored) if self.watcher else {},
            checkpoint_refused=dict(self.checkpoint.refused) if self.checkpoint else {},
            **_names_metrics(self.names),
            devices=dict(devices),
            lease_expiries=self.plugins.lease_expiries + self._expired_at_start,
            pod_writes={**dict.fromkeys(POD_WRITE_RESULTS, 0), **(stats.results if stats else {})},
            pending_pods=stats.pending if stats else self.agent.pending,
            store_pending=self.store.pending if self.store else 0,
            store_degraded=bool(self.store and self.store.degraded),
            store_errors=self.store_errors,
            api_field_dropped=bool(stats and stats.gate_off),
            kubelet_removes_field=bool(stats and stats.kubelet_removes),
            kubelet_owned_pods=stats.kubelet_owned_pods if stats else 0,
            field_removals=stats.field_removals if stats else 0,
            field_rewrites=stats.field_rewrites if stats else 0,
            now=now,
            loop_tasks=_live_tasks(),
            **_patch_pool_metrics(self.api),
            **_taint_metrics(self.taints),
        )

    def _drain_write_latencies(self) -> None:
        # The writer keeps a bounded deque (newest last); the histogram must see
        # each sample once, so samples move out of it. Between two scrapes at
        # most the deque's maxlen writes are kept: enough at the writer's QPS.
        if self.writer is None or self.write_latency is None:
            return
        latencies = self.writer.stats.latencies
        while latencies:
            self.write_latency(latencies.popleft())

    def readiness(self) -> dict[str, str]:
        """Check name -> ``"ok"`` or why not ready."""
        checks = {"store": "not open"}
        if self.store is not None:
            checks["store"] = (
                f"degraded, serving from memory: {self.store.last_error}"
                if self.store.degraded
                else "ok"
            )
        if self.pods is not None:
            checks["pods"] = "ok" if self.pods.pods_synced else "pod cache not synced"
            checks["claims"] = "ok" if self.pods.claims_synced else "claim cache not synced"
        elif self._on_status is None:
            # API mode before the watches start: not ready, however the store is.
            checks["pods"] = checks["claims"] = "not started"
        if self.taints is not None:
            checks["taints"] = self.taints.readiness()
        return checks

    def readiness_notes(self) -> dict[str, str]:
        """What works differently than configured, for ``/readyz``; never a failed check."""
        notes: dict[str, str] = {}
        note = self.names.note() if self.names is not None else None
        if note is not None:
            notes["names"] = note
        if self.writer is None:
            return notes
        if self.writer.stats.gate_off:
            notes["api_field"] = (
                "the API server drops allocatedResourcesStatus (its ResourceHealthStatus "
                "gate is off); only the pod condition and Events are written"
            )
        if self.writer.stats.kubelet_removes:
            notes["container_status"] = self.writer.kubelet.note()
        return notes


def _names_metrics(names: podresources.PodResourcesClient | None) -> dict[str, Any]:
    """The PodResources client as ``metrics.State`` fields; none when it is off."""
    if names is None:
        return {}
    return {
        "pod_resources_state": names.state.value,
        "pod_resources_fallback": {
            r: int(names.fallback == r) for r in podresources.FALLBACK_REASONS
        },
        "pod_resources_reconnects": names.reconnects,
        "pod_resources_calls": dict(names.calls),
    }


def _taint_metrics(bridge: loop.TaintBridge | None) -> dict[str, Any]:
    """The bridge's counters as ``metrics.State`` fields, every series there from the start."""
    if bridge is None:
        return {}  # off by configuration: no taint series at all
    writes = {(op, result): 0 for op in planner.OPS for result in ("ok", "failed")}
    return {
        "taint_bridge": bridge.state.value,
        "taint_rules": {**dict.fromkeys(planner.EFFECTS, 0), **bridge.rules_by_effect()},
        "taint_writes": {**writes, **bridge.writes},
    }


def _patch_pool_metrics(api: kube.Api | None) -> dict[str, Any]:
    pool = api.patch_pool() if api is not None else None
    if pool is None:
        return {"patch_connections": None}
    return {
        "patch_connections": pool.open,
        "patch_idle_connections": pool.idle,
        "patch_connections_opened": pool.opened,
    }


def _live_tasks() -> int:
    # Called on the loop (metric_state); outside a running loop there are none to count.
    try:
        return sum(1 for task in asyncio.all_tasks() if not task.done())
    except RuntimeError:
        return 0
