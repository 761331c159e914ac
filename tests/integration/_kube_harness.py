"""The sidecar's API half wired against FakeApiServer (shared by the kube/writer tests).

Wiring is what the manager does: pods watch -> claim index -> status writer,
health cache changes -> ``index.pods_for_devices`` -> ``writer.mark_dirty``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from kubelet_dra import clock, kube, models, settings
from kubelet_dra.state import healthinfo
from kubelet_dra.status import claims
from kubelet_dra.testing import eventually, fakeapi

from ._driver_fixtures import NODE, WRITER, make_settings

DRV = "gpu.example.com"
H = models.HealthStatus
__all__ = ["DRV", "NODE", "H", "Harness", "running", "settled"]


class Harness:
    def __init__(
        self, server: fakeapi.FakeApiServer, config: settings.Settings, *, beside: bool = False
    ) -> None:
        self.server = server
        self.config = config
        self.clock = clock.SystemClock()
        self.index = claims.ClaimIndex()
        self.cache = healthinfo.HealthCache(default_lease=config.health_timeout)
        self.client = server.api_client()
        self.api = kube.Api(self.client)
        self.writer = kube.StatusWriter(
            api=self.api, node_name=NODE, index=self.index, health=self.cache.get,
            config=config, clock=self.clock, kubelet_beside=lambda: beside,
        )  # fmt: skip
        self.pods = kube.NodePods(
            api=self.api, node_name=NODE, index=self.index, writer=self.writer, clock=self.clock,
            backoff_initial=0.05, backoff_max=0.2, page_size=config.pod_list_page_size,
        )  # fmt: skip
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self.writer.run()), asyncio.create_task(self.pods.run())]

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.writer.aclose()  # also when never started: a round() opens connections
        self.client.close()

    def report(self, device: str, health: H, message: str = "", *, pool: str = "pool") -> None:
        """A driver report, wired like the manager: cache -> index -> writer."""
        changed = self.cache.update(
            DRV, [models.DeviceReport(pool, device, health, message)], now=self.clock.now()
        )
        self.writer.mark_dirty(self.index.pods_for_devices(changed))

    def pod_with_gpu(self, name: str, *devices: str, node: str = NODE) -> dict[str, Any]:
        self.server.create_claim(
            fakeapi.make_claim(f"{name}-gpu", results=[(DRV, "pool", d, "gpu") for d in devices])
        )
        return self.server.create_pod(
            fakeapi.make_pod(name, node, claims=[fakeapi.PodClaim("gpu", f"{name}-gpu")])
        )

    def entries(self, name: str, container: str = "main") -> list[dict[str, Any]]:
        pod = self.server.get_pod("default", name)
        for cs in pod["status"].get("containerStatuses") or ():
            if cs["name"] == container:
                return list(cs.get("allocatedResourcesStatus") or ())
        return []

    def healths(self, name: str) -> dict[str, str]:
        return {r["resourceID"]: r["health"] for e in self.entries(name) for r in e["resources"]}

    def messages(self, name: str) -> list[str]:
        return [r.get("message", "") for e in self.entries(name) for r in e["resources"]]

    def condition(self, name: str) -> dict[str, Any] | None:
        pod = self.server.get_pod("default", name)
        for cond in pod["status"].get("conditions") or ():
            if cond["type"] == self.config.pod_condition_type:
                return dict(cond)
        return None


@contextlib.asynccontextmanager
async def running(*, beside: bool = False, **overrides: Any) -> AsyncIterator[Harness]:
    """The harness running; ``beside``: a kubelet runs on the node (its checkpoint is there)."""
    with fakeapi.FakeApiServer() as server:
        harness = Harness(server, make_settings(tuning=WRITER, **overrides), beside=beside)
        harness.start()
        try:
            yield harness
        finally:
            await harness.stop()


async def settled(harness: Harness, *, quiet: float = 0.15, timeout: float = 10.0) -> None:
    """Wait until the writer has nothing pending and no status write happened for ``quiet``."""
    last = [-1, time.monotonic()]  # status writes seen, when that count last changed

    def quiet_for() -> bool:
        count, pending, now = (
            len(harness.server.status_writes()),
            harness.writer.stats.pending,
            time.monotonic(),
        )
        if count != last[0] or pending:
            last[:] = [count, now]
        assert now - last[1] >= quiet, (
            f"{count} status writes, {pending} pending, quiet for {now - last[1]:.2f} s"
        )
        return True

    await eventually(quiet_for, what=f"the writer to settle for {quiet} s", timeout=timeout)
