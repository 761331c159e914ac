"""Interop: the kubectl benchmark's real kube-apiserver variant still runs and checks its end state.

``benchmarks.kubectl`` builds a cluster on a real etcd + kube-apiserver (the binaries this
suite builds) and runs the plugin against it; here at a small size, for correctness only (no
timing checks): the table must hold exactly the non-Healthy devices and ``--all -o json``
must resolve every device. Skipped when the benchmark reports the server unavailable.
"""

from __future__ import annotations

import pytest

from benchmarks import kubectl

from . import _build

pytestmark = [pytest.mark.interop, pytest.mark.timeout(300)]


async def test_kubectl_benchmark_against_kube_apiserver_ends_in_the_exact_state() -> None:
    outcome = await kubectl.run(kubectl.Config(pods=20, runs=1, real_pods=60))
    skipped = [n for n in outcome.notes if n.startswith("kube-apiserver variant skipped")]
    if skipped:
        pytest.skip(skipped[0])
    assert outcome.failures == []
    real = [row for row in outcome.summary if row.scenario.startswith("kubectl vs kube-apiserver")]
    version = _build.ARTIFACTS["kube-apiserver"].version
    assert [row.scenario for row in real] == [
        f"kubectl vs kube-apiserver {version}, 60 pods x 8"
    ] * 2
    assert len(outcome.tables) == 2 and "60 pods x 8 devices (8 not Healthy)" in outcome.tables[1]
