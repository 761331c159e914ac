"""``python -m benchmarks --compare``: the pure comparison of summary rows (benchmarks._compare).

Tables of baseline and current rows, as ``--json`` writes them; no benchmark runs.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from benchmarks import __main__ as runner
from benchmarks import _compare


def row(name: str, ratio: str, value: float | None = None, better: str = "") -> dict[str, Any]:
    return {
        "scenario": name, "figure": "", "floor": "", "ratio": ratio, "target": "",
        "met": None, "value": value, "better": better,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("ratio", "value", "expected"),
    [
        ("5.1x", None, 5.1),
        ("39%", None, 0.39),
        ("1,412x", None, 1412.0),
        ("148x (p99)", None, 148.0),
        ("0.78x QPS", None, 0.78),
        ("—", None, None),
        ("", None, None),
        ("5.1x", 5.123, 5.123),  # the stored number wins over the rounded text
        ("n/a", float("nan"), None),
    ],
)
def test_ratio_value_reads_the_number_or_parses_the_printed_ratio(
    ratio: str, value: float | None, expected: float | None
) -> None:
    assert _compare.ratio_value(row("s", ratio, value)) == (
        pytest.approx(expected) if expected is not None else None
    )


@pytest.mark.parametrize(
    ("baseline", "current", "better", "expected"),
    [
        (4.0, 5.0, "lower", 0.25),  # a cost up 25 %
        (4.0, 2.0, "lower", -0.5),  # a cost halved: better
        (0.40, 0.20, "higher", 1.0),  # a rate halved counts as 100 % worse
        (0.40, 0.50, "higher", -0.2),
        (0.0, 0.0, "lower", None),  # nothing to compare
        (0.0, 1.0, "lower", float("inf")),
        (1.0, 0.0, "higher", float("inf")),
        (1.0, 2.0, "", None),
    ],
)
def test_worse_by_is_direction_aware(
    baseline: float, current: float, better: str, expected: float | None
) -> None:
    found = _compare.worse_by(baseline, current, better)
    assert found == (pytest.approx(expected) if expected not in (None, float("inf")) else expected)


def test_a_cost_that_rose_more_than_a_quarter_regresses_and_one_within_it_does_not() -> None:
    baseline = [
        row("latency", "4.0x", 4.0, "lower"),
        row("memory", "1.20x", 1.20, "lower"),
    ]
    current = [
        row("latency", "5.2x", 5.2, "lower"),  # +30 %
        row("memory", "1.40x", 1.40, "lower"),  # +16.7 %
    ]
    found = {c.scenario: c for c in _compare.compare(baseline, current)}
    assert found["latency"].regressed
    assert found["latency"].worse_by == pytest.approx(0.30)
    assert not found["memory"].regressed
    assert found["memory"].worse_by == pytest.approx(0.2 / 1.2)


def test_a_rate_that_fell_regresses_while_a_rate_that_rose_is_better() -> None:
    baseline = [row("ingest", "40%", 0.40, "higher"), row("persist", "5,000x", 5000, "higher")]
    current = [row("ingest", "30%", 0.30, "higher"), row("persist", "9,000x", 9000, "higher")]
    found = {c.scenario: c for c in _compare.compare(baseline, current)}
    assert found["ingest"].regressed  # 0.40 / 0.30 - 1 = 33 % worse
    assert not found["persist"].regressed
    assert found["persist"].worse_by is not None and found["persist"].worse_by < 0


def test_exactly_at_the_tolerance_is_not_a_regression() -> None:
    [cmp] = _compare.compare([row("x", "4x", 4.0, "lower")], [row("x", "5x", 5.0, "lower")])
    assert cmp.worse_by == pytest.approx(0.25)
    assert not cmp.regressed


def test_old_files_without_value_or_direction_are_parsed_and_take_the_current_direction() -> None:
    baseline = [{"scenario": "latency", "ratio": "4.0x"}]  # a --json from before issue 15
    [cmp] = _compare.compare(baseline, [row("latency", "6.0x", 6.0, "lower")])
    assert cmp.baseline == 4.0
    assert cmp.regressed


def test_rows_without_a_number_or_direction_are_listed_not_judged() -> None:
    baseline = [
        row("steady", "—"),
        row("report-only", "3x", 3.0),
        row("gone", "2x", 2.0, "lower"),
    ]
    current = [row("steady", "—"), row("report-only", "9x", 9.0), row("new", "1x", 1.0, "lower")]
    found = {c.scenario: c for c in _compare.compare(baseline, current)}
    assert not any(c.regressed for c in found.values())
    assert found["steady"].note == "not compared"
    assert found["report-only"].note == "not compared"
    assert found["new"].note == "not in the baseline"
    assert found["gone"].note == "not in this run"


def test_table_rows_say_regressed_better_and_worse() -> None:
    found = _compare.compare(
        [row("a", "4x", 4.0, "lower"), row("b", "4x", 4.0, "lower")],
        [row("a", "8x", 8.0, "lower"), row("b", "2x", 2.0, "lower")],
    )
    rows = {r[0]: r for r in _compare.table_rows(found)}
    assert rows["a"][4:] == ("+100% worse", "**REGRESSED**")
    assert rows["b"][4:] == ("50% better", "ok")


@pytest.mark.parametrize(
    "content", ["not json", json.dumps({"machine": {}}), json.dumps({"rows": [{"x": 1}]})]
)
def test_a_file_that_is_not_a_benchmarks_json_is_a_clear_error(
    tmp_path: pathlib.Path, content: str
) -> None:
    path = tmp_path / "baseline.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=r"baseline|summary rows"):
        _compare.load_rows(path)


def test_the_runner_refuses_a_bad_baseline_before_running_anything(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "nope.json"
    assert runner.main(["--only", "ingest", "--compare", str(path)]) == 2
    assert "cannot read baseline" in capsys.readouterr().err


def test_the_saved_baseline_is_a_comparable_run() -> None:
    rows = _compare.load_rows(pathlib.Path(runner.__file__).with_name("baseline.json"))
    judged = [r for r in rows if r.get("better") in ("lower", "higher")]
    assert judged, "the baseline holds rows with a direction"
    assert all(_compare.ratio_value(r) is not None for r in judged)
