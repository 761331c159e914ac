"""``AgentPods``: a node agent's pods, their desired status coalesced into its callback.

Fake clock: the write window passes when the test advances it, never by sleeping.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from kubelet_dra import agentpods, clock, models, settings
from kubelet_dra.state import healthinfo
from kubelet_dra.status import claims
from kubelet_dra.testing import make_pod

DRIVER = "gpu.example.com"
GPU0 = models.DeviceKey(DRIVER, "pool", "gpu-0")


class Agent:
    def __init__(self) -> None:
        self.clock = clock.FakeClock()
        self.cache = healthinfo.HealthCache()
        self.index = claims.ClaimIndex()
        self.updates: list[agentpods.PodHealthUpdate] = []
        self.fail = False
        self.pods = agentpods.AgentPods(
            index=self.index,
            health=self.cache.get,
            settings=settings.Settings(write_window=1.0),
            clock=self.clock,
            on_status=self.on_status,
        )

    async def on_status(self, update: agentpods.PodHealthUpdate) -> None:
        if self.fail:
            raise RuntimeError("agent bug")
        self.updates.append(update)

    def report(self, health: models.HealthStatus, message: str = "") -> None:
        report = models.DeviceReport("pool", "gpu-0", health, message)
        self.pods.mark_dirty(
            self.index.pods_for_devices(self.cache.update(DRIVER, [report], now=self.clock.now()))
        )

    async def window(self) -> None:
        """Let the loop reach its window sleep, pass the window, let it deliver."""
        await self.clock.wait_for_sleepers(1)
        self.clock.advance(1.0)
        for _ in range(10):
            await asyncio.sleep(0)

    def healths(self) -> list[list[str]]:
        return [[str(d.health) for d in u.desired.devices] for u in self.updates]


@pytest.fixture
async def agent() -> AsyncIterator[Agent]:
    made = Agent()
    made.index.add_prepared_claim(
        namespace="default",
        name="train-gpu",
        devices=[claims.PreparedDevice(DRIVER, "pool", "gpu-0")],
        pod_uids=["uid-train"],
    )
    pod = make_pod("train", claims=["train-gpu"])
    pod["metadata"]["uid"] = "uid-train"
    made.pods.set_pod(pod)
    task = asyncio.create_task(made.pods.run())
    try:
        yield made
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_changes_within_a_window_become_one_callback_with_the_latest_state(
    agent: Agent,
) -> None:
    await agent.window()
    assert agent.healths() == [["Unknown"]]  # set_pod: the pod before any report
    agent.report(models.HealthStatus.HEALTHY)
    agent.report(models.HealthStatus.UNHEALTHY, "XID 79")
    assert agent.pods.pending == 1
    await agent.window()
    assert agent.healths() == [["Unknown"], ["Unhealthy"]]
    assert agent.updates[-1].desired.devices[0].message == "XID 79"
    assert agent.pods.pending == 0


async def test_a_failing_callback_is_logged_and_the_next_change_is_delivered(
    agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    agent.fail = True
    await agent.window()
    assert "status callback failed for pod uid-train" in caplog.text
    assert any(r.levelno == logging.ERROR and r.exc_info for r in caplog.records)
    agent.fail = False
    agent.report(models.HealthStatus.HEALTHY)
    await agent.window()
    assert agent.healths() == [["Healthy"]]


async def test_a_removed_pod_gets_no_callback(agent: Agent) -> None:
    await agent.window()
    agent.report(models.HealthStatus.UNHEALTHY)
    agent.pods.remove_pod("uid-train")
    await agent.window()
    assert agent.healths() == [["Unknown"]]
    assert agent.pods.desired("uid-train") is None
