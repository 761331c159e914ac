"""The runnable examples of ``docs/library.md`` run and print what the doc says."""

from __future__ import annotations

import subprocess

import pytest

from ._sidecar_process import ROOT, run_python

EXAMPLES = ROOT / "docs" / "examples"


def run_example(name: str) -> subprocess.CompletedProcess[str]:
    return run_python(str(EXAMPLES / name))


@pytest.mark.timeout(40)
def test_async_node_agent_example_merges_device_health_into_its_pod() -> None:
    out = run_example("node_agent.py").stdout.splitlines()
    assert "train-0: gpu=0 is Healthy" in out
    assert "train-0: gpu=0 is Unhealthy (XID 79)" in out
    assert out.index("train-0: gpu=0 is Healthy") < out.index(
        "train-0: gpu=0 is Unhealthy (XID 79)"
    )
    assert '    "name": "claim:train-0-gpu",' in out
    assert '        "resourceID": "gpu=0",' in out
    assert "condition DeviceHealthy=False (DeviceUnhealthy)" in out
    # The owner role answers NotifyRegistrationStatus, as a kubelet does.
    assert "driver told it was registered: True" in out


@pytest.mark.timeout(40)
def test_sync_node_agent_example_receives_updates_on_its_own_thread() -> None:
    done = run_example("node_agent_sync.py")
    out = done.stdout.splitlines()
    assert "uid-train-0: gpu.example.com/pool/gpu-0 is Healthy" in out
    assert "uid-train-0: gpu.example.com/pool/gpu-0 is Unhealthy fan" in out
    assert out[-1] == "condition: False (DeviceUnhealthy)"
    assert "Traceback" not in done.stderr
