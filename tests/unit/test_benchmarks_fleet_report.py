"""The fleet benchmark's pure parts: metrics parsing, counting a node's requests, the projection.

No servers run: Snapshots and phases are built from tables (benchmarks.fleet).
"""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import _common as c
from benchmarks import fleet

METRICS = """\
# HELP apiserver_request_total x
apiserver_request_total{code="200",resource="pods",subresource="status",verb="PATCH"} 7
apiserver_request_total{code="409",resource="pods",subresource="status",verb="PATCH"} 1
apiserver_request_total{code="200",resource="pods",subresource="",verb="WATCH"} 3
apiserver_request_total{code="201",resource="events",subresource="",verb="POST"} 4
apiserver_request_total{code="200",resource="leases",subresource="",verb="PUT"} 9
etcd_mvcc_db_total_size_in_bytes 1.2e+06
"""


def snap(requests: dict[str, float], cpu: float = 0.0, at: float = 0.0) -> fleet.Snapshot:
    return fleet.Snapshot(requests, 0.0, cpu, 0.0, 0.0, at)


def test_parse_metrics_reads_names_labels_and_values() -> None:
    found = fleet.parse_metrics(METRICS)
    assert ("etcd_mvcc_db_total_size_in_bytes", {}, 1.2e6) in found
    patch = [v for n, labels, v in found if labels.get("verb") == "PATCH"]
    assert patch == [7.0, 1.0]


def test_counts_are_of_the_resources_a_node_uses_and_differences_are_per_kind() -> None:
    before = snap({"PATCH pods/status": 2, "PUT leases": 5})
    after = snap({"PATCH pods/status": 10, "POST events": 4, "PUT leases": 9, "LIST pods": 3})
    delta = after.minus(before)
    assert delta.count(r"^PATCH pods/status$") == 8
    assert delta.count("") == 8 + 4 + 3  # the apiserver's own lease renewals are not ours


def phase(name: str, changes: int, requests: dict[str, float], cpu: float) -> fleet.Phase:
    return fleet.Phase(name, changes, changes, snap(requests, cpu), 1000.0, [0.1, 0.2], 0)


def results(nodes: int) -> list[dict[str, Any]]:
    rack = nodes // 4 * fleet.DEVICES
    ours = {"PATCH pods/status": rack * 1.25, "POST events": rack}
    theirs = {"PATCH pods/status": rack * 1.25, "GET pods": rack * 1.25}
    return [{
        "nodes": nodes, "steady_requests": 0.0, "steady_seconds": 5.0,
        "restart": {"phase": phase("apiserver restart", nodes, ours, 1.0), "down_s": 2.0,
                    "ready_s": 5.0, "relists": float(nodes), "current_after_s": 5.0},
        "worker_rss_mb": [100.0], "worker_hwm_mb": [110.0], "worker_cpu_s": [3.0],
        "phases": [
            phase("rack down", rack, ours, 0.5),
            phase("kubelet rack down", rack, theirs, 0.6),
            phase("flap down", nodes, ours, 0.1),
            phase("kubelet flap down", nodes, theirs, 0.1),
        ],
    }]  # fmt: skip


def test_the_report_compares_with_the_kubelet_and_projects_to_thousands_of_nodes() -> None:
    out = c.Outcome("fleet")
    fleet.report(out, results(40), fleet.QUICK)
    rack = next(r for r in out.summary if "rack failure" in r.scenario)
    # ours 2.25 requests per device change, the kubelet's way 2.5
    assert rack.value == pytest.approx(2.25 / 2.5)
    assert rack.better == "lower"
    rows = fleet.projection_rows(results(40))
    assert [r[0] for r in rows] == ["40", "1,000", "5,000"]
    assert rows[1][2] == f"{1000 * 0.25 * 8 * 2.25:,.0f}"  # rack requests at 1,000 nodes
    assert rows[1][5] == "yes"  # 250 nodes x 8 in flight > 200 mutating inflight
    assert rows[2][6] == "yes"  # 1,250 x 8 > 245 seats + 6,400 queued
    assert len(out.tables) == 4


def test_event_requests_count_as_ours_whichever_phase_they_landed_in() -> None:
    rack = 80
    phases = [
        phase("rack down", rack, {"PATCH pods/status": 100, "POST events": 20}, 0.5),
        phase("kubelet rack down", rack, {"PATCH pods/status": 100, "GET pods": 100,
                                          "PATCH events": 60}, 0.5),
    ]  # fmt: skip
    assert fleet._totals(phases, "rack")["requests"] == 100 + 20 + 60
    assert fleet._totals(phases, "kubelet rack")["requests"] == 200
