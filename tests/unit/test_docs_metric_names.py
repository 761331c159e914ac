"""Every ``kubelet_dra_*`` metric name the docs and the README mention is one ``/metrics`` exposes.

Names are compared as the exposition format spells them: a counter with ``_total``, a
histogram family bare or with ``_bucket``/``_count``/``_sum``, a gauge as it is. The
families come from the real registry (``metrics.Metrics``) over a state with the taint
bridge and the PodResources client on, so a renamed or removed metric, or a doc that
drops ``_total``, fails here.
"""

from __future__ import annotations

import pathlib
import re
import threading
import types
from typing import Any

import pytest

from kubelet_dra import clock, memtrim, metrics

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
_NAME = re.compile(r"\bkubelet_dra_[a-z0-9_]*[a-z0-9]\b")
_SUFFIXES = {"counter": ("_total",), "histogram": ("", "_bucket", "_count", "_sum")}


def exposed() -> frozenset[str]:
    state = metrics.State(taint_bridge="active", patch_connections=0, pod_resources_state="ready")
    families = [
        *metrics.Metrics(lambda: state).registry.collect(),
        *_server_families(),
        *_trimmer_families(),
    ]
    return frozenset(f.name + suffix for f in families for suffix in _SUFFIXES.get(f.type, ("",)))


def _server_families() -> list[Any]:
    """The metrics server's own counters (registered when it serves)."""
    server = types.SimpleNamespace(_refused_lock=threading.Lock(), refused={})
    return list(metrics._ServerCollector(server).collect())  # type: ignore[arg-type]


def _trimmer_families() -> list[Any]:
    """The malloc_trim counters (the sidecar registers them beside the manager's)."""
    trimmer = memtrim.Trimmer(60, clock=clock.FakeClock(), trim=lambda: 1)
    return list(trimmer.collector().collect())


def mentioned(text: str) -> set[str]:
    # ``kubelet_dra_*`` (a glob) and the Python package's own paths are not metric names.
    return {n for n in _NAME.findall(text) if not n.startswith("kubelet_dra_health")}


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_docs_name_only_exposed_metrics(path: pathlib.Path) -> None:
    unknown = sorted(mentioned(path.read_text()) - exposed())
    assert not unknown, f"{path.name} names metrics /metrics does not expose: {unknown}"


def test_the_check_catches_a_counter_without_its_total_suffix() -> None:
    assert mentioned("counted in `kubelet_dra_store_errors`") - exposed() == {
        "kubelet_dra_store_errors"
    }
    assert not mentioned("`kubelet_dra_store_errors_total` rises") - exposed()
