"""``deploy/monitoring/dashboard.json`` read by Grafana's own dashboard types.

``grafana-dashboard-check`` (tests/tools/grafana-dashboard) decodes the dashboard strictly
with github.com/grafana/grafana-foundation-sdk/go v0.0.22, the Go types Grafana generates
from its dashboard schema, down to each panel's options (typed per panel plugin) and each
query (typed per data source), then runs their Validate. Grafana's own ``dashboard-linter``
is not served by the Go module proxy, so it cannot be built here. Without Go these skip.
"""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from . import _monitoring

Board = dict[str, Any]


def _check(checker: Path, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(checker), str(path)], capture_output=True, text=True, timeout=60, check=False
    )


def test_dashboard_passes_grafanas_types(grafana_dashboard_check_bin: Path) -> None:
    proc = _check(grafana_dashboard_check_bin, _monitoring.DASHBOARD)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == f"{_monitoring.DASHBOARD}: ok\n"


def _first(board: Board, kind: str) -> Board:
    panel: Board = next(p for p in board["panels"] if p["type"] == kind)
    return panel


def _width_as_text(board: Board) -> None:
    _first(board, "stat")["gridPos"]["w"] = "wide"


def _unknown_stat_option(board: Board) -> None:
    _first(board, "stat")["options"]["colourMode"] = "background"


def _legend_without_show(board: Board) -> None:
    del _first(board, "timeseries")["options"]["legend"]["showLegend"]


def _unknown_dashboard_field(board: Board) -> None:
    board["refreshInterval"] = "30s"


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (_width_as_text, "panels[1].gridPos.w: json: cannot unmarshal string"),
        (_unknown_stat_option, "panels[1].options.Options: unexpected field 'colourMode'"),
        (_legend_without_show, "panels[8].options.legend.showLegend: required field is missing"),
        (_unknown_dashboard_field, "Dashboard: unexpected field 'refreshInterval'"),
    ],
    ids=["mistyped", "unknown-option", "missing-required", "unknown-field"],
)
def test_checker_refuses_a_spoiled_dashboard(
    grafana_dashboard_check_bin: Path,
    tmp_path: Path,
    spoil: Callable[[Board], None],
    message: str,
) -> None:
    board = copy.deepcopy(_monitoring.dashboard())
    spoil(board)
    path = tmp_path / "dashboard.json"
    path.write_text(json.dumps(board, indent=2), encoding="utf-8")
    proc = _check(grafana_dashboard_check_bin, path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert message in proc.stdout, proc.stdout
