"""The benchmarks still run, still check their end states, and their floors and verdicts hold.

Runs the ingest, latency, storm, persistence, restart, apiload and kubectl scenarios of
``benchmarks`` at their ``SMOKE`` sizes: a real benchmark driver process, the in-process
pipeline and store, and a real sidecar process against the API stand-in. A scenario that
ends in a wrong state reports a failure. Figures are not looked at, except where a
floor or a verdict would otherwise be wrong without anything failing: every row with a
target carries a verdict; the latency bursts coalesce under the window; the memory
floor runs as the sidecar does; the kubelet persistence baseline writes only when a
device changed.
"""

from __future__ import annotations

import asyncio
import importlib
import pathlib

import pytest

from benchmarks import _common, latency, memory, persistence
from kubelet_dra.testing import FakeApiServer, FakeDriver

# A scenario at its smallest size still starts real processes; latency runs two windows
# with bursts, which on a loaded 2-core machine takes over the default 60 s.
pytestmark = pytest.mark.timeout(300)

SCENARIOS = ["ingest", "latency", "storm", "persistence", "restart", "apiload", "kubectl"]
_OUTCOMES: dict[str, _common.Outcome] = {}


async def _outcome(name: str) -> _common.Outcome:
    if name not in _OUTCOMES:
        module = importlib.import_module(f"benchmarks.{name}")
        _OUTCOMES[name] = await module.run(module.SMOKE)
    return _OUTCOMES[name]


@pytest.mark.parametrize("name", SCENARIOS, ids=str)
async def test_benchmark_scenario_runs_and_ends_in_the_exact_state(name: str) -> None:
    outcome = await _outcome(name)
    assert outcome.failures == []
    assert outcome.summary, "every scenario reports at least one summary row"
    assert outcome.tables
    for row in outcome.summary:
        # A row with a target is judged; only "report" rows may go without a verdict.
        if not row.target.startswith("report"):
            assert row.met is not None, f"{row.scenario}: target {row.target!r}, no verdict"


async def test_latency_judges_the_in_process_floor_and_its_bursts_coalesce() -> None:
    outcome = await _outcome("latency")
    rows = {r.scenario: r for r in outcome.summary}
    for window in ("50", "0"):
        in_process = rows[f"2 latency, window {window} ms"]
        assert in_process.target.startswith("p50 ≤") and isinstance(in_process.met, bool)
    burst = rows["2 latency, window 50 ms, bursts of 3 changes 10 ms apart"]
    # 3 changes 10 ms apart: one leading-edge write, then one for the other two.
    assert burst.met is True, burst
    assert burst.value is not None and burst.value < 1.0  # fewer writes than window 0


def test_the_kubelet_persistence_baseline_writes_only_when_a_device_changed(
    tmp_path: pathlib.Path,
) -> None:
    kubelet = persistence.KubeletFile(tmp_path / "dra_health_state", devices=4)
    reports = [(0, True), (0, True), (1, False), (0, False), (2, True), (2, True), (0, False)]
    for device, bad in reports:
        kubelet.change(device, bad)
    assert kubelet.writes == persistence.changed_reports(4, reports) == 3
    assert kubelet.read() == {
        "dev-000000": "Healthy", "dev-000001": "Healthy", "dev-000002": "Unhealthy",
        "dev-000003": "Healthy",
    }  # fmt: skip


async def test_the_memory_floor_runs_as_the_sidecar_does(tmp_path: pathlib.Path) -> None:
    with FakeApiServer() as api:
        _common.build_cluster(api, pods=2, devices_per_pod=1)
        async with FakeDriver(name=_common.DRIVER, registry=tmp_path / "reg") as drv:
            await drv.set_health({"pool": _common.POOL, "device": "d", "health": "Healthy"})
            # In a thread: the driver answers the floor's stream from this event loop.
            info = await asyncio.to_thread(memory.floor_process, drv.dra_socket, api)
    memory.check_floor(info, devices=1, pods=2)
    assert info["arenas_capped"] is True and info["core_v1_api"] is False


def test_a_floor_that_ran_unlike_the_sidecar_is_refused() -> None:
    good = {"devices": 100, "pods": 110, "arenas_capped": True, "core_v1_api": False}
    for bad in ({"arenas_capped": False}, {"core_v1_api": True}, {"pods": 0}):
        with pytest.raises(_common.CheckFailed, match="memory floor"):
            memory.check_floor(good | bad, devices=100, pods=110)


def test_the_latency_config_runs_the_burst_case_at_every_size() -> None:
    for config in (latency.FULL, latency.QUICK, latency.SMOKE):
        assert config.bursts > 0 and 0.0 in config.windows and 0.05 in config.windows
    assert latency.FULL.runs >= 3
