"""409s, 5xx runs, 429 with Retry-After and dropped connections all converge."""

from __future__ import annotations

import logging
import random
from typing import Any

import pytest

from kubelet_dra import clock, kube, models
from kubelet_dra.state import healthinfo
from kubelet_dra.status import claims, podstatus
from kubelet_dra.testing import eventually, fakeapi
from tests.integration import _kube_harness as h
from tests.integration._driver_fixtures import WRITER, make_settings

H = h.H
STATUS = r"/pods/[^/]+/status$"


async def _converges(t: h.Harness) -> None:
    t.pod_with_gpu("p1", "gpu-0")
    await eventually(lambda: t.pods.claims_synced)
    t.report("gpu-0", H.UNHEALTHY, "bad")
    await eventually(lambda: t.healths("p1") == {f"{h.DRV}/pool/gpu-0": "Unhealthy"})
    t.report("gpu-0", H.HEALTHY)
    await eventually(lambda: t.healths("p1") == {f"{h.DRV}/pool/gpu-0": "Healthy"})


async def test_conflict_on_first_write_rereads_and_reapplies() -> None:
    async with h.running() as t:
        t.server.conflict_first_write = True
        await _converges(t)
        assert t.writer.stats.results["conflict"] >= 1
        assert t.server.count("GET", r"/pods/p1/status$") >= 1  # the re-read


async def test_kubelet_write_between_read_and_write_is_not_clobbered() -> None:
    async with h.running() as t:
        t.pod_with_gpu("p1", "gpu-0")
        await eventually(lambda: t.pods.claims_synced)
        t.report("gpu-0", H.HEALTHY)
        await eventually(lambda: bool(t.healths("p1")))
        await h.settled(t)
        # The kubelet bumps restartCount; our stale cached copy must not undo it.
        t.server.update_pod("default", "p1", _bump_restart)
        t.report("gpu-0", H.UNHEALTHY)
        await eventually(lambda: t.healths("p1") == {f"{h.DRV}/pool/gpu-0": "Unhealthy"})
        pod = t.server.get_pod("default", "p1")
        assert pod["status"]["containerStatuses"][0]["restartCount"] == 1


def _bump_restart(pod: dict[str, Any]) -> dict[str, Any]:
    pod["status"]["containerStatuses"][0]["restartCount"] = 1
    return pod


@pytest.mark.parametrize("code", [500, 503, 504], ids=["500", "503", "504"])
async def test_runs_of_server_errors_are_retried(code: int) -> None:
    async with h.running() as t:
        t.server.fail("PATCH", STATUS, code=code, times=3)
        await _converges(t)
        assert t.writer.stats.results["retried"] >= 3


async def test_429_waits_retry_after() -> None:
    async with h.running() as t:
        t.server.fail("PATCH", STATUS, code=429, times=1, retry_after=1)
        await _converges(t)
        answers = [r for r in t.server.status_writes() if r.status in (200, 429)]
        first_ok = next(r for r in answers if r.status == 200)
        refused = next(r for r in answers if r.status == 429)
        assert first_ok.timestamp - refused.timestamp >= 0.9


async def test_dropped_connections_are_retried() -> None:
    async with h.running() as t:
        t.server.drop_connection("PATCH", STATUS, times=2)
        await _converges(t)
        answers = [r.status for r in t.server.status_writes("default", "p1")]
        # The first two PATCHes were cut off unanswered (status 0 in the log), the
        # writer retried the same write at once rather than giving it up for a round.
        assert answers[:3] == [0, 0, 200], answers
        assert t.writer.stats.results["retried"] >= 2
        assert t.writer.stats.results["failed"] == 0


async def test_outage_longer_than_the_retries_still_ends_with_the_last_state() -> None:
    async with h.running() as t:
        fault = t.server.fail("PATCH", STATUS, code=503, times=None)
        t.pod_with_gpu("p1", "gpu-0")
        await eventually(lambda: t.pods.claims_synced)
        t.report("gpu-0", H.UNHEALTHY)
        await eventually(lambda: t.writer.stats.results["failed"] >= 1, timeout=10)
        t.server.clear_fault(fault)
        await eventually(
            lambda: t.healths("p1") == {f"{h.DRV}/pool/gpu-0": "Unhealthy"}, timeout=10
        )


@pytest.mark.parametrize("code", [401, 403], ids=["401", "403"])
async def test_refusals_of_a_cold_apiserver_are_written_again_after_the_backoff(
    code: int,
) -> None:
    """A restarted kube-apiserver answers 403 until its RBAC cache has synced (the fleet
    benchmark met it): the write is not retried at once, but after the per-pod backoff,
    and the change is not lost."""
    async with h.running() as t:
        fault = t.server.fail("PATCH", STATUS, code=code, times=None)
        t.pod_with_gpu("p1", "gpu-0")
        await eventually(lambda: t.pods.claims_synced)
        t.report("gpu-0", H.UNHEALTHY)
        await eventually(lambda: t.writer.stats.results["failed"] >= 1, timeout=10)
        assert t.writer.stats.results["retried"] == 0  # not a transient failure
        t.server.clear_fault(fault)
        await eventually(
            lambda: t.healths("p1") == {f"{h.DRV}/pool/gpu-0": "Unhealthy"}, timeout=10
        )


async def test_pod_replaced_under_the_same_name_mid_write_is_dropped_not_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The writer holds the pod as the watch last showed it; before its write
    # goes out the pod is deleted and created again under the same name (a
    # StatefulSet replica, say) and the watch has not told us yet. The write's
    # uid test fails (422), the re-read finds another UID: the old pod is gone.
    with fakeapi.FakeApiServer() as server:
        t = h.Harness(server, make_settings(tuning=WRITER))
        try:
            old = t.pod_with_gpu("p1", "gpu-0")
            t.index.set_pod(old)
            t.index.set_claim(server.get_claim("default", "p1-gpu"))
            t.writer.pod_updated(old)
            t.report("gpu-0", H.UNHEALTHY, "ECC")
            server.delete_pod("default", "p1")
            new = server.create_pod(fakeapi.make_pod("p1", h.NODE))
            assert new["metadata"]["uid"] != old["metadata"]["uid"]
            with caplog.at_level(logging.INFO):
                await t.writer.round()
            assert t.writer.stats.results["gone"] == 1
            assert t.writer.stats.pending == 0  # not retried every second until the watch says so
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
            assert server.count("GET", r"/pods/p1/status$") == 1  # the one re-read
            fresh = server.get_pod("default", "p1")
            assert fresh["metadata"]["uid"] == new["metadata"]["uid"]
            assert "conditions" not in fresh["status"] or not any(
                c["type"] == t.config.pod_condition_type for c in fresh["status"]["conditions"]
            )  # the new pod was not written with the old one's health
        finally:
            await t.writer.aclose()  # the status PATCH's connections (kube.asyncpatch)
            t.client.close()


async def test_transient_failures_of_one_pod_back_off_exponentially_with_a_cap() -> None:
    # An API outage must cost each pod fewer and fewer attempts, not one a second.
    fake = clock.FakeClock()
    with fakeapi.FakeApiServer() as server:
        server.create_claim(fakeapi.make_claim("p1-gpu", results=[(h.DRV, "pool", "gpu-0", "gpu")]))
        pod = server.create_pod(
            fakeapi.make_pod("p1", h.NODE, claims=[fakeapi.PodClaim("gpu", "p1-gpu")])
        )
        index = claims.ClaimIndex()
        index.set_pod(pod)
        index.set_claim(server.get_claim("default", "p1-gpu"))
        cache = healthinfo.HealthCache(default_lease=3600)
        client = server.api_client()
        writer = kube.StatusWriter(
            api=kube.Api(client), node_name=h.NODE, index=index, health=cache.get,
            config=make_settings(tuning=WRITER), clock=fake, max_attempts=1, rng=random.Random(4),
        )  # fmt: skip

        def report(health: models.HealthStatus) -> None:
            device = models.DeviceReport("pool", "gpu-0", health, "")
            writer.mark_dirty(index.pods_for_devices(cache.update(h.DRV, [device], now=fake.now())))

        def backoff() -> float:
            state = writer.state(pod["metadata"]["uid"])
            assert state is not None and state.due is not None
            return state.due - fake.now()

        try:
            report(H.UNHEALTHY)
            writer.pod_updated(pod)
            outage = server.fail("PATCH", STATUS, code=503, times=None)
            for n in range(8):
                await writer.round()
                assert 0.8 * min(30.0, 2.0**n) <= backoff() <= 1.2 * min(30.0, 2.0**n)
                fake.advance(backoff())
            server.clear_fault(outage)
            await writer.round()
            assert writer.stats.results["ok"] == 1 and writer.stats.pending == 0
            resources = server.get_pod("default", "p1")["status"]["containerStatuses"][0][
                "allocatedResourcesStatus"
            ][0]["resources"]
            assert [r["health"] for r in resources] == ["Unhealthy"]
            server.fail("PATCH", STATUS, code=503, times=None)
            fake.advance(1.0)
            report(H.HEALTHY)
            await writer.round()
            assert backoff() <= 1.2  # a success resets the streak
        finally:
            await writer.aclose()
            client.close()


async def test_refused_init_container_entries_are_planned_away_not_resent() -> None:
    # Validation of health entries on init containers (sidecars) is not verified
    # upstream: a 422 whose tests all hold, for a write that carried them, stops
    # sending them, and the retry is planned without them at once.
    async with h.running() as t:
        t.server.create_claim(
            fakeapi.make_claim("p1-gpu", results=[(h.DRV, "pool", "gpu-0", "gpu")])
        )
        pod = fakeapi.make_pod("p1", h.NODE, claims=[fakeapi.PodClaim("gpu", "p1-gpu")])
        side = {**pod["spec"]["containers"][0], "name": "side", "restartPolicy": "Always"}
        pod["spec"]["initContainers"] = [side]
        pod["status"]["initContainerStatuses"] = [fakeapi.container_status("side")]
        t.server.fail("PATCH", STATUS, code=422, times=1)
        t.server.create_pod(pod)
        await eventually(lambda: t.pods.claims_synced)
        t.report("gpu-0", H.UNHEALTHY, "bad")
        await eventually(lambda: t.healths("p1") == {f"{h.DRV}/pool/gpu-0": "Unhealthy"})
        status = t.server.get_pod("default", "p1")["status"]
        assert podstatus.container_entries(status, claims.INIT_CONTAINERS, "side") == []
        refused = [r for r in t.server.status_writes() if r.status == 422]
        assert len(refused) == 1
        assert t.writer.stats.results["failed"] == 0
