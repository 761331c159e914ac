"""``Sidecar``: the manager in the observer role plus the metrics server.

What ``kubelet-dra-health run`` runs (see ``docs/sidecar.md``). The kubelet
has no counterpart: it is the process that sits next to a kubelet which does
not (or not fully) write device health itself. The metrics server starts
first so that a taken port fails before anything else has started.
"""

from __future__ import annotations

import asyncio
import logging

from kubelet_dra import clock, kube, memtrim, metrics
from kubelet_dra import settings as settings_mod
from kubelet_dra.manager import DRAHealthManager

logger = logging.getLogger(__name__)


class Sidecar:
    """``kubelet-dra-health run``: the manager in the observer role plus metrics."""

    def __init__(
        self, settings: settings_mod.Settings, *, api_client: kube.ApiClient | None = None
    ) -> None:
        observer = settings.model_copy(update={"role": settings_mod.Role.OBSERVER})
        self.manager = DRAHealthManager(observer, api_client=api_client)
        self.server: metrics.Server | None = None
        self._beat: asyncio.Task[None] | None = None
        # Reference cycles freed each minute (failed connections' cycles were the soak's
        # step at a kube-apiserver restart), then a cheap bound on the free heap glibc
        # keeps (memtrim's docstring, docs/memory.md).
        self.trimmer = memtrim.Trimmer(
            self.manager.settings.malloc_trim_interval, clock=self.manager.clock
        )
        self._trim: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Sidecar:
        logger.debug("settings: %s", self.manager.settings.model_dump(mode="json"))
        address = self.manager.settings.metrics_address
        if address:
            # First, so that a taken port fails before anything else starts.
            self._start_metrics(address)
        try:
            await self.manager.start()
        except BaseException:
            await self._stop_metrics()
            await self.manager.close()
            raise
        self._trim = asyncio.create_task(self.trimmer.run(), name="malloc-trim")
        return self

    def _start_metrics(self, address: str) -> None:
        collected = metrics.Metrics(self.manager.metric_state)
        self.manager.store_commit_latency = collected.store_commit_latency.observe
        self.manager.write_latency = collected.write_latency.observe
        collected.registry.register(self.trimmer.collector())
        self.server = metrics.Server(
            address,
            loop=asyncio.get_running_loop(),
            metrics=collected,
            readiness=self.manager.readiness,
            notes=self.manager.readiness_notes,
        )
        self.server.start()
        self._beat = asyncio.create_task(self.server.beat(), name="heartbeat")
        logger.info("metrics, /healthz and /readyz on http://%s", self.server.address)

    async def _stop_metrics(self) -> None:
        beat, self._beat = self._beat, None
        await clock.cancel_and_wait(beat)
        if self.server is not None:
            # shutdown() waits for the serving thread's poll; keep it off the loop.
            await asyncio.to_thread(self.server.stop)
            self.server = None

    async def __aexit__(self, *exc: object) -> None:
        trim, self._trim = self._trim, None
        await clock.cancel_and_wait(trim)
        await self._stop_metrics()
        await self.manager.close()
