"""Snapshots of the sidecar's traced Python memory (``python -m tests.soak --trace-python-memory``).

Not part of the package: the soak puts this directory first on the sidecar's
``PYTHONPATH`` (and ``PYTHONTRACEMALLOC`` in its environment), so Python imports it at
start-up, before ``kubelet_dra``. A daemon thread dumps a ``tracemalloc`` snapshot every
``KDRA_SOAK_TRACE_EVERY`` seconds to ``KDRA_SOAK_TRACE_DIR/<pid>-<seconds>.snap``, the
seconds counted from the process's start; ``python -m tests.soak.tracediff`` reads them.
Without both variables, or without tracing on, it does nothing.
"""

from __future__ import annotations

import os
import threading
import time
import tracemalloc


def _dump_forever(where: str, every: float) -> None:
    born = time.monotonic()
    while True:
        time.sleep(every)
        seconds = time.monotonic() - born
        path = os.path.join(where, f"{os.getpid()}-{seconds:07.1f}.snap")
        tracemalloc.take_snapshot().dump(path + ".part")
        os.replace(path + ".part", path)  # a killed sidecar leaves no half snapshot


_WHERE = os.environ.get("KDRA_SOAK_TRACE_DIR")
if _WHERE and tracemalloc.is_tracing():
    os.makedirs(_WHERE, exist_ok=True)
    _EVERY = float(os.environ.get("KDRA_SOAK_TRACE_EVERY") or 60)
    threading.Thread(
        target=_dump_forever, args=(_WHERE, _EVERY), name="soak-tracemalloc", daemon=True
    ).start()
