"""The pod watch's relist backoff has full jitter (``kube.pods``; issue 15).

When an apiserver restart breaks every node's watch at the same instant, the
nodes must not all list again at the same instants. A fleet of ``NodePods``
runs on one fake clock against an API that refuses every request while the
apiserver is "down"; the times of their first successful relists are compared
with the schedule without jitter (an rng that always draws the top of the
range, which reproduces the old fixed doubling). No real sleeps: the fake
clock moves only when every node is parked on it.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from kubelet_dra import errors
from kubelet_dra.clock import FakeClock
from kubelet_dra.kube import pods as kube_pods
from kubelet_dra.status import claims

DOWN_S = 5.0  # how long the apiserver is away after the watches break
STEP = 0.05  # fake-clock resolution of the drive loop
BUCKET = 0.1  # histogram bucket for "at the same instant"


class _Stop(Exception):
    """Ends a node's run once it has relisted (not an ApiError: not retried)."""


class _Writer:
    def pod_updated(self, pod: Any) -> None:  # pragma: no cover - no pods are listed
        raise AssertionError("no pods in this test")

    def pod_deleted(self, uid: str) -> None:  # pragma: no cover
        raise AssertionError("no pods in this test")


class _Api:
    """The apiserver as one node sees it: the watch breaks, lists fail until ``up``."""

    def __init__(self, clock: FakeClock, up: float) -> None:
        self.clock, self.up = clock, up
        self.broken = False
        self.relisted_at: float | None = None
        self.failed_lists = 0

    def list_node_pods(self, node: str, **_: Any) -> dict[str, Any]:
        if not self.broken:
            return {"items": [], "metadata": {"resourceVersion": "1"}}
        if self.clock.now() < self.up:
            self.failed_lists += 1
            raise errors.ApiError("connection refused", status=None)
        self.relisted_at = self.clock.now()
        return {"items": [], "metadata": {"resourceVersion": "2"}}

    def watch_node_pods(self, node: str, rv: str, **_: Any) -> Any:
        if not self.broken:
            self.broken = True  # every node's watch breaks at the same instant
            raise errors.ApiError("watch closed: connection reset", status=None)
        raise _Stop


class _Top(random.Random):
    """Always the top of the range: the schedule before jitter (0.5, 1, 2, 4 s ...)."""

    def uniform(self, a: float, b: float) -> float:
        return b


async def _fleet(nodes: int, rng_for: Any) -> tuple[list[float], list[_Api], float]:
    """Run ``nodes`` NodePods until each relisted; return relist times after ``up``."""
    clock = FakeClock()
    up = clock.now() + DOWN_S
    apis = [_Api(clock, up) for _ in range(nodes)]
    fleet = [
        kube_pods.NodePods(
            api=api,  # type: ignore[arg-type]
            node_name=f"n{i:04d}",
            index=claims.ClaimIndex(),
            writer=_Writer(),  # type: ignore[arg-type]
            clock=clock,
            rng=rng_for(i),
        )
        for i, api in enumerate(apis)
    ]
    tasks = [asyncio.create_task(p.run()) for p in fleet]
    for _ in range(int(60 / STEP)):
        if not await _parked(clock, tasks):
            break
        clock.advance(STEP)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, _Stop) for r in results), results
    times = [api.relisted_at - up for api in apis if api.relisted_at is not None]
    assert len(times) == nodes
    return sorted(times), apis, up


async def _parked(clock: FakeClock, tasks: list[asyncio.Task[None]]) -> int:
    """Yield until every live task is parked on the clock (none in a thread); return how
    many are live."""
    while True:
        alive = sum(not t.done() for t in tasks)
        if clock.sleepers >= alive:
            return alive
        await asyncio.sleep(0.001)  # a thread (the fake API call) is finishing


def _largest_bucket(times: list[float]) -> int:
    counts: dict[int, int] = {}
    for t in times:
        counts[int(t / BUCKET)] = counts.get(int(t / BUCKET), 0) + 1
    return max(counts.values())


def _pct(times: list[float], q: float) -> float:
    return times[min(len(times) - 1, int(q / 100 * len(times)))]


async def test_without_jitter_every_node_relists_in_the_same_instant() -> None:
    """The control: the old schedule puts all nodes on 0.5 + 1 + 2 + 4 = 7.5 s."""
    times, _, _ = await _fleet(100, lambda i: _Top())
    assert _largest_bucket(times) == 100
    assert times[-1] - times[0] < BUCKET


async def test_with_full_jitter_relists_spread_over_the_backoff_step() -> None:
    master = random.Random(15)
    times, apis, _ = await _fleet(200, lambda i: random.Random(master.random()))
    # No 100 ms window holds more than 10 % of the fleet (without jitter: all of it) ...
    assert _largest_bucket(times) <= 20
    # ... the relists cover seconds, not one instant ...
    assert _pct(times, 90) - _pct(times, 10) >= 1.0
    # ... and every node waited for the server: none listed before it was back.
    assert times[0] >= 0.0
    # Every node kept trying while the server was down (the waits are draws, not gaps).
    assert all(api.failed_lists >= 1 for api in apis)


async def test_each_wait_is_within_the_doubling_step_and_the_cap() -> None:
    clock = FakeClock()

    class _Down(_Api):
        def list_node_pods(self, node: str, **_: Any) -> dict[str, Any]:
            if len(clock.sleep_calls) >= 12:
                raise _Stop
            raise errors.ApiError("connection refused", status=None)

    pods = kube_pods.NodePods(
        api=_Down(clock, up=0.0),  # type: ignore[arg-type]
        node_name="n0",
        index=claims.ClaimIndex(),
        writer=_Writer(),  # type: ignore[arg-type]
        clock=clock,
        backoff_initial=0.5,
        backoff_max=30.0,
        rng=random.Random(1),
    )
    task = asyncio.create_task(pods.run())
    while await _parked(clock, [task]):
        clock.advance(60.0)
    assert isinstance(task.exception(), _Stop)
    steps = [min(0.5 * 2**k, 30.0) for k in range(len(clock.sleep_calls))]
    assert all(0.0 <= wait <= step for wait, step in zip(clock.sleep_calls, steps, strict=True))
    # Full jitter: the waits are draws, not the steps themselves.
    assert sum(clock.sleep_calls) < 0.9 * sum(steps)


def test_relist_delay_is_uniform_between_zero_and_the_step() -> None:
    rng = random.Random(7)
    draws = [kube_pods.relist_delay(4.0, rng) for _ in range(2000)]
    assert min(draws) >= 0.0 and max(draws) <= 4.0
    # Uniform: each quarter of the range holds about a quarter of the draws.
    quarters = [sum(q <= d / 1.0 < q + 1 for d in draws) for q in range(4)]
    assert all(400 <= n <= 600 for n in quarters), quarters
