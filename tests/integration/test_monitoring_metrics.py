"""The dashboard and the alert rules use only what a running sidecar's ``/metrics`` exposes.

A sidecar (``sidecar.Sidecar``, in process, against the FakeApiServer and a FakeDriver)
receives Healthy and Unhealthy devices and a refused entry, writes pods, and is scraped; the
scrape is parsed with ``prometheus_client.parser``. Every metric name in
``deploy/monitoring/dashboard.json`` and ``deploy/monitoring/rules.yaml`` must be a sample
name of that scrape, every label a matcher names must be one of that metric's labels (or a
label Prometheus adds to every target), and every label value a matcher compares with must
be one the scrape shows or the package writes. The selectors come from
``tests/deploy/_monitoring.py``.
"""

from __future__ import annotations

import asyncio
import pathlib
import re
from collections.abc import AsyncIterator

import pytest
from prometheus_client import parser

from kubelet_dra import manager
from kubelet_dra.sidecar import Sidecar
from kubelet_dra.testing import FakeApiServer, FakeDriver, eventually
from tests.deploy import _monitoring

from ._sidecar_process import DRIVER, device, health_of, http_get, settings_for

PACKAGE = pathlib.Path(manager.__file__).resolve().parent
#: Labels Prometheus adds to every series of a target (and the chart's ServiceMonitor adds node).
TARGET_LABELS = {"instance", "job", "node", "namespace", "pod", "container", "service"}


class Exposed:
    """Sample names of one scrape with the label names and values seen on each."""

    def __init__(self, text: str) -> None:
        self.labels: dict[str, dict[str, set[str]]] = {}
        for family in parser.text_string_to_metric_families(text):
            for sample in family.samples:
                seen = self.labels.setdefault(sample.name, {})
                for label, value in sample.labels.items():
                    seen.setdefault(label, set()).add(value)


pytestmark = pytest.mark.usefixtures("cluster_objects")


@pytest.fixture
async def driver(sockdir: pathlib.Path) -> AsyncIterator[FakeDriver]:
    (sockdir / "reg").mkdir(exist_ok=True)
    async with FakeDriver(DRIVER, registry=sockdir / "reg") as fake:
        yield fake


@pytest.fixture
async def exposed(sockdir: pathlib.Path, api: FakeApiServer, driver: FakeDriver) -> Exposed:
    await driver.set_health(device("gpu-0"), device("gpu-1"))
    config = settings_for(sockdir, api, metrics_address="127.0.0.1:0")
    async with Sidecar(config) as sidecar:
        await eventually(lambda: health_of(api, "train-b", "gpu-1") == "Healthy")
        # An Unhealthy device and an entry without a name (refused: reason empty_name).
        await driver.set_health(device("gpu-0", "Unhealthy", message="XID 79"), device(""))
        await eventually(lambda: health_of(api, "train-a", "gpu-0") == "Unhealthy")
        assert sidecar.server is not None
        url = f"http://{sidecar.server.address}/metrics"

        async def scraped() -> Exposed:
            code, body = await http_get(url)
            assert code == 200, body
            return Exposed(body)

        # Wait until the refusal and a store commit are visible (counted asynchronously).
        found: list[Exposed] = []

        async def complete() -> bool:
            found.append(await scraped())
            names = found[-1].labels
            commits = "kubelet_dra_store_commit_duration_seconds_count"
            return "kubelet_dra_refused_total" in names and commits in names

        for _ in range(250):
            if await complete():
                return found[-1]
            await asyncio.sleep(0.02)
        raise AssertionError("the scrape never showed the refusal and a commit")


def _source_literals() -> set[str]:
    """String literals of the package: the label values it can write."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py"))
    return set(re.findall(r'"([A-Za-z_][A-Za-z0-9_]*)"', text))


def _queries() -> dict[str, str]:
    rules = {f"alert {k}": v for k, v in _monitoring.rule_expressions().items()}
    board = {f"dashboard {k}": v for k, v in _monitoring.dashboard_expressions().items()}
    return rules | board


async def test_every_metric_name_in_dashboard_and_rules_is_exposed(exposed: Exposed) -> None:
    unknown = {
        where: selector.metric
        for where, expr in _queries().items()
        for selector in _monitoring.selectors(expr)
        if selector.metric not in exposed.labels
    }
    assert not unknown, f"metric names /metrics does not expose: {unknown}"


async def test_every_matcher_fits_the_exposed_labels(exposed: Exposed) -> None:
    literals = _source_literals()
    problems: list[str] = []
    for where, expr in _queries().items():
        for selector in _monitoring.selectors(expr):
            labels = exposed.labels.get(selector.metric, {})
            for label, op, value in selector.matchers:
                if label in TARGET_LABELS:
                    continue
                if label not in labels:
                    problems.append(f"{where}: {selector.metric} has no label {label}")
                    continue
                if op == "exists":
                    continue
                wanted = value.split("|") if op in ("=~", "!~") else [value]
                for one in wanted:
                    if one not in labels[label] and one not in literals:
                        problems.append(f"{where}: {label}={one!r} is never written")
    assert not problems, problems


async def test_the_dashboard_shows_every_exposed_family(exposed: Exposed) -> None:
    """The other way round: no metric of the sidecar is missing from the dashboard."""
    used = {
        re.sub(r"_(total|bucket|sum|count)$", "", s.metric)
        for expr in _monitoring.dashboard_expressions().values()
        for s in _monitoring.selectors(expr)
    }
    families = {
        re.sub(r"_(total|bucket|sum|count|created)$", "", name)
        for name in exposed.labels
        if name.startswith("kubelet_dra_")
    }
    assert families - used == set()


async def test_the_check_fails_on_an_unknown_name(exposed: Exposed) -> None:
    """The lexer finds a misspelt or foreign name, so the checks above can fail."""
    names = {s.metric for s in _monitoring.selectors("sum(rate(kubelet_dra_report_total[5m]))")}
    assert names == {"kubelet_dra_report_total"}
    assert not names <= set(exposed.labels)
    foreign = _monitoring.selectors('up{job="x"} == 0 and on (instance) kubelet_dra_devices > 0')
    assert [s.metric for s in foreign] == ["up", "kubelet_dra_devices"]
