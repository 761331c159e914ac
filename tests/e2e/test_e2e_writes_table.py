"""The coexistence table: kubelet gate x our mode -> who writes a pod's status, and how often.

For each cell, one pod with one device, our sidecar in that mode beside the kubelet; the
device fails once, then the test watches for ``WINDOW`` seconds and counts, from the
kube-apiserver's audit log, the status writes of each user and of them those that carry
``allocatedResourcesStatus``; per hour is the window's count scaled (a steady state, after
the first failure was written). It prints the table docs/sidecar.md quotes and, with
``KUBELET_DRA_E2E_RESULTS``, writes it as JSON.

Marked slow (six cells of two minutes per line): ``tox -e e2e -- -m slow`` runs it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.e2e import _dra
from tests.e2e.conftest import SIDECAR_USER

WINDOW = float(os.environ.get("KUBELET_DRA_E2E_WINDOW", "120"))
ROWS: list[dict[str, object]] = []


def settled(world, mode: str) -> bool:
    cond = _dra.condition(world.pod("p"))
    return cond is not None and cond.get("status") == "False"


@pytest.mark.slow
@pytest.mark.timeout(WINDOW + 300)
@pytest.mark.parametrize("mode", ["auto", "on", "off"])
@pytest.mark.parametrize("gate", [True, False], ids=["gate-on", "gate-off"])
def test_writes_per_pod_per_hour(node_setup, audit, gate, mode):
    world = node_setup(gate=gate)
    sidecar = world.sidecar(mode)
    world.create_pod("p", ["gpu-0"])
    world.running("p")
    world.flip("gpu-0", "UNHEALTHY", "ECC error")
    sidecar.until(lambda: settled(world, mode), 60, "our condition False")
    time.sleep(15)  # the first reconcile after the failure
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
