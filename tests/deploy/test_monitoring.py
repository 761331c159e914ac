"""The alerts and the dashboard of ``deploy/monitoring``.

With the real ``promtool`` (Prometheus 3.16.0 built from the Go module proxy, or one on
PATH such as Debian's ``prometheus`` package; skipped without either):
``promtool check rules`` on the rules, ``promtool test rules`` on ``tests.yaml`` (and a
spoiled copy of it must fail), and every dashboard query checked as PromQL. Without
promtool: the alerts the issue asks for exist, each has a unit test that fires it and one
that does not, each links a runbook section that exists in ``docs/operations.md``, and the
generated copies (PrometheusRule, the chart's rules) equal their source.

Metric names against a live ``/metrics``: ``tests/integration/test_monitoring_metrics.py``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.interop import _build

from . import _monitoring
from ._monitoring import MONITORING, ROOT

OPERATIONS = ROOT / "docs" / "operations.md"
#: What an operator must hear about (issue 14), by alert name.
REQUIRED_ALERTS = {
    "KubeletDraDeviceUnhealthy": "a device Unhealthy for 5 minutes",
    "KubeletDraDeviceLeasesExpired": "devices Unknown because leases lapse",
    "KubeletDraApiServerDropsHealth": "the API server dropping the field (gate off)",
    "KubeletDraStatusWritesFailing": "status writes failing",
    "KubeletDraDriverStreamDown": "a driver's stream down",
    "KubeletDraReportsRefused": "reports refused",
}


def _alerts() -> list[dict[str, Any]]:
    return [
        rule
        for group in _monitoring.rules()["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]


def _promtool(promtool: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


# -- promtool -----------------------------------------------------------------------


def test_promtool_is_the_pinned_release(promtool_bin: Path) -> None:
    proc = _promtool(promtool_bin, "--version", cwd=MONITORING)
    if not promtool_bin.is_relative_to(_build.cache_root()):
        pytest.skip(f"promtool from PATH ({proc.stdout.splitlines()[0]}), not the pinned build")
    assert proc.stdout.startswith("promtool, version 3.16.0 "), proc.stdout


def test_promtool_check_rules(promtool_bin: Path) -> None:
    proc = _promtool(promtool_bin, "check", "rules", "rules.yaml", cwd=MONITORING)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in proc.stdout


def test_promtool_test_rules(promtool_bin: Path) -> None:
    proc = _promtool(promtool_bin, "test", "rules", "tests.yaml", cwd=MONITORING)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_promtool_test_rules_fails_on_a_wrong_expectation(
    promtool_bin: Path, tmp_path: Path
) -> None:
    """A spoiled expectation (the unhealthy alert one minute early) fails the unit tests."""
    shutil.copy(MONITORING / "rules.yaml", tmp_path / "rules.yaml")
    text = (MONITORING / "tests.yaml").read_text(encoding="utf-8")
    spoiled = text.replace("      - eval_time: 7m\n", "      - eval_time: 6m\n", 1)
    assert spoiled != text
    (tmp_path / "tests.yaml").write_text(spoiled, encoding="utf-8")
    proc = _promtool(promtool_bin, "test", "rules", "tests.yaml", cwd=tmp_path)
    assert proc.returncode != 0
    assert "KubeletDraDeviceUnhealthy" in proc.stdout + proc.stderr


def test_promtool_check_rules_fails_on_bad_promql(promtool_bin: Path, tmp_path: Path) -> None:
    bad = {"groups": [{"name": "x", "rules": [{"alert": "X", "expr": "sum by (le (rate(x[5m]))"}]}]}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad), encoding="utf-8")
    proc = _promtool(promtool_bin, "check", "rules", "bad.yaml", cwd=tmp_path)
    assert proc.returncode != 0


def test_dashboard_queries_are_valid_promql(promtool_bin: Path, tmp_path: Path) -> None:
    """Each query, with Grafana's variables filled in, as a recording rule for promtool."""
    queries = _monitoring.dashboard_expressions()
    records = [
        {"record": f"dashboard:query_{i}", "expr": _monitoring.substitute(expr)}
        for i, (where, expr) in enumerate(sorted(queries.items()))
        if not where.startswith("templating ")
    ]
    assert len(records) >= 20
    rules = {"groups": [{"name": "dashboard", "rules": records}]}
    (tmp_path / "dashboard-rules.yaml").write_text(yaml.safe_dump(rules), encoding="utf-8")
    proc = _promtool(promtool_bin, "check", "rules", "dashboard-rules.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- the rules without promtool -----------------------------------------------------


def test_required_alerts_exist() -> None:
    names = [a["alert"] for a in _alerts()]
    assert len(names) == len(set(names))
    assert set(REQUIRED_ALERTS) <= set(names)


def test_every_alert_is_unit_tested_both_ways() -> None:
    """Each alert has a promtool case where it fires and one where it does not."""
    tests = yaml.safe_load((MONITORING / "tests.yaml").read_text(encoding="utf-8"))
    assert tests["rule_files"] == ["rules.yaml"]
    fires: set[str] = set()
    silent: set[str] = set()
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else silent).add(check["alertname"])
    names = {a["alert"] for a in _alerts()}
    assert names - fires == set(), "alerts never expected to fire"
    assert names - silent == set(), "alerts never expected to stay silent"


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    anchors = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", markdown, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def test_every_alert_links_its_runbook() -> None:
    anchors = _anchors(OPERATIONS.read_text(encoding="utf-8"))
    for alert in _alerts():
        annotations = alert["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, alert["alert"]
        assert alert["labels"]["severity"] in {"warning", "critical", "info"}
        url = annotations["runbook_url"]
        path, _, anchor = url.partition("#")
        assert path == "docs/operations.md", url
        # The section is named after the alert, and it exists.
        assert anchor == alert["alert"].lower(), url
        assert anchor in anchors, f"{url}: no such section in docs/operations.md"


def test_runbooks_have_meaning_impact_diagnosis_action() -> None:
    text = OPERATIONS.read_text(encoding="utf-8")
    for alert in _alerts():
        section = text.split(f"### {alert['alert']}\n", 1)[1].split("\n### ", 1)[0]
        for part in ("Meaning", "Impact", "Diagnosis", "Action"):
            assert f"**{part}.**" in section, f"{alert['alert']}: no {part}"


def test_generated_copies_are_current() -> None:
    """After editing rules.yaml: python -m tests.deploy._monitoring"""
    assert _monitoring.PROMETHEUS_RULE.read_text(encoding="utf-8") == (
        _monitoring.prometheus_rule_text()
    )
    assert _monitoring.CHART_RULES.read_bytes() == _monitoring.RULES.read_bytes()
    generated = yaml.safe_load(_monitoring.PROMETHEUS_RULE.read_text(encoding="utf-8"))
    assert generated["spec"] == _monitoring.rules()


# -- the PromQL lexer the metric-name checks rely on --------------------------------


@pytest.mark.parametrize(
    ("expr", "metrics"),
    [
        ("kubelet_dra_devices", ["kubelet_dra_devices"]),
        (
            'sum by (le) (rate(a_bucket{x="y",z=~"1|2"}[5m])) / on (i) group_left (j) b offset 5m',
            ["a_bucket", "b"],
        ),
        ("histogram_quantile(0.9, c) > bool 0 and d unless e or vector(1)", ["c", "d", "e"]),
        ('count without (state) (f{state!="a"}) == 1', ["f"]),
        ("label_values(g, instance)", ["g"]),
        ('h{i=~"$instance"}[$__rate_interval]', ["h"]),
    ],
)
def test_selectors(expr: str, metrics: list[str]) -> None:
    assert [s.metric for s in _monitoring.selectors(expr)] == metrics


def test_selector_matchers() -> None:
    (selector,) = _monitoring.selectors('x{a="1", b!~"p|q", instance=~"$instance"}')
    assert selector.matchers == (("a", "=", "1"), ("b", "!~", "p|q"), ("instance", "=~", ".*"))


def test_dashboard_is_grafana_json() -> None:
    board = _monitoring.dashboard()
    assert board["uid"] == "kubelet-dra-health"
    assert board["schemaVersion"] >= 36
    names = [v["name"] for v in board["templating"]["list"]]
    assert names == ["datasource", "instance"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
