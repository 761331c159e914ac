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


Declaration = dict[str, object]


def _kept(
    at: str, device: str, listed: Sequence[tuple[str, str]], health: str, message: str = ""
) -> list[Declaration]:
    """A stream ended and no report came since: at ``at`` our cache keeps ``device``'s
    last ``health`` (and ``message``), the kubelet's cleared cache reads Unknown with no
    message, in both caches and in each status entry ``listed`` ((subject, entry))."""
    values = [("health", health, "Unknown")] + ([("message", message, "")] if message else [])
    out: list[Declaration] = []
    for field, ours, twin in values:
        out.append(
            {"feature": "lease-outlives-stream", "kinds": ["devices"], "at": [at],
             "subject": [device], "field": [field], "ours": ours, "twin": twin}
        )  # fmt: skip
        for subject, entry in listed:
            out.append(
                # Up to 1.35 a claim the pod names directly has no entry on the kubelet's
                # side at all (claim-name-fallback): nothing there to read Unknown.
                {"feature": "lease-outlives-stream", "lines": ">=1.36", "kinds": ["status"],
                 "at": [at], "subject": [subject],
                 "field": [f"entry {entry} resource {device} {field}"],
                 "ours": ours, "twin": twin}
            )  # fmt: skip
    return out


def _new_again(at: str, *pods: str) -> list[Declaration]:
    """The driver reported the same again: new to the kubelet's cleared cache (it
    announces the pods), no change for us (we announce nothing)."""
    return [
        {"feature": "lease-outlives-stream", "kinds": ["announced"], "at": [at],
         "subject": [f"pod {p}" for p in pods], "field": ["announced"],
         "ours": False, "twin": True}
    ]  # fmt: skip


_GPU = "gpu.example.com/pool/dev-0"
_POD_A = (("pod pod-a containerStatuses[main]", "claim:gpu"),)

LEASE_OUTLIVES_STREAM: dict[str, list[Declaration]] = {
    # Where the stream ended (or the endpoint went) and no report came since, our
    # cache and pods keep the last state and the kubelet's read Unknown; where the
    # driver then reports the same again, the kubelet announces the pods (new to
    # its cleared cache) and we announce nothing (nothing changed).
    "clear-driver": _kept("cleared", _GPU, _POD_A, "Healthy"),
    "e2e-plugin-stop-restart": [
        *_kept("stopped", _GPU, _POD_A, "Healthy"),
        *_new_again("restarted", "pod-a"),
    ],
    "go-helper-restart": _new_again("restarted", "pod-a"),
    "go-helper-stream-error": [
        *_kept("failed", _GPU, _POD_A, "Unhealthy", "ECC"),
        *_new_again("reconnected", "pod-a"),
    ],
    "reregister": _new_again("registered-again", "pod-a"),
    "restart-new-socket": _new_again("restarted", "pod-a"),
    "restart-same-socket": [
        *_kept("broken", _GPU, _POD_A, "Unhealthy"),
        *_new_again("reconnected", "pod-a"),
    ],
    "stream-eof": [*_kept("ended", _GPU, _POD_A, "Healthy"), *_new_again("reconnected", "pod-a")],
    "stream-error": [
        *_kept("failed", _GPU, _POD_A, "Unhealthy"),
        *_new_again("reconnected", "pod-a"),
    ],
    "two-drivers-one-ends": _kept(
        "nic-ended",
        "nic.example.com/pool/nic-0",
        (("pod pod-nic containerStatuses[main]", "claim:nic"),),
        "Unhealthy",
    ),
    "unimplemented-after-reports": [
        *_kept("stopped", _GPU, _POD_A, "Healthy"),
        *_new_again("registered-again", "pod-a"),
    ],
}
"""The written scenarios' ``lease-outlives-stream`` declarations, scoped (sync point,
subject, field, both values), in one place: the loader adds them to each scenario's
``differences``; generated scenarios declare it from the generator's model."""


def declared(scenario: str) -> list[Declaration]:
    """The table's declarations of ``scenario`` as ``differences`` entries."""
    return [dict(d) for d in LEASE_OUTLIVES_STREAM.get(scenario, ())]


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
