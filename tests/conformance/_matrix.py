"""The conformance matrix in ``docs/conformance.md``: scenario by kubelet line.

A cell says ``same`` (nothing differed), ``declared difference (<features>)``
(the run showed exactly the differences the scenario declares for that line),
or ``n/a`` (the scenario does not run on that line: it uses something the line
does not have). A passing run produces exactly the cell the scenario's
declarations predict, which is what lets a test check the committed copy
without Go: :func:`render` from the scenario files must equal the committed
section, and the conformance run asserts every result's cell equals it.
``python -m tests.conformance._suite --write-matrix`` rewrites the section
from a run's results.
"""

from __future__ import annotations

import collections
import pathlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from tests.conformance import _generate
from tests.conformance import _scenario as sc

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "conformance.md"
BEGIN = "<!-- matrix: written by `python -m tests.conformance._suite --write-matrix` -->"
END = "<!-- end of matrix -->"


LEASE_OUTLIVES_STREAM: dict[str, tuple[tuple[tuple[str, ...], str], ...]] = {
    # scenario: ((kinds, sync point), ...), on every line the scenario runs on.
    # Where the stream ended (or the endpoint went) and no report came since, our
    # cache and pods keep the last state and the kubelet's read Unknown; where the
    # driver then reports the same again, the kubelet announces the pods (new to
    # its cleared cache) and we announce nothing (nothing changed).
    "clear-driver": ((("status", "devices"), "cleared"),),
    "e2e-plugin-stop-restart": ((("status", "devices"), "stopped"), (("announced",), "restarted")),
    "go-helper-restart": ((("announced",), "restarted"),),
    "go-helper-stream-error": ((("status", "devices"), "failed"), (("announced",), "reconnected")),
    "reregister": ((("announced",), "registered-again"),),
    "restart-new-socket": ((("announced",), "restarted"),),
    "restart-same-socket": ((("status", "devices"), "broken"), (("announced",), "reconnected")),
    "stream-eof": ((("status", "devices"), "ended"), (("announced",), "reconnected")),
    "stream-error": ((("status", "devices"), "failed"), (("announced",), "reconnected")),
    "two-drivers-one-ends": ((("status", "devices"), "nic-ended"),),
    "unimplemented-after-reports": (
        (("status", "devices"), "stopped"),
        (("announced",), "registered-again"),
    ),
}
"""The written scenarios' ``lease-outlives-stream`` declarations, in one place (the
loader adds them to each scenario's ``differences``); generated scenarios declare it
from the generator's model."""


def declared(scenario: str) -> list[dict[str, object]]:
    """The table's declarations of ``scenario`` as ``differences`` entries."""
    return [
        {"feature": "lease-outlives-stream", "kinds": list(kinds), "at": [at]}
        for kinds, at in LEASE_OUTLIVES_STREAM.get(scenario, ())
    ]


class _Result(Protocol):
    scenario: str
    line: str

    def cell(self) -> str: ...


def cell(scenario: sc.Scenario, line: str) -> str:
    """The cell a passing run of ``scenario`` on ``line`` writes."""
    if line not in scenario.lines:
        return "n/a"
    features = sorted({d.feature for d in scenario.differences if line in d.lines})
    if not features:
        return "same"
    return "declared difference (" + ", ".join(features) + ")"


def render(
    scenarios: Sequence[sc.Scenario],
    results: Mapping[str, Iterable[_Result]] | None = None,
    *,
    generated: Sequence[sc.Scenario] | None = None,
) -> str:
    """The matrix section; cells from ``results`` where a line was run."""
    ran: dict[tuple[str, str], str] = {}
    for line, done in (results or {}).items():
        for result in done:
            ran[(result.scenario, line)] = result.cell()
    head = "| scenario | " + " | ".join(sc.LINES) + " |"
    rows = [head, "|---|" + "---|" * len(sc.LINES)]
    for scenario in sorted(scenarios, key=lambda s: s.name):
        cells = [ran.get((scenario.name, line), cell(scenario, line)) for line in sc.LINES]
        rows.append(f"| `{scenario.name}` | " + " | ".join(cells) + " |")
    legend = ["", "| feature | what differs on purpose |", "|---|---|"]
    used = sorted({d.feature for s in scenarios for d in s.differences})
    legend += [f"| `{f}` | {sc.FEATURES[f]} |" for f in used]
    notes = [""]
    helper = sorted(s.name for s in scenarios if s.uses_go_helper())
    if helper:
        notes.append(
            "Driver: the Go helper driver of `tests/interop` (kubeletplugin helper, "
            "`implementation: go-helper`) in "
            + ", ".join(f"`{n}`" for n in helper)
            + "; our FakeDriver in the others."
        )
        notes.append("")
    gen = generated if generated is not None else _generate.every_run()
    notes += ["", _generated_summary(gen)]
    return "\n".join([BEGIN, *rows, *legend, *notes, END])


def _generated_summary(generated: Sequence[sc.Scenario]) -> str:
    counts: collections.Counter[str] = collections.Counter()
    for scenario in generated:
        for feature in {d.feature for d in scenario.differences}:
            counts[feature] += 1
    same = sum(1 for s in generated if not s.differences)
    parts = ", ".join(f"`{f}` in {n}" for f, n in sorted(counts.items()))
    seeds = f"seeds {_generate.SEEDS.start}-{_generate.SEEDS.stop - 1}"
    return (
        f"Generated scenarios: {len(generated)} ({seeds}) on kubelet "
        f"{' and '.join(_generate.LINES)} in every run; {same} show no difference, the others "
        f"declare (from the generator's model of both sides) {parts}."
    )


def section(text: str) -> str:
    match = re.search(re.escape(BEGIN) + r".*?" + re.escape(END), text, re.S)
    if match is None:
        raise ValueError(f"{DOC.name} has no matrix section ({BEGIN!r} ... {END!r})")
    return match.group(0)


def write(
    scenarios: Sequence[sc.Scenario], results: Mapping[str, Iterable[_Result]] | None
) -> None:
    text = DOC.read_text(encoding="utf-8")
    DOC.write_text(text.replace(section(text), render(scenarios, results)), encoding="utf-8")
