"""Metrics and probes of a running sidecar (``kubelet_dra.Sidecar``, in process).

The sidecar runs on the test's event loop; HTTP requests go from a worker
thread, as the metrics server answers through that loop.
"""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import parser

from kubelet_dra import settings
from kubelet_dra.sidecar import Sidecar
from kubelet_dra.state import healthinfo
from kubelet_dra.status import podstatus
from kubelet_dra.testing import FakeApiServer, FakeDriver, eventually

from ._kubelet_status import KubeletStatusManager
from ._sidecar_process import DRIVER, NODE, device, health_of, http_get, settings_for

FAMILIES = {
    # issue 5: per driver endpoint stream state, reconnects
    "kubelet_dra_stream_state": "gauge",
    "kubelet_dra_stream_reconnects": "counter",
    # reports and device updates received, refused reports by reason
    "kubelet_dra_reports": "counter",
    "kubelet_dra_device_updates": "counter",
    "kubelet_dra_refused": "counter",
    # issue 11: registrations refused by validation (kubelet v1.38), by reason
    "kubelet_dra_registrations_refused": "counter",
    # issue 19: reads of the kubelet's DRA checkpoint refused, by reason
    "kubelet_dra_checkpoint_refused": "counter",
    # issue 22: failed registration attempts (retried), registry entries passed over
    "kubelet_dra_registration_failures": "counter",
    "kubelet_dra_registry_ignored_entries": "gauge",
    # devices by health, lease expiries
    "kubelet_dra_devices": "gauge",
    "kubelet_dra_lease_expiries": "counter",
    # pod writes by result, pending dirty pods, write latency
    "kubelet_dra_pod_writes": "counter",
    "kubelet_dra_pending_pods": "gauge",
    "kubelet_dra_pod_write_duration_seconds": "histogram",
    # store commit latency (and the store's state)
    "kubelet_dra_store_commit_duration_seconds": "histogram",
    "kubelet_dra_store_degraded": "gauge",
    "kubelet_dra_store_pending_records": "gauge",
    "kubelet_dra_store_errors": "counter",
    # age of the last report per driver
    "kubelet_dra_last_report_age_seconds": "gauge",
    # the API server drops allocatedResourcesStatus (gate off)
    "kubelet_dra_api_field_dropped": "gauge",
    # issue 19: the node's kubelet removes the field (its gate off), and removals seen
    "kubelet_dra_kubelet_removes_field": "gauge",
    "kubelet_dra_field_removals": "counter",
    # issue 39: rewrites by the kubelet of the field we wrote (``on``), counted like removals
    "kubelet_dra_field_rewrites": "counter",
    # issue 22 (the soak): pods whose field is left to a kubelet that writes it
    "kubelet_dra_kubelet_owned_pods": "gauge",
    # issue 22: connections and requests the metrics port refused, by reason
    "kubelet_dra_metrics_server_refused": "counter",
    # issue 22 (the soak): asyncio tasks alive on the event loop
    "kubelet_dra_event_loop_tasks": "gauge",
    # issue 22 (the soak's RSS): the status-PATCH pool's connections
    "kubelet_dra_status_patch_connections": "gauge",
    "kubelet_dra_status_patch_idle_connections": "gauge",
    "kubelet_dra_status_patch_connections_opened": "counter",
}


class Scrape:
    """One /metrics answer, parsed."""

    def __init__(self, text: str) -> None:
        self.families = {f.name: f for f in parser.text_string_to_metric_families(text)}

    def value(self, sample: str, **labels: str) -> float | None:
        for family in self.families.values():
            for s in family.samples:
                if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                    return float(s.value)
        return None


pytestmark = pytest.mark.usefixtures("cluster_objects")


def config(sockdir: pathlib.Path, api: FakeApiServer, **extra: Any) -> settings.Settings:
    return settings_for(sockdir, api, metrics_address="127.0.0.1:0", **extra)


@pytest.fixture
async def driver(sockdir: pathlib.Path) -> AsyncIterator[FakeDriver]:
    (sockdir / "reg").mkdir(exist_ok=True)
    async with FakeDriver(DRIVER, registry=sockdir / "reg") as fake:
        yield fake


async def scrape(sidecar: Sidecar) -> Scrape:
    assert sidecar.server is not None
    code, body = await http_get(f"http://{sidecar.server.address}/metrics")
    assert code == 200, body
    return Scrape(body)


async def scrape_until(sidecar: Sidecar, sample: str, at_least: float, **labels: str) -> Scrape:
    """Scrape until ``sample`` reaches ``at_least``: the API shows a write before
    the writer has read the answer and counted it."""

    async def reached() -> Scrape:
        found = await scrape(sidecar)
        value = found.value(sample, **labels) or 0
        assert value >= at_least, f"{sample}{labels} = {value}"
        return found

    return await eventually(reached, what=f"{sample}{labels} >= {at_least}")


async def probe(sidecar: Sidecar, path: str) -> tuple[int, str]:
    assert sidecar.server is not None
    return await http_get(f"http://{sidecar.server.address}{path}")


async def test_readyz_is_503_until_the_pod_cache_syncs(
    sockdir: pathlib.Path, api: FakeApiServer
) -> None:
    # The first pod list is slow: the sidecar is up but not ready.
    api.delay("GET", r"/pods$", 1.0, times=1, watch=False)
    async with Sidecar(config(sockdir, api)) as sidecar:
        code, body = await probe(sidecar, "/readyz")
        assert code == 503
        detail = json.loads(body)
        assert detail["ready"] is False
        assert detail["checks"]["store"] == "ok"
        assert detail["checks"]["pods"] in ("pod cache not synced", "not started")
        assert (await probe(sidecar, "/healthz"))[0] == 200
        await eventually(lambda: sidecar.manager.readiness().get("claims") == "ok", timeout=5)
        code, body = await probe(sidecar, "/readyz")
        assert code == 200, body
        assert json.loads(body) == {
            "ready": True,
            "checks": {"claims": "ok", "pods": "ok", "store": "ok"},
        }


async def test_a_kubelet_that_removes_the_field_shows_in_metrics_and_readyz(
    sockdir: pathlib.Path, api: FakeApiServer, driver: FakeDriver
) -> None:
    await driver.set_health(device("gpu-0"), device("gpu-1", "Unhealthy"))
    async with Sidecar(config(sockdir, api)) as sidecar:
        await eventually(lambda: health_of(api, "train-b", "gpu-1") == "Unhealthy")
        before = await scrape(sidecar)
        assert before.value("kubelet_dra_kubelet_removes_field") == 0
        code, body = await probe(sidecar, "/readyz")
        assert code == 200 and "notes" not in json.loads(body)
        async with KubeletStatusManager(api, node=NODE).running(0.05):  # its gate off
            found = await scrape_until(sidecar, "kubelet_dra_kubelet_removes_field", 1)
        assert (found.value("kubelet_dra_field_removals_total") or 0) >= 1
        code, body = await probe(sidecar, "/readyz")
        detail = json.loads(body)
        assert code == 200 and detail["ready"] is True, body  # a note, not a failed check
        note = detail["notes"]["container_status"]
        assert "removes" in note and "ResourceHealthStatus feature gate is off" in note
        assert "pod condition DeviceHealthy" in note


def _cdi_entries(pod: dict[str, Any], container: str) -> list[dict[str, Any]] | None:
    """A health-aware kubelet's entries (gate on): its CDI IDs under our entry names."""
    entries = podstatus.container_entries(pod["status"], "containerStatuses", container)
    cdi = [{"resourceID": f"{DRIVER}/gpu=dev", "health": "Healthy"}]
    return [{"name": e["name"], "resources": cdi} for e in entries] or None


async def test_pods_left_to_a_kubelet_that_writes_the_field_are_counted(
    sockdir: pathlib.Path, api: FakeApiServer, driver: FakeDriver
) -> None:
    await driver.set_health(device("gpu-0"), device("gpu-1", "Unhealthy"))
    async with Sidecar(config(sockdir, api)) as sidecar:
        await eventually(lambda: health_of(api, "train-b", "gpu-1") == "Unhealthy")
        await eventually(lambda: health_of(api, "train-a", "gpu-0") == "Healthy")
        assert (await scrape(sidecar)).value("kubelet_dra_kubelet_owned_pods") == 0
        async with KubeletStatusManager(api, node=NODE, entries=_cdi_entries).running(0.05):
            await scrape_until(sidecar, "kubelet_dra_kubelet_owned_pods", 2)


async def test_every_metric_family_is_exported(
    sockdir: pathlib.Path, api: FakeApiServer, driver: FakeDriver
) -> None:
    await driver.set_health(device("gpu-0"), device("gpu-1"))
    async with Sidecar(config(sockdir, api)) as sidecar:
        await eventually(lambda: health_of(api, "train-a", "gpu-0") == "Healthy")
        found = await scrape(sidecar)
    exported = {name: family.type for name, family in found.families.items()}
    missing = {n: t for n, t in FAMILIES.items() if exported.get(n) != t}
    assert not missing, f"missing or wrong type: {missing}; exported: {sorted(exported)}"


async def test_metric_values_follow_the_pipeline(
    sockdir: pathlib.Path, api: FakeApiServer, driver: FakeDriver
) -> None:
    await driver.set_health(device("gpu-0"), device("gpu-1"))
    # Long enough that a loaded CI machine never expires a lease before the
    # first scrape; short enough to wait for in the silence step.
    cfg = config(sockdir, api, health_timeout=2.0)
    async with Sidecar(cfg) as sidecar:
        await eventually(lambda: health_of(api, "train-b", "gpu-1") == "Healthy")
        first = await scrape_until(sidecar, "kubelet_dra_pod_writes_total", 2, result="ok")
        assert first.value("kubelet_dra_reports_total", driver=DRIVER) == 1
        assert first.value("kubelet_dra_device_updates_total", driver=DRIVER) == 2
        assert first.value("kubelet_dra_devices", driver=DRIVER, health="Healthy") == 2
        assert first.value("kubelet_dra_devices", driver=DRIVER, health="Unhealthy") == 0
        assert first.value("kubelet_dra_stream_state", driver=DRIVER, state="streaming") == 1
        assert first.value("kubelet_dra_stream_state", driver=DRIVER, state="backoff") == 0
        assert first.value("kubelet_dra_pod_writes_total", result="failed") == 0
        assert (first.value("kubelet_dra_pod_write_duration_seconds_count") or 0) >= 2
        age = first.value("kubelet_dra_last_report_age_seconds", driver=DRIVER)
        assert age is not None and 0 <= age < 5
        # The writes went through the event loop's pool: one connection at least was
        # opened, and each open one is either idle or carrying a write.
        assert (first.value("kubelet_dra_status_patch_connections_opened_total") or 0) >= 1
        pool = first.value("kubelet_dra_status_patch_connections")
        idle = first.value("kubelet_dra_status_patch_idle_connections")
        assert pool is not None and idle is not None and 0 <= idle <= pool

        # A bad report: an entry without a device name is refused and counted.
        await driver.set_health(device("gpu-0", "Unhealthy", message="XID 48"), device(""))
        await eventually(lambda: health_of(api, "train-a", "gpu-0") == "Unhealthy")
        ok_before = first.value("kubelet_dra_pod_writes_total", result="ok") or 0
        second = await scrape_until(
            sidecar, "kubelet_dra_pod_writes_total", ok_before + 1, result="ok"
        )
        assert second.value("kubelet_dra_reports_total", driver=DRIVER) == 2
        assert second.value("kubelet_dra_devices", driver=DRIVER, health="Unhealthy") == 1
        assert second.value("kubelet_dra_refused_total", driver=DRIVER, reason="empty_name") == 1
        # Commits run on their own interval: wait for one rather than race it.
        committed = await scrape_until(
            sidecar, "kubelet_dra_store_commit_duration_seconds_count", 1
        )
        assert (committed.value("kubelet_dra_store_commit_duration_seconds_count") or 0) >= 1

        # Silence: the node default lease of 2 s runs out for both devices.
        driver.set_silent(True)
        await eventually(lambda: health_of(api, "train-a", "gpu-0") == "Unknown")
        await eventually(lambda: health_of(api, "train-b", "gpu-1") == "Unknown")
        third = await scrape_until(sidecar, "kubelet_dra_lease_expiries_total", 2)
        assert third.value("kubelet_dra_lease_expiries_total") == 2
        assert third.value("kubelet_dra_devices", driver=DRIVER, health="Unknown") == 2

        # The driver goes away: its stream backs off and reconnects.
        driver.set_silent(False)
        await driver.end_streams("UNAVAILABLE")
        await eventually(lambda: driver.calls["NodeWatchResources/v1"] >= 2)
        fourth = await scrape(sidecar)
        assert (fourth.value("kubelet_dra_stream_reconnects_total", driver=DRIVER) or 0) >= 1
        assert fourth.value("kubelet_dra_pending_pods") is not None
        assert fourth.value("kubelet_dra_store_degraded") == 0


async def test_cap_and_refused_registrations_are_counted(
    sockdir: pathlib.Path, api: FakeApiServer, driver: FakeDriver
) -> None:
    # kubelet v1.37.2 caps a driver at 16,384 devices; v1.38 validates names.
    cap = healthinfo.MAX_DEVICES_PER_DRIVER
    await driver.set_health(device("gpu-0"), *(device(f"extra-{i}") for i in range(cap + 1)))
    async with FakeDriver("Bad_Name", registry=sockdir / "reg") as bad:
        async with Sidecar(config(sockdir, api)) as sidecar:
            await eventually(lambda: health_of(api, "train-a", "gpu-0") == "Healthy")
            found = await scrape_until(
                sidecar, "kubelet_dra_refused_total", 2, driver=DRIVER, reason="device_cap"
            )
            assert found.value("kubelet_dra_refused_total", driver=DRIVER, reason="device_cap") == 2
            assert found.value("kubelet_dra_registrations_refused_total", reason="driver_name") == 1
            assert found.value("kubelet_dra_devices", driver=DRIVER, health="Healthy") == cap
        assert bad.calls["NodeWatchResources/v1"] == 0  # never streamed from


def test_the_metrics_table_of_the_docs_lists_every_family() -> None:
    # docs/sidecar.md names counters with the _total suffix of the exposition format.
    text = (pathlib.Path(__file__).parents[2] / "docs" / "sidecar.md").read_text()
    documented = set(re.findall(r"^\| `([a-z_]+)` \| (?:gauge|counter|histogram) \|", text, re.M))
    for family, kind in FAMILIES.items():
        name = family.removeprefix("kubelet_dra_") + ("_total" if kind == "counter" else "")
        assert name in documented, f"{name} is not in the metrics table of docs/sidecar.md"
