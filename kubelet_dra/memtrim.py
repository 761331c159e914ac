"""Free reference cycles and give freed heap back to the OS, every minute or so.

No kubelet file mirrors this: Go's runtime returns idle heap spans to the OS itself (the
scavenger); CPython on glibc does not. :class:`Trimmer` runs a full garbage collection and
then glibc's ``malloc_trim`` every ``interval`` seconds, and exports the counts and glibc's
own account of its heap. :func:`cap_arenas` and :func:`fix_trim_threshold` set glibc's
arena cap and trim threshold at start. Why each: ``docs/decisions/0003-malloc-settings.md``.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import core, registry

from kubelet_dra import clock as clock_mod

logger = logging.getLogger(__name__)

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """This process's resident set size now (``/proc/self/statm``), or 0 if unknown."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def glibc_trim() -> Callable[[], int] | None:
    """``malloc_trim(0)`` of this process's glibc, or None where there is none."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: int(trim(0))


#: ``mallopt``'s parameters (``malloc.h``): the most arenas glibc makes, and the free bytes
#: at the top of a heap above which ``free`` gives them back to the system.
M_ARENA_MAX = -8
M_TRIM_THRESHOLD = -1


def glibc_mallopt() -> Callable[[int, int], int] | None:
    """``mallopt(param, value)`` of this process's glibc, or None where there is none."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return lambda param, value: int(mallopt(param, value))


def cap_arenas(
    most: int,
    *,
    mallopt: Callable[[int, int], int] | None = None,
    environ: Mapping[str, str] = os.environ,
) -> bool:
    """Let glibc make at most ``most`` malloc arenas from now on; whether it was set.

    What ``kubelet-dra-health run`` does first (``--malloc-arena-max``, default 2).
    glibc gives each thread that allocates an arena of its own, up to 8 per core; the
    sidecar's threads (the API worker threads, the gRPC core's, a watch reader per
    watch) then each keep the memory they freed. Two arenas cost no measurable speed
    (Python holds the GIL for nearly all of its allocations) and saved about 9 MB of
    RSS in the memory benchmark (docs/performance.md). Nothing is done for 0, where
    there is no glibc, or when ``MALLOC_ARENA_MAX`` is set (glibc read it at start: the
    operator's choice wins). Call it before threads start: an arena made already stays.
    """
    return _set(M_ARENA_MAX, most, "MALLOC_ARENA_MAX", mallopt, environ)


def fix_trim_threshold(
    limit: int,
    *,
    mallopt: Callable[[int, int], int] | None = None,
    environ: Mapping[str, str] = os.environ,
) -> bool:
    """Let ``free`` give back the top of any glibc heap once more than ``limit`` bytes of
    it are free; whether it was set (``--malloc-trim-threshold``, default 128 KiB).

    glibc's default is 128 KiB too, but dynamic: once a chunk it had mmapped is freed
    (a list's body, a burst's buffers), it raises the mmap threshold to that chunk's
    size and the trim threshold to twice it, so a heap then keeps 1-2 MiB of free
    memory at its top. ``malloc_trim`` gives back the main heap's top, but never the top
    of another arena's heap (the one the sidecar's threads share): there only ``free``
    trims, above this threshold. Setting it also stops glibc moving the mmap threshold,
    which stays at 128 KiB (``mallopt(3)``). Nothing is done for 0, where there is no
    glibc, or when ``MALLOC_TRIM_THRESHOLD_`` is set (the operator's choice wins).
    """
    return _set(M_TRIM_THRESHOLD, limit, "MALLOC_TRIM_THRESHOLD_", mallopt, environ)


def _set(
    param: int,
    value: int,
    env: str,
    mallopt: Callable[[int, int], int] | None,
    environ: Mapping[str, str],
) -> bool:
    if value <= 0 or environ.get(env):
        return False
    call = mallopt if mallopt is not None else glibc_mallopt()
    if call is None:
        return False
    ok = call(param, value) == 1  # mallopt returns 1 on success
    if not ok:
        logger.warning("mallopt(%d, %d) failed; glibc's default stays (%s)", param, value, env)
    return ok


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (``malloc.h``): ten ``size_t`` fields in this order."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


MallocState = Callable[[], tuple[int, int, int]]
"""Returns glibc's (bytes in use, free bytes kept in the heaps, bytes of the chunks it
mmapped on their own, which are part of the bytes in use)."""


def glibc_mallinfo() -> MallocState | None:
    """``mallinfo2()`` of this process's glibc as (in use, free, mmapped), or None where
    there is none (not glibc, or glibc before 2.33, whose ``mallinfo`` wraps at 4 GiB)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallinfo2 = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.argtypes = []
    mallinfo2.restype = _MallInfo2

    def state() -> tuple[int, int, int]:
        info = mallinfo2()
        # In use: blocks in the heaps plus chunks malloc mmapped on their own.
        mmapped = int(info.hblkhd)
        return int(info.uordblks) + mmapped, int(info.fordblks), mmapped

    return state


class Trimmer:
    """Every ``interval`` seconds: a full garbage collection, then ``trim``; counts both.

    A relist, a burst of reports or a new gRPC channel allocates short-lived C and Python
    buffers; once freed, their pages may stay in glibc's heap, fragmented between live blocks.
    ``malloc_trim(0)`` hands every whole free page inside the heap back
    (``madvise(MADV_DONTNEED)``): a cheap bound on the free heap, nothing more.

    The trim runs on a worker thread (it takes glibc's arena locks for a few milliseconds; the
    event loop keeps turning). Before it, a full garbage collection runs on the event loop
    (about 15 ms): a failed connection leaves its objects in a reference cycle (the exception's
    traceback holds the frames that hold the connection, whose stream holds the exception), and
    once a cycle holds an object old enough to live in the oldest generation only a full
    collection frees it, which CPython runs only when the objects promoted since the last one
    reach a quarter of those already there: in a steady sidecar, hours. Not glibc (musl,
    macOS): it only collects. ``interval`` 0: it does neither. Time is injected (``clock``).

    The collector exports glibc's account of the heap at each scrape (``mallinfo2()``, glibc
    2.33 and later; nothing where it is absent): the bytes malloc has handed out and not had
    back (``uordblks`` + ``hblkhd``) and the free bytes it keeps in its heaps (``fordblks``).
    An RSS that steps up with the second flat is memory in use; with the first flat, it is free
    heap.
    """

    def __init__(
        self,
        interval: float,
        *,
        clock: clock_mod.Clock,
        trim: Callable[[], int] | None = None,
        rss: Callable[[], int] = rss_bytes,
        mallinfo: MallocState | None = None,
        collect: Callable[[], int] = gc.collect,
    ) -> None:
        self.interval = interval
        self._clock = clock
        self._trim = trim if trim is not None else glibc_trim()
        self._rss = rss
        self._mallinfo = mallinfo if mallinfo is not None else glibc_mallinfo()
        self._collect = collect
        self.trims = 0
        self.released_bytes = 0
        self.collections = 0
        self.collected = 0

    @property
    def enabled(self) -> bool:
        return self.interval > 0

    def collect_once(self) -> int:
        """A full collection (call on the event loop: the finalizers of asyncio objects it
        frees must run there); returns the unreachable objects it found."""
        found = self._collect()
        self.collections += 1
        self.collected += found
        return found

    def trim_once(self) -> int:
        """One call (any thread); returns the bytes of RSS it gave back (0 if none)."""
        if self._trim is None:
            return 0
        before = self._rss()
        self._trim()
        # The RSS may also grow meanwhile (another thread allocating): never negative.
        released = max(0, before - self._rss())
        self.trims += 1
        self.released_bytes += released
        logger.debug("malloc_trim gave back %.1f MB of RSS", released / 1e6)
        return released

    async def run(self) -> None:
        """Collect and trim every ``interval`` seconds until cancelled (returns at once if
        the interval is 0; without glibc it only collects)."""
        if not self.enabled:
            return
        while True:
            await self._clock.sleep(self.interval)
            # First the cycles: what they hold is only freed by a collection, and the
            # trim can then give its pages back.
            self.collect_once()
            if self._trim is not None:
                await asyncio.to_thread(self.trim_once)

    def collector(self) -> registry.Collector:
        """The two counters and glibc's two heap gauges, for a metrics registry."""
        return _Collector(self)


class _Collector(registry.Collector):
    def __init__(self, trimmer: Trimmer) -> None:
        self._trimmer = trimmer

    def collect(self) -> Iterator[core.Metric]:
        # An unlabelled family takes its one value at construction.
        t = self._trimmer
        yield from (
            core.CounterMetricFamily(
                "kubelet_dra_malloc_trims",
                "Calls of glibc malloc_trim (--malloc-trim-interval).",
                value=t.trims,
            ),
            core.CounterMetricFamily(
                "kubelet_dra_malloc_trim_released_bytes",
                "Bytes of resident memory malloc_trim gave back to the OS.",
                value=t.released_bytes,
            ),
            core.CounterMetricFamily(
                "kubelet_dra_gc_collections",
                "Full garbage collections run every --malloc-trim-interval, before the trim.",
                value=t.collections,
            ),
            core.CounterMetricFamily(
                "kubelet_dra_gc_collected_objects",
                "Unreachable objects (reference cycles) those collections freed.",
                value=t.collected,
            ),
        )
        blocks = core.GaugeMetricFamily(
            "kubelet_dra_python_allocated_blocks",
            "Memory blocks the Python interpreter has allocated now (sys.getallocatedblocks): "
            "flat while the RSS's anonymous memory grows is CPython's arenas kept, not objects.",
        )
        blocks.add_metric([], sys.getallocatedblocks())
        yield blocks
        if self._trimmer._mallinfo is None:
            return
        in_use, free, mmapped = self._trimmer._mallinfo()
        used = core.GaugeMetricFamily(
            "kubelet_dra_malloc_in_use_bytes",
            "Bytes glibc malloc has handed out and not had back (mallinfo2 uordblks + hblkhd).",
        )
        used.add_metric([], in_use)
        kept = core.GaugeMetricFamily(
            "kubelet_dra_malloc_free_bytes",
            "Free bytes glibc malloc keeps in its heaps, not given back to the OS "
            "(mallinfo2 fordblks).",
        )
        kept.add_metric([], free)
        own = core.GaugeMetricFamily(
            "kubelet_dra_malloc_mmapped_bytes",
            "Bytes of the chunks glibc malloc mmapped on their own, each an anonymous mapping "
            "of its own (mallinfo2 hblkhd; part of kubelet_dra_malloc_in_use_bytes).",
        )
        own.add_metric([], mmapped)
        yield used
        yield kept
        yield own
