"""Restarts beside a real kubelet: SIGKILL the kubelet, the driver and the sidecar in turn,
each while a device is Unhealthy. Nothing is lost, we never blip, and nobody fights.

Every version of the pod is recorded through a watch (``PodHistory``), so a blip between
two polls cannot hide. Our condition must read ``False`` (Unhealthy) in every version from
the first failure to the end. The kubelet's field is reported as the kubelet leaves it; its
final state must be Unhealthy again. Writes are counted from the audit log.
"""

from __future__ import annotations

import time

from tests.e2e import _dra
from tests.e2e.conftest import SIDECAR_USER, registered

CDI = f"{_dra.DRIVER}/gpu=gpu-0"


def unhealthy(pod) -> bool:
    cond = _dra.condition(pod)
    return cond is not None and cond.get("status") == "False"


def test_sigkill_each_part_while_a_device_is_unhealthy(node_setup, audit):
    world = node_setup(gate=True)
    state = world.workdir / "sidecar-state"
    sidecar = world.sidecar("auto", state_dir=state)
    world.create_pod("p", ["gpu-0"])
    world.running("p")
    world.flip("gpu-0", "UNHEALTHY", "ECC error")
    _dra.wait(lambda: _dra.field_health(world.pod("p")).get(CDI) == "Unhealthy", 60,
              "the kubelet's field Unhealthy")  # fmt: skip
    sidecar.until(lambda: unhealthy(world.pod("p")), 30, "our condition False")
    history = _dra.PodHistory(world.api, world.namespace, "p")
    start = time.time()
    stages: list[tuple[str, float]] = []
    try:
        stages.append(("kubelet", time.time()))
        # 1. The kubelet: SIGKILL and start again on the same root dir (its checkpoints).
        world.kubelet.restart()
        _dra.wait(lambda: _dra.field_health(world.pod("p")).get(CDI) == "Unhealthy", 90,
                  "the kubelet's field Unhealthy after its restart")  # fmt: skip
        # 2. The driver: SIGKILL, then a new process on the same sockets.
        stages.append(("driver", time.time()))
        world.driver.kill()
        world.driver.events.clear()
        world.driver.start(world.devices.script(_dra.DRIVER))
        registered(world.driver)
        # 3. The sidecar: SIGKILL, then a new one on the same state dir.
        stages.append(("sidecar", time.time()))
        assert sidecar.proc is not None
        sidecar.proc.kill()
        sidecar.proc.wait(10)
        sidecar = world.sidecar("auto", state_dir=state)
        sidecar.metrics_url()  # started and serving
        time.sleep(15)  # a kubelet status reconcile and three driver re-sends after it all
        final = world.pod("p")
    finally:
        history.stop()
    seen = [(at, _dra.condition(pod)) for at, pod in history.versions]
    assert seen, "the watch saw no version of the pod"
    blips = [(stage_at(stages, at), c) for at, c in seen if c is None or c.get("status") != "False"]
    assert not blips, blips
    assert _dra.field_health(final).get(CDI) == "Unhealthy"
    kubelet_view = [h.get(CDI) for h in history.healths()]
    print(f"\nthe kubelet's field over the restarts: {compress(kubelet_view)}")
    ours = [
        w for w in audit.writes(world.namespace, "p") if w.user == SIDECAR_USER and w.at >= start
    ]
    print(f"our status writes during the restarts: {len(ours)}")
    # A restarted sidecar finds the kubelet's entries under our names, written by someone
    # else: the field is the kubelet's (before --kubelet-field-grace and the rule that
    # made it, it wrote the driver restart's health there once in three runs).
    field_writes = [w for w in ours if w.sets_field()]
    print(f"of them setting the field: {len(field_writes)}")
    assert not field_writes, [w.body for w in field_writes]
    assert len(ours) <= 3, [w.body for w in ours]


def compress(values: list[str | None]) -> list[str | None]:
    """Runs of equal values once each: ['Unhealthy', None, 'Unhealthy'] shows a gap."""
    out: list[str | None] = []
    for value in values:
        if not out or out[-1] != value:
            out.append(value)
    return out


def stage_at(stages: list[tuple[str, float]], at: float) -> str:
    """Which restart a moment falls in (the last one started before it)."""
    return next((name for name, began in reversed(stages) if began <= at), "before")
