"""The coexistence table: kubelet gate x our mode -> who writes a pod's status, and how often.

For each cell, one pod with one device, our sidecar in that mode beside the kubelet; the
device fails once, then the test watches for ``WINDOW`` seconds and counts, from the
kube-apiserver's audit log, the status writes of each user and of them those that carry
``allocatedResourcesStatus``; per hour is the window's count scaled (a steady state: the
window starts 15 s after our condition went False, and in ``auto`` after the field's first
write too, which waits ``--kubelet-field-grace`` for the kubelet's own entries). It prints
the table and, with ``KUBELET_DRA_E2E_RESULTS``, writes it as JSON.

It asserts the counts that the table in docs/sidecar.md ("Which to use") prints, read from
that file, so the two cannot drift: ``0`` must be measured as 0, any other figure within one
write of the window (30 per hour in 2 minutes: where the kubelet's reconciles fall in the
window moves a write in or out). ``test_doc_table_has_every_cell`` (not slow) proves that the
doc still has a figure for every cell.

Marked slow (six cells of two minutes per line): ``tox -e e2e -- -m slow`` runs it.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from kubelet_dra.settings import Settings
from tests.e2e import _dra
from tests.e2e.conftest import SIDECAR_USER

DOC = Path(__file__).resolve().parents[2] / "docs" / "sidecar.md"
COLUMN = "status writes per pod per hour"
#: A figure in the table's last column: "ours / the kubelet's", or "N from the sidecar".
BOTH = re.compile(r"^(\d+) / (\d+)\b")
OURS_ONLY = re.compile(r"^(\d+) from the sidecar\b")


def doc_rows(text: str) -> list[list[str]]:
    """The rows of the doc's table whose header names :data:`COLUMN`."""
    rows: list[list[str]] = []
    in_table = False
    for raw in text.splitlines():
        cells = [c.strip() for c in raw.strip().strip("|").split("|")]
        if not raw.startswith("|"):
            if in_table:
                break
            continue
        if not in_table:
            in_table = any(c.startswith(COLUMN) for c in cells)
        elif not set(raw) <= set("|-: "):
            rows.append(cells)
    return rows


def doc_counts(gate: str, mode: str, text: str | None = None) -> tuple[int, int | None]:
    """(ours, the kubelet's or None) per hour for one device beside a kubelet with ``gate``.

    The row whose gate column names ``gate`` ("on", "off", "on or off") and whose mode
    column starts with the backquoted mode; of two, the one for devices with a first CDI
    ID each (the test's pod has one device)."""
    found = []
    for row in doc_rows(DOC.read_text() if text is None else text):
        gates = row[1].split(" or ")
        if gate in gates and row[2].startswith(f"`{mode}`") and "sharing" not in row[2]:
            found.append(row[-1])
    assert len(found) == 1, f"{DOC.name}: {len(found)} rows for gate {gate}, mode {mode}"
    if m := BOTH.match(found[0]):
        return int(m[1]), int(m[2])
    m = OURS_ONLY.match(found[0])
    assert m, f"{DOC.name}: no count in {found[0]!r} (gate {gate}, mode {mode})"
    return int(m[1]), None


def within(measured: float, documented: int, window: float) -> bool:
    """0 is 0; another figure may be one write of the window off (see the docstring)."""
    if documented == 0:
        return measured == 0
    return abs(measured - documented) <= 3600.0 / window + 1e-6


WINDOW = float(os.environ.get("KUBELET_DRA_E2E_WINDOW", "120"))
#: Seconds from our condition's False to the window: the first reconcile after the failure.
SETTLE = 15.0
#: ``auto`` holds a pod's first field write this long (the default the sidecar runs with).
FIELD_GRACE = float(Settings.model_fields["kubelet_field_grace"].default)
ROWS: list[dict[str, object]] = []


def settled(world, mode: str) -> bool:
    cond = _dra.condition(world.pod("p"))
    return cond is not None and cond.get("status") == "False"


@pytest.mark.slow
@pytest.mark.timeout(WINDOW + FIELD_GRACE + 300)
@pytest.mark.parametrize("mode", ["auto", "on", "off"])
@pytest.mark.parametrize("gate", [True, False], ids=["gate-on", "gate-off"])
def test_writes_per_pod_per_hour(node_setup, audit, gate, mode):
    world = node_setup(gate=gate)
    sidecar = world.sidecar(mode)
    world.create_pod("p", ["gpu-0"])
    world.running("p")
    world.flip("gpu-0", "UNHEALTHY", "ECC error")
    sidecar.until(lambda: settled(world, mode), 60, "our condition False")
    time.sleep(SETTLE + (FIELD_GRACE if mode == "auto" else 0.0))
    start = time.time()
    time.sleep(WINDOW)
    kubelet = f"system:node:{world.kubelet.node}"
    writes = [w for w in audit.writes(world.namespace, "p") if w.at >= start and w.code < 400]
    per_hour = 3600.0 / WINDOW

    def count(user: str, field_only: bool = False) -> float:
        n = sum(1 for w in writes if w.user == user and (w.sets_field() or not field_only))
        return round(n * per_hour, 1)

    pod = world.pod("p")
    row = {
        "line": world.kubelet.spec.line, "gate": "on" if gate else "off", "mode": mode,
        "ours_per_hour": count(SIDECAR_USER), "ours_field_per_hour": count(SIDECAR_USER, True),
        "kubelet_per_hour": count(kubelet), "field_at_end": _dra.field_health(pod),
        "condition_at_end": (_dra.condition(pod) or {}).get("status"),
        "window_s": WINDOW,
    }  # fmt: skip
    ROWS.append(row)
    print("\n" + json.dumps(row))
    out = os.environ.get("KUBELET_DRA_E2E_RESULTS")
    if out:
        Path(out).with_suffix(".writes.json").write_text(json.dumps(ROWS, indent=2))
    assert row["condition_at_end"] == "False"
    ours, kubelets = doc_counts(row["gate"], mode)
    table = f"docs/sidecar.md says {ours} / {kubelets} for gate {row['gate']}, mode {mode}"
    assert within(row["ours_per_hour"], ours, WINDOW), f"{table}; we wrote {row}"
    if kubelets is not None:
        assert within(row["kubelet_per_hour"], kubelets, WINDOW), f"{table}; the kubelet {row}"


@pytest.mark.parametrize("mode", ["auto", "on", "off"])
@pytest.mark.parametrize("gate", ["on", "off"])
def test_doc_table_has_every_cell(gate, mode):
    ours, kubelets = doc_counts(gate, mode)
    assert ours >= 0 and (kubelets is None or kubelets >= 0)
