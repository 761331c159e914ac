"""Beside a kubelet (issue 19): what ``--container-status`` does when the kubelet writes
the field, removes it, when the API server drops it, and when nobody touches it.

The kubelet is ``_kubelet_status.KubeletStatusManager``: it reconciles through the
FakeApiServer the way kubelet v1.37.2's status manager does (the whole atomic
``containerStatuses`` list in a strategic merge patch, foreign conditions kept), with its
``ResourceHealthStatus`` gate off (the field removed) or on (its own CDI-style entries).
"""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Mapping
from typing import Any

import pytest

from kubelet_dra import clock, kube, models, settings
from kubelet_dra.kube import gates, podstate
from kubelet_dra.state import healthinfo
from kubelet_dra.status import claims
from kubelet_dra.testing import eventually, fakeapi
from tests.integration import _kube_harness as h

from ._driver_fixtures import WRITER, make_settings
from ._kubelet_status import KubeletStatusManager

H = h.H
AUTO, ON, OFF = (settings.ContainerStatusMode(m) for m in ("auto", "on", "off"))
LEAVING = "leaving that field to it"
PERIOD = 0.05  # the test kubelet's reconcile period (the real one: 10 s)
REMOVES = "KubeletRemovesResourceHealth"  # a contract: checks outside this repository use it


def _field_writes(server: fakeapi.FakeApiServer, name: str | None = None) -> int:
    """Our status writes that set or remove ``allocatedResourcesStatus``."""
    return sum(
        any(op["op"] != "test" and "allocatedResourcesStatus" in op["path"] for op in r.body)
        for r in server.status_writes(name=name)
        if isinstance(r.body, list)  # JSON patches are ours; the kubelet's are merge patches
    )


def _node_reasons(server: fakeapi.FakeApiServer) -> list[str]:
    return [e["reason"] for e in server.events() if e["involvedObject"]["kind"] == "Node"]


def _cdi_entries(pod: dict[str, Any], container: str) -> list[dict[str, Any]] | None:
    """A health-aware kubelet's entries: the first CDI device ID of each device."""
    if container != "main":
        return None
    name = pod["metadata"]["name"]
    return [{"name": "claim:gpu", "resources": [
        {"resourceID": f"{h.DRV}/gpu={name}-dev", "health": "Healthy"}]}]  # fmt: skip


async def test_auto_stops_the_field_on_the_node_when_the_kubelet_removes_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kubelet_dra")
    async with h.running(container_status=AUTO) as t:
        kubelet = KubeletStatusManager(t.server)  # gate off
        async with kubelet.running(PERIOD):
            t.pod_with_gpu("p1", "gpu-0")
            await eventually(lambda: t.pods.claims_synced)
            t.report("gpu-0", H.UNHEALTHY, "ECC error")
            await eventually(lambda: t.writer.stats.kubelet_removes, timeout=10)
            at_detection = _field_writes(t.server, "p1")
            await eventually(lambda: _node_reasons(t.server) == [REMOVES])
            # A pod that arrives later on the node never gets the field.
            t.pod_with_gpu("p2", "gpu-1")
            t.report("gpu-1", H.UNHEALTHY, "fan")
            await eventually(lambda: (t.condition("p2") or {}).get("status") == "False")
            for _ in range(3):
                await eventually(lambda: kubelet.reconcile_all() == 0)
            t.report("gpu-0", H.HEALTHY)
            await eventually(lambda: (t.condition("p1") or {}).get("status") == "True")
            await h.settled(t)
        assert _field_writes(t.server, "p2") == 0
        assert _field_writes(t.server, "p1") == at_detection <= 2  # Unknown, Unhealthy; no more
        assert t.entries("p1") == [] and t.entries("p2") == []
        assert t.writer.stats.kubelet_owned_pods == 0  # not "the kubelet writes it"
        assert t.writer.stats.field_removals == 1
        assert _node_reasons(t.server) == [REMOVES]  # once
        assert gates.KUBELET_REMOVES_REASON == REMOVES
    said = [r.getMessage() for r in caplog.records if "ResourceHealthStatus" in r.getMessage()]
    assert len(said) == 1 and "removes" in said[0] and "pod condition DeviceHealthy" in said[0]
    assert not [r for r in caplog.records if LEAVING in r.getMessage()]


async def test_removals_on_several_pods_are_counted_each_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kubelet_dra")
    async with h.running(container_status=AUTO) as t:
        for n in range(3):
            t.pod_with_gpu(f"p{n}", f"gpu-{n}")
        await eventually(lambda: t.pods.claims_synced)
        for n in range(3):
            t.report(f"gpu-{n}", H.UNHEALTHY)
        await eventually(lambda: all(t.healths(f"p{n}") for n in range(3)))
        await h.settled(t)
        kubelet = KubeletStatusManager(t.server)  # gate off: removes all three
        assert kubelet.reconcile_all() == 3
        await eventually(lambda: t.writer.stats.field_removals == 3)
        await eventually(lambda: _node_reasons(t.server) == [REMOVES])
        await h.settled(t)
        kubelet.close()
        (event,) = [e for e in t.server.events() if e["reason"] == REMOVES]
        assert event["count"] == 1 and event["type"] == "Warning"
        assert "ResourceHealthStatus feature gate is off" in event["message"]
    said = [r for r in caplog.records if r.name == "kubelet_dra.kube.gates"]
    assert len(said) == 1 and said[0].levelno == logging.WARNING


async def test_auto_leaves_the_field_to_a_kubelet_that_writes_its_own_entries(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kubelet_dra")
    async with h.running(container_status=AUTO) as t:
        t.pod_with_gpu("p1", "gpu-0")
        await eventually(lambda: t.pods.claims_synced)
        t.report("gpu-0", H.UNHEALTHY)
        await eventually(lambda: bool(t.healths("p1")))  # ours first, then the kubelet's
        kubelet = KubeletStatusManager(t.server, entries=_cdi_entries)  # gate on
        async with kubelet.running(PERIOD):
            await eventually(lambda: t.writer.stats.kubelet_owned_pods == 1)
            at_detection = _field_writes(t.server, "p1")
            t.report("gpu-0", H.HEALTHY)
            await eventually(lambda: (t.condition("p1") or {}).get("status") == "True")
            await h.settled(t)
        assert t.healths("p1") == {f"{h.DRV}/gpu=p1-dev": "Healthy"}  # the kubelet's
        assert _field_writes(t.server, "p1") == at_detection <= 2
        assert not t.writer.stats.kubelet_removes and t.writer.stats.field_removals == 0
        assert REMOVES not in _node_reasons(t.server)
    assert [r for r in caplog.records if LEAVING in r.getMessage()]


async def test_auto_keeps_writing_the_field_when_nobody_touches_it() -> None:
    async with h.running(container_status=AUTO) as t:
        kubelet = KubeletStatusManager(t.server, touch=True, flip_ready=True, keep_field=True)
        t.pod_with_gpu("p1", "gpu-0")
        await eventually(lambda: t.pods.claims_synced)
        for health in (H.UNHEALTHY, H.HEALTHY, H.UNHEALTHY):
            t.report("gpu-0", health)
            want = {f"{h.DRV}/pool/gpu-0": health.value}
            await eventually(lambda: t.healths("p1") == want)  # noqa: B023
            await h.settled(t)
            # Restart counts and readiness change; our field is sent back as it was.
            await _reconciled(t, kubelet, "p1")
        kubelet.close()
        assert _field_writes(t.server, "p1") >= 3
        assert not t.writer.stats.kubelet_removes and t.writer.stats.kubelet_owned_pods == 0


async def test_a_field_the_api_server_drops_is_not_taken_for_the_kubelet() -> None:
    async with h.running(container_status=AUTO) as t:
        t.server.health_gate = False
        kubelet = KubeletStatusManager(t.server, touch=True)  # gate off, restart counts move
        t.pod_with_gpu("p1", "gpu-0")
        await eventually(lambda: t.pods.claims_synced)
        t.report("gpu-0", H.UNHEALTHY)
        await eventually(lambda: t.writer.stats.gate_off)
        for health in (H.HEALTHY, H.UNHEALTHY, H.HEALTHY):
            await _reconciled(t, kubelet, "p1")  # later versions from someone else, no field
            t.report("gpu-0", health)
            await eventually(lambda: (t.condition("p1") or {}).get("status") == _STATUS[health])  # noqa: B023
        kubelet.close()
        assert not t.writer.stats.kubelet_removes and t.writer.stats.field_removals == 0
        assert _node_reasons(t.server) == ["ResourceHealthStatusDisabled"]


async def _reconciled(t: h.Harness, kubelet: KubeletStatusManager, name: str) -> None:
    """One kubelet reconcile of ``name``, seen by the writer, and the writer settled."""
    kubelet.reconcile("default", name)
    rv = _rv(t.server.get_pod("default", name))
    await eventually(lambda: _rv(t.pods.get(_uid(t, name)) or {}) >= rv)
    await h.settled(t)


_STATUS = {H.HEALTHY: "True", H.UNHEALTHY: "False"}


async def test_the_condition_survives_the_kubelets_patches() -> None:
    # The kubelet changes its own Ready condition too: its patch merges conditions by type.
    async with h.running(container_status=AUTO) as t:
        kubelet = KubeletStatusManager(t.server, flip_ready=True)
        t.pod_with_gpu("p1", "gpu-0", "gpu-1")
        await eventually(lambda: t.pods.claims_synced)
        t.report("gpu-0", H.UNHEALTHY, "XID 48")
        t.report("gpu-1", H.HEALTHY)
        await eventually(lambda: (t.condition("p1") or {}).get("status") == "False")
        await h.settled(t)
        before = t.condition("p1")
        for _ in range(5):
            kubelet.reconcile("default", "p1")
            await h.settled(t, quiet=0.05)
        kubelet.close()
        assert t.condition("p1") == before
        assert before is not None
        assert before["message"] == f"Unhealthy devices: {h.DRV}/pool/gpu-0 (claim gpu): XID 48"
        assert any("conditions" in p["status"] for p in kubelet.patches)
        assert t.writer.stats.kubelet_removes  # the field went; the condition stayed


async def test_off_ignores_a_kubelet_that_removes_nothing_of_ours() -> None:
    async with h.running(container_status=OFF) as t:
        kubelet = KubeletStatusManager(t.server)
        async with kubelet.running(PERIOD):
            t.pod_with_gpu("p1", "gpu-0")
            await eventually(lambda: t.pods.claims_synced)
            t.report("gpu-0", H.UNHEALTHY)
            await eventually(lambda: (t.condition("p1") or {}).get("status") == "False")
            await h.settled(t)
        assert _field_writes(t.server) == 0
        assert not t.writer.stats.kubelet_removes
        assert REMOVES not in _node_reasons(t.server)


# -- ``on`` beside a kubelet that removes the field: a per-pod backoff, on the fake clock --

HOUR = 3600.0
RECONCILE = 10.0  # the kubelet's status manager: syncBatch every 10 s
# One write at the start, then rewrites after 10, 20, 40, 80, 160 s of backoff, then at most
# one per 300 s: at most 1 + 5 + 3600/300 writes of the field in the first hour.
BOUND = 1 + 5 + int(HOUR // podstate.REMOVAL_BACKOFF_MAX)


async def test_on_rewrites_a_removed_field_with_a_per_pod_backoff_over_an_hour() -> None:
    with fakeapi.FakeApiServer() as server:
        kubelet = KubeletStatusManager(server)  # gate off
        written_at, writer = await _on_for_an_hour(server, kubelet, ["gpu-0"])
    gaps = [b - a for a, b in itertools.pairwise(written_at)]
    assert 10 < len(written_at) <= BOUND, written_at
    assert all(gap >= podstate.REMOVAL_BACKOFF_MAX for gap in gaps[5:]), gaps
    assert kubelet.writes == len(written_at)  # each of ours removed once: no war
    assert writer.stats.field_removals == kubelet.writes


CHIPS = [f"tpu-{i}" for i in range(4)]
SHARED = f"{h.DRV}/tpu=common"  # the first CDI ID of every chip (the TPU driver's)


def _shared_first_id(pod: dict[str, Any], container: str) -> list[dict[str, Any]] | None:
    """A gate-on kubelet (1.36+) beside chips sharing their first CDI ID: one entry, one ID."""
    if container != "main":
        return None
    return [{"name": "claim:gpu", "resources": [{"resourceID": SHARED, "health": "Healthy"}]}]


async def test_on_backs_off_a_kubelet_that_rewrites_the_field_over_an_hour(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # We write one ID per chip, the kubelet its one shared-ID entry at each reconcile after
    # ours: without the backoff, one write from each side every 10 s for the whole hour.
    with fakeapi.FakeApiServer() as server:
        kubelet = KubeletStatusManager(server, entries=_shared_first_id)  # gate on
        written_at, writer = await _on_for_an_hour(server, kubelet, CHIPS)
        field = server.get_pod("default", "p1")["status"]["containerStatuses"][0]
    gaps = [b - a for a, b in itertools.pairwise(written_at)]
    assert 10 < len(written_at) <= BOUND, (len(written_at), written_at)
    assert all(gap >= podstate.REMOVAL_BACKOFF_MAX for gap in gaps[5:]), gaps
    assert kubelet.writes <= len(written_at) + 1  # each of ours rewritten once: no war
    assert writer.stats.field_rewrites == len(written_at)
    assert writer.stats.field_removals == 0 and writer.stats.kubelet_owned_pods == 0
    assert field["allocatedResourcesStatus"] == _shared_first_id({}, "main")  # the kubelet's
    said = [r for r in caplog.records if "rewrites containerStatuses" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING  # said once, counted each
    assert "--container-status auto" in said[0].getMessage()


async def _on_for_an_hour(
    server: fakeapi.FakeApiServer, kubelet: KubeletStatusManager, devices: list[str]
) -> tuple[list[float], kube.StatusWriter]:
    """``on`` beside ``kubelet`` for an hour on the fake clock: the last device fails,
    the kubelet reconciles every 10 s; when each field write of ours was sent."""
    fake = clock.FakeClock()
    results = [(h.DRV, "pool", d, "gpu") for d in devices]
    server.create_claim(fakeapi.make_claim("p1-gpu", results=results))
    pod = server.create_pod(
        fakeapi.make_pod("p1", h.NODE, claims=[fakeapi.PodClaim("gpu", "p1-gpu")])
    )
    index = claims.ClaimIndex()
    index.set_pod(pod)
    index.set_claim(server.get_claim("default", "p1-gpu"))
    cache = healthinfo.HealthCache(default_lease=10 * HOUR)
    client = server.api_client()
    writer = kube.StatusWriter(
        api=kube.Api(client), node_name=h.NODE, index=index, health=cache.get,
        config=make_settings(tuning=WRITER, container_status=ON), clock=fake,
        rng=random.Random(1),
    )  # fmt: skip
    *healthy, failed = devices  # the last fails: the kubelet's shared ID shows chip 0's health
    reports = [models.DeviceReport("pool", d, H.HEALTHY) for d in healthy]
    reports.append(models.DeviceReport("pool", failed, H.UNHEALTHY, "ECC"))
    writer.mark_dirty(index.pods_for_devices(cache.update(h.DRV, reports, now=fake.now())))
    writer.pod_updated(pod)
    written_at: list[float] = []
    try:
        for _ in range(int(HOUR // RECONCILE)):
            before = _field_writes(server)
            await writer.round()
            if _field_writes(server) > before:
                written_at.append(fake.now())
            fake.advance(RECONCILE)
            if kubelet.reconcile("default", "p1"):
                writer.pod_updated(server.get_pod("default", "p1"))  # what the watch brings
    finally:
        await writer.aclose()
        kubelet.close()
        client.close()
    cond = next(c for c in server.get_pod("default", "p1")["status"]["conditions"]
                if c["type"] == "DeviceHealthy")  # fmt: skip
    assert cond["status"] == "False"  # the condition never needed a rewrite
    return written_at, writer


def _rv(pod: Mapping[str, Any]) -> int:
    return int((pod.get("metadata") or {}).get("resourceVersion") or 0)


def _uid(t: h.Harness, name: str) -> str:
    return str(t.server.get_pod("default", name)["metadata"]["uid"])


def _same_ids(pod: dict[str, Any], container: str) -> list[dict[str, Any]] | None:
    """A health-aware kubelet whose IDs equal ours (what the checkpoint gives us)."""
    if container != "main":
        return None
    return [{"name": "claim:gpu", "resources": [
        {"resourceID": f"{h.DRV}/pool/gpu-0", "health": "Unhealthy"}]}]  # fmt: skip


def _first_write_sets_field(server: fakeapi.FakeApiServer, name: str) -> bool:
    ours = [r.body for r in server.status_writes(name=name) if isinstance(r.body, list)]
    return any(op["op"] != "test" and "allocatedResourcesStatus" in op["path"] for op in ours[0])


GRACE = 1.0  # the test's --kubelet-field-grace (default 20 s: two kubelet reconciles)


@pytest.mark.parametrize("kubelet_entries", [_cdi_entries, _same_ids], ids=["cdi-ids", "same-ids"])
async def test_auto_beside_a_kubelet_holds_the_field_until_it_writes_its_own(
    kubelet_entries: Any,
) -> None:
    # The e2e race (once in three runs): we wrote the field before the gate-on kubelet did.
    # The hold runs from our first look at the pod; the kubelet starts well inside it.
    async with h.running(container_status=AUTO, beside=True, kubelet_field_grace=5.0) as t:
        t.pod_with_gpu("p1", "gpu-0")
        await eventually(lambda: t.pods.claims_synced)
        await eventually(lambda: t.condition("p1") is not None)  # Unknown: no report yet
        assert not _first_write_sets_field(t.server, "p1")  # the condition goes at once
        kubelet = KubeletStatusManager(t.server, entries=kubelet_entries)  # gate on
        async with kubelet.running(PERIOD):
            t.report("gpu-0", H.UNHEALTHY, "ECC error")
            await eventually(lambda: (t.condition("p1") or {}).get("status") == "False")
            await eventually(lambda: t.writer.stats.kubelet_owned_pods == 1, timeout=10)
            t.report("gpu-0", H.HEALTHY)
            await eventually(lambda: (t.condition("p1") or {}).get("status") == "True")
            await h.settled(t, quiet=GRACE + 0.2)
        assert _field_writes(t.server, "p1") == 0


async def test_auto_beside_a_kubelet_writes_the_field_after_the_grace_and_sees_removal() -> None:
    async with h.running(container_status=AUTO, beside=True, kubelet_field_grace=GRACE) as t:
        kubelet = KubeletStatusManager(t.server)  # gate off: removes what it finds
        async with kubelet.running(PERIOD):
            t.pod_with_gpu("p1", "gpu-0")
            await eventually(lambda: t.pods.claims_synced)
            t.report("gpu-0", H.UNHEALTHY, "ECC error")
            await eventually(lambda: (t.condition("p1") or {}).get("status") == "False")
            assert not _first_write_sets_field(t.server, "p1")
            await eventually(lambda: t.writer.stats.kubelet_removes, timeout=10)
            await h.settled(t)
        assert _field_writes(t.server, "p1") == 1
        assert _node_reasons(t.server) == [REMOVES]


async def test_auto_beside_a_silent_kubelet_writes_the_field_after_the_grace() -> None:
    async with h.running(container_status=AUTO, beside=True, kubelet_field_grace=GRACE) as t:
        t.pod_with_gpu("p1", "gpu-0")
        await eventually(lambda: t.pods.claims_synced)
        t.report("gpu-0", H.UNHEALTHY)
        await eventually(lambda: (t.condition("p1") or {}).get("status") == "False")
        assert not _first_write_sets_field(t.server, "p1")
        await eventually(lambda: t.healths("p1") == {f"{h.DRV}/pool/gpu-0": "Unhealthy"})
        assert t.writer.stats.kubelet_owned_pods == 0


async def test_auto_without_a_kubelet_writes_the_field_in_the_first_write() -> None:
    async with h.running(container_status=AUTO, kubelet_field_grace=GRACE) as t:
        t.pod_with_gpu("p1", "gpu-0")
        await eventually(lambda: t.pods.claims_synced)
        t.report("gpu-0", H.UNHEALTHY)
        await eventually(lambda: bool(t.healths("p1")))
        assert _first_write_sets_field(t.server, "p1")
