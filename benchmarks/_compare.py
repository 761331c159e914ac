"""``python -m benchmarks --compare BASELINE.json``: this run's ratios against a saved run.

Pure functions over summary rows (the dicts ``--json`` writes): each row of the
current run is matched by its ``scenario`` name to the baseline's, its ratio
(``value``; older files only have the printed ``ratio``, which is parsed) is
compared in the row's direction (``better``: "lower" for costs such as latency
or memory against their floor, "higher" for rates such as ingest against its
floor), and a row that got more than ``tolerance`` worse is a regression.
Ratios, not absolute figures, are compared: both runs measured their own floors,
so the comparison survives a machine that is busier today than yesterday.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

#: A row that got worse by more than this fraction fails the comparison.
TOLERANCE = 0.25

_NUMBER = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?")


@dataclasses.dataclass(frozen=True)
class Comparison:
    scenario: str
    better: str  # "lower", "higher" or "" (not compared)
    baseline: float | None
    current: float | None
    #: How much worse (positive) or better (negative) in the row's direction, as a
    #: fraction: 0.3 means 30 % worse. None when either side has no number.
    worse_by: float | None
    regressed: bool
    note: str = ""


def ratio_value(row: Mapping[str, Any]) -> float | None:
    """The row's ratio as a number: ``value`` if present, else parsed from ``ratio``
    ("5.1x" -> 5.1, "39%" -> 0.39, "1,412x" -> 1412, "—" -> None)."""
    value = row.get("value")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value) if value == value else None  # NaN: no number
    text = str(row.get("ratio") or "")
    match = _NUMBER.search(text)
    if match is None:
        return None
    number = float(match.group().replace(",", ""))
    return number / 100 if text[match.end() :].lstrip().startswith("%") else number


def worse_by(baseline: float, current: float, better: str) -> float | None:
    """Fraction by which ``current`` is worse than ``baseline`` (negative: better).

    Lower-is-better: current / baseline - 1. Higher-is-better: baseline / current - 1,
    so that halving a rate and doubling a cost both count as 100 % worse.
    """
    if better == "lower":
        if baseline <= 0:
            return None if current <= 0 else float("inf")
        return current / baseline - 1
    if better == "higher":
        if current <= 0:
            return None if baseline <= 0 else float("inf")
        return baseline / current - 1
    return None


def compare(
    baseline: Iterable[Mapping[str, Any]],
    current: Iterable[Mapping[str, Any]],
    tolerance: float = TOLERANCE,
) -> list[Comparison]:
    """One :class:`Comparison` per current row (and one per baseline row that is gone)."""
    base = {str(r["scenario"]): r for r in baseline}
    found: list[Comparison] = []
    seen: set[str] = set()
    for row in current:
        name = str(row["scenario"])
        seen.add(name)
        now = ratio_value(row)
        better = str(row.get("better") or "")
        old_row = base.get(name)
        if old_row is None:
            found.append(Comparison(name, better, None, now, None, False, "not in the baseline"))
            continue
        better = better or str(old_row.get("better") or "")
        old = ratio_value(old_row)
        if not better or old is None or now is None:
            note = "not compared" if not better else "no number"
            found.append(Comparison(name, better, old, now, None, False, note))
            continue
        delta = worse_by(old, now, better)
        regressed = delta is not None and delta > tolerance
        found.append(Comparison(name, better, old, now, delta, regressed))
    for name, old_row in base.items():
        if name not in seen:
            old = ratio_value(old_row)
            better = str(old_row.get("better") or "")
            found.append(Comparison(name, better, old, None, None, False, "not in this run"))
    return found


def load_rows(path: str | pathlib.Path) -> list[dict[str, Any]]:
    """The summary rows of a ``--json`` file; ValueError when it is not one."""
    try:
        data = json.loads(pathlib.Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read baseline {path}: {exc}") from exc
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "scenario" in r for r in rows):
        raise ValueError(f"{path} is not a benchmarks --json file (no summary rows)")
    return rows


def _fmt(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def table_rows(found: Iterable[Comparison]) -> list[tuple[str, ...]]:
    """Rows for a markdown table: scenario, better, baseline, now, change, verdict."""
    rows: list[tuple[str, ...]] = []
    for cmp in found:
        change = "—" if cmp.worse_by is None else f"{cmp.worse_by:+.0%} worse"
        if cmp.worse_by is not None and cmp.worse_by < 0:
            change = f"{-cmp.worse_by:.0%} better"
        verdict = "**REGRESSED**" if cmp.regressed else (cmp.note or "ok")
        rows.append(
            (cmp.scenario, cmp.better or "—", _fmt(cmp.baseline), _fmt(cmp.current), change,
             verdict)
        )  # fmt: skip
    return rows
