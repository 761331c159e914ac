"""As fast as the kubelet: one driver report to the kubelet's field and to our condition.

In one run, beside one kubelet, the same flips are timed on both paths: from the moment the
driver's control file changes (the driver sends within ~100 ms) to the first pod version,
seen through a watch, where the kubelet's field shows the new health, and to the first where
our condition does. The kubelet is the peer: the test prints both medians and their ratio
(docs/sidecar.md quotes a run) and asserts that our condition's median is within
:data:`RATIO` times the kubelet's field's, over :data:`FLIPS` flips.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import time
from pathlib import Path

from tests.e2e import _dra

FLIPS = 6  # at least 5 per side, as the issue asks
#: The bound on our median over the kubelet's: as fast as the kubelet, with room for load.
RATIO = 1.5
CDI = f"{_dra.DRIVER}/gpu=gpu-0"


def first_seen(history: _dra.PodHistory, since: float, pred) -> float | None:
    for at, pod in list(history.versions):
        if at >= since and pred(pod):
            return at
    return None


def ours(health: str):
    want = "True" if health == "Healthy" else "False"
    return lambda pod: (c := _dra.condition(pod)) is not None and c.get("status") == want


def kubelets(health: str):
    return lambda pod: _dra.field_health(pod).get(CDI) == health


def seen_both(history: _dra.PodHistory, sent: float, health: str) -> tuple[float, float] | None:
    kubelet = first_seen(history, sent, kubelets(health))
    sidecar = first_seen(history, sent, ours(health))
    return (kubelet, sidecar) if kubelet is not None and sidecar is not None else None


def test_report_to_pod_latency_kubelet_and_sidecar(node_setup):
    world = node_setup(gate=True)
    # The shipped write window, not the test suite's faster one: this is the figure users get.
    sidecar = world.sidecar("auto", env={"KUBELET_DRA_WRITE_WINDOW": "0.05"})
    world.create_pod("p", ["gpu-0"])
    world.running("p")
    history = _dra.PodHistory(world.api, world.namespace, "p")
    try:
        _dra.wait(lambda: kubelets("Healthy")(world.pod("p")) and ours("Healthy")(world.pod("p")),
                  60, "both sides Healthy")  # fmt: skip
        rows = []
        for i in range(FLIPS):
            health = "Unhealthy" if i % 2 == 0 else "Healthy"
            sent = time.time()
            world.flip("gpu-0", health.upper(), f"flip {i}")
            both = _dra.wait(
                functools.partial(seen_both, history, sent, health),
                60, f"flip {i} ({health}) on both paths",
            )  # fmt: skip
            rows.append((health, both[0] - sent, both[1] - sent))
            time.sleep(0.5)
        sidecar.check_running()
    finally:
        history.stop()
    kubelet_median = statistics.median(r[1] for r in rows)
    ours_median = statistics.median(r[2] for r in rows)
    print("\nflip  health     kubelet field  our condition")
    for i, (health, k, o) in enumerate(rows):
        print(f"{i:>4}  {health:<9}  {k:>11.3f}s  {o:>12.3f}s")
    print(f"median             {kubelet_median:>11.3f}s  {ours_median:>12.3f}s  "
          f"ratio ours/kubelet {ours_median / kubelet_median:.2f}")  # fmt: skip
    out = os.environ.get("KUBELET_DRA_E2E_RESULTS")
    if out:
        Path(out).write_text(json.dumps({
            "line": world.kubelet.spec.line, "flips": rows,
            "kubelet_median_s": kubelet_median, "ours_median_s": ours_median,
        }, indent=2))  # fmt: skip
    assert len(rows) == FLIPS
    assert ours_median <= RATIO * kubelet_median, (
        f"our condition's median {ours_median:.3f}s is more than {RATIO}x the kubelet's field's "
        f"{kubelet_median:.3f}s over {FLIPS} flips (ratio {ours_median / kubelet_median:.2f})"
    )
