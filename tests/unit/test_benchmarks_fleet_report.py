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


def test_429s_are_counted_per_kind_and_across_a_restart() -> None:
    before = fleet.Snapshot({}, 0, 0, 0, 0, 0, {"PATCH pods/status": 2, "LIST pods": 1})
    after = fleet.Snapshot({}, 0, 0, 0, 0, 0, {"PATCH pods/status": 9, "GET leases": 4})
    delta = after.minus(before)
    assert delta.throttled["PATCH pods/status"] == 7
    assert delta.rejected() == 7 - 1  # leases are not a node's; LIST pods went down by one


def test_relist_stats_time_answered_lists_from_the_new_apiservers_start() -> None:
    lists = [(99.0, False), (100.5, False), (101.02, True), (101.05, True), (103.0, True)]
    stats = fleet.relist_stats(lists, up=100.0)
    assert stats["answered"] == 3 and stats["failed"] == 2
    assert stats["peak_100ms"] == 2  # 1.02 and 1.05 s share a 100 ms window
    assert stats["max"] == pytest.approx(3.0)


def test_apf_flags_and_objects_put_the_nodes_user_in_a_small_level() -> None:
    args = fleet.apf_on(["kube-apiserver", "--enable-priority-and-fairness=false", "--v=1"])
    assert args == ["kube-apiserver", "--v=1", "--enable-priority-and-fairness=true"]
    (_, level), (_, schema) = fleet.apf_objects(queue=2)
    limited = level["spec"]["limited"]
    assert limited["borrowingLimitPercent"] == 0  # no seats borrowed from other levels
    assert limited["limitResponse"]["queuing"]["queueLengthLimit"] == 2
    subject = schema["spec"]["rules"][0]["subjects"][0]
    assert subject["user"]["name"] == fleet.NODE_USER


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
    lists = {
        "answered": nodes,
        "failed": 3 * nodes,
        "p50": 1.0,
        "p99": 2.0,
        "max": 2.1,
        "peak_100ms": nodes,
    }
    restart = {
        "phase": phase("apiserver restart", nodes, ours, 1.0),
        "down_s": 2.0,
        "ready_s": 5.0,
        "relists": float(nodes),
        "current_after_s": 5.0,
    }
    apf_down = phase("APF rack down", rack, ours | {"POST events": rack}, 0.5)
    apf_down.cost.throttled["PATCH pods/status"] = 30.0
    apf_down.retries = 30.0
    return [{
        "nodes": nodes, "steady_requests": 0.0, "steady_seconds": 5.0,
        "restart_fixed": {**restart, "jitter": False, "lists": lists},
        "restart": {**restart, "jitter": True, "lists": {**lists, "peak_100ms": nodes // 10}},
        "apf": {"phases": [apf_down], "seats": 3.0, "queue": 4, "rack_nodes": nodes // 4,
                "restart_lists": lists},
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
    assert len(out.tables) == 6
    relists = next(r for r in out.summary if "relists after a restart" in r.scenario)
    assert relists.ratio == "0.1x peak"  # 4 relists in 100 ms with jitter, 40 without
    apf = next(r for r in out.summary if "under APF" in r.scenario)
    assert apf.figure.startswith("30 429s, 30 retries")
    assert apf.met is True


def test_event_requests_count_as_ours_whichever_phase_they_landed_in() -> None:
    rack = 80
    phases = [
        phase("rack down", rack, {"PATCH pods/status": 100, "POST events": 20}, 0.5),
        phase("kubelet rack down", rack, {"PATCH pods/status": 100, "GET pods": 100,
                                          "PATCH events": 60}, 0.5),
    ]  # fmt: skip
    assert fleet._totals(phases, "rack")["requests"] == 100 + 20 + 60
    assert fleet._totals(phases, "kubelet rack")["requests"] == 200


def test_fleet_sizes_come_from_the_environment_when_set() -> None:
    assert fleet.sizes_from_env(fleet.QUICK, None) is fleet.QUICK
    assert fleet.sizes_from_env(fleet.QUICK, "200").sizes == (200,)
    assert fleet.sizes_from_env(fleet.FULL, "10,100").flaps == fleet.FULL.flaps
    for bad in ("ten", "0", "10,,20"):
        with pytest.raises(c.CheckFailed, match="FLEET_SIZES"):
            fleet.sizes_from_env(fleet.QUICK, bad)
