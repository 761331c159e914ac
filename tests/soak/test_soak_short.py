"""The soak's 3-minute run, in the interop tier of the default CI (``tox -e interop``).

The same run as ``tox -e soak -- --minutes 3 --seed 22``: every kind of fault at least once
on the real kube-apiserver, the sidecar, 3 drivers, 30 pods and the real kubelet 1.37
(``KUBELET_DRA_SOAK_KUBELET``: ``auto``, the default, runs it where it can run, that is
as root with ``unshare`` and its Go build, and says so when it cannot; ``none`` leaves it
out; a line such as ``1.38`` requires it), with the checks of
``_checks`` (no lost final state, no Unknown blip, no write refused as invalid) and the
short run's resource bounds (``_report.SHORT``). ``KUBELET_DRA_SOAK_SEED`` picks another
schedule. Costs about 3.5 minutes (199 s measured on the 2 shared cores at load 20-50):
20-30 s to start etcd and kube-apiserver, 180 s of faults, the final convergence (seconds)
and the teardown.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.interop import _build
from tests.interop._apiserver import openssl_unavailable_reason
from tests.soak import _parts as parts
from tests.soak import _report
from tests.soak._run import Options, Soak

pytestmark = [pytest.mark.interop, pytest.mark.timeout(900)]


def test_three_minutes_of_mixed_faults_lose_nothing(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the soak mounts a tmpfs for the state dir: root only")
    reason = openssl_unavailable_reason()
    if reason:
        pytest.skip(f"soak: {reason}")
    for name in ("etcd", "kube-apiserver"):
        try:
            _build.ensure(name)
        except _build.BuildUnavailable as exc:
            pytest.skip(f"soak: {name} unavailable: {exc.reason}")
    seed = int(os.environ.get("KUBELET_DRA_SOAK_SEED", "22"))
    kubelet = _kubelet(os.environ.get("KUBELET_DRA_SOAK_KUBELET", "auto"))
    summary = Soak(Options(3, seed, tmp_path / "soak", chart=False, kubelet=kubelet)).run()
    print("\n" + _report.table(summary))
    if kubelet is not None:
        assert summary["kubelet"]["restarts"] >= 1, summary["kubelet"]
    failed = {
        key: summary[key][:5]
        for key in (
            "lost_final_states",
            "unknown_blips",
            "refused_invalid",
            "harness_errors",
            "phantom_kubelet",
        )
        if summary[key]
    }
    bad = {k: v for k, v in summary["resources"].items() if not v["ok"]}
    assert summary["ok"], json.dumps({**failed, "resources": bad}, indent=1, default=str)


def _kubelet(choice: str) -> str | None:
    line, why_not = parts.choose_kubelet(choice)
    if why_not and choice != "auto":
        pytest.fail(f"soak: {why_not}")
    if why_not:
        print(f"soak: {why_not}")
    return line
