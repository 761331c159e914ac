"""memtrim: the Trimmer on a fake clock, the bytes counted, glibc's calls and arenas for real."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry, generate_latest, parser

from kubelet_dra import clock, memtrim
from kubelet_dra.testing import eventually


def _trimmer(interval: float, rss: list[int], fake: clock.FakeClock) -> memtrim.Trimmer:
    calls = iter(rss)
    return memtrim.Trimmer(interval, clock=fake, trim=lambda: 1, rss=lambda: next(calls))


async def test_trims_once_per_interval_on_the_clock_and_counts_what_it_gave_back() -> None:
    fake = clock.FakeClock()
    # RSS before and after each of two calls: 10 MB given back, then none (it grew).
    trimmer = _trimmer(60, [50_000_000, 40_000_000, 40_000_000, 41_000_000], fake)
    task = asyncio.create_task(trimmer.run())
    try:
        await fake.wait_for_sleepers(1)
        assert trimmer.trims == 0  # not at start: the first call waits one interval
        fake.advance(60)
        await eventually(lambda: trimmer.trims == 1)
        assert trimmer.released_bytes == 10_000_000
        await fake.wait_for_sleepers(1)
        fake.advance(60)
        await eventually(lambda: trimmer.trims == 2)
        assert trimmer.released_bytes == 10_000_000  # a grown RSS counts as 0, not -1 MB
    finally:
        task.cancel()


async def test_an_interval_of_zero_does_nothing_and_no_glibc_only_collects() -> None:
    fake = clock.FakeClock()
    off = memtrim.Trimmer(0, clock=fake, trim=lambda: 1, collect=lambda: 1)
    assert not off.enabled
    await asyncio.wait_for(off.run(), 1)  # returns at once, no sleeper left behind
    assert fake.sleepers == 0 and off.collections == 0
    none = memtrim.Trimmer(60, clock=fake, trim=None, collect=lambda: 3)
    none._trim = None  # as on musl: glibc_trim() found nothing
    assert none.trim_once() == 0 and none.trims == 0
    task = asyncio.create_task(none.run())
    try:
        await fake.wait_for_sleepers(1)
        fake.advance(60)
        await eventually(lambda: none.collections == 1)
        assert (none.collected, none.trims) == (3, 0)
    finally:
        task.cancel()


async def test_each_round_collects_the_cycles_before_it_trims() -> None:
    # The soak's step at a kube-apiserver restart was failed connections in reference
    # cycles, which only a full collection frees: the trim comes after it, so that the
    # pages those held go back too.
    order: list[str] = []

    def collect() -> int:
        order.append("collect")
        return 5

    def trim() -> int:
        order.append("trim")
        return 1

    fake = clock.FakeClock()
    trimmer = memtrim.Trimmer(60, clock=fake, trim=trim, rss=lambda: 0, collect=collect)
    task = asyncio.create_task(trimmer.run())
    try:
        for rounds in (1, 2):
            await fake.wait_for_sleepers(1)
            fake.advance(60)
            await eventually(lambda: trimmer.trims == rounds)  # noqa: B023
        assert order == ["collect", "trim", "collect", "trim"]
        assert (trimmer.collections, trimmer.collected) == (2, 10)
    finally:
        task.cancel()


def test_the_default_collection_frees_a_cycle() -> None:
    import gc
    import weakref

    class Node:
        other: object = None

    a, b = Node(), Node()
    a.other, b.other = b, a
    alive = weakref.ref(a)
    del a, b
    gc.disable()  # no automatic collection in between
    try:
        trimmer = memtrim.Trimmer(60, clock=clock.FakeClock(), trim=lambda: 1)
        assert alive() is not None
        assert trimmer.collect_once() >= 2 and alive() is None
    finally:
        gc.enable()


def test_the_counters_are_exported() -> None:
    trimmer = _trimmer(60, [8_000_000, 5_000_000], clock.FakeClock())
    trimmer.trim_once()
    registry = CollectorRegistry()
    registry.register(trimmer.collector())
    text = generate_latest(registry).decode()
    assert "kubelet_dra_malloc_trims_total 1.0" in text
    assert "kubelet_dra_malloc_trim_released_bytes_total 3e+06" in text
    assert "kubelet_dra_gc_collections_total 0.0" in text
    assert "kubelet_dra_gc_collected_objects_total 0.0" in text


def test_glibcs_trim_gives_back_what_a_burst_freed() -> None:
    # The real call on this machine (glibc): a burst of mid-sized blocks, most freed with
    # one kept between every few so the heap cannot shrink from its top, is handed back.
    trim = memtrim.glibc_trim()
    assert trim is not None, "this test runs on glibc"
    kept, burst = [], [bytearray(4000) for _ in range(40_000)]  # ~160 MB below mmap's size
    for i, block in enumerate(burst):
        block[0] = 1  # touched, so resident
        if i % 64 == 0:
            kept.append(block)
    del burst, block
    trimmer = memtrim.Trimmer(60, clock=clock.FakeClock(), trim=trim)
    released = trimmer.trim_once()
    assert released > 50_000_000, released
    assert len(kept) == 625


def _exported(trimmer: memtrim.Trimmer) -> str:
    registry = CollectorRegistry()
    registry.register(trimmer.collector())
    return generate_latest(registry).decode()


def test_glibcs_heap_gauges_are_exported_where_mallinfo2_exists() -> None:
    fake = memtrim.Trimmer(60, clock=clock.FakeClock(), trim=lambda: 1, mallinfo=lambda: (7, 3, 2))
    text = _exported(fake)
    assert "kubelet_dra_malloc_in_use_bytes 7.0" in text
    assert "kubelet_dra_malloc_free_bytes 3.0" in text
    assert "kubelet_dra_malloc_mmapped_bytes 2.0" in text
    absent = memtrim.Trimmer(60, clock=clock.FakeClock(), trim=lambda: 1)
    absent._mallinfo = None  # as on musl or glibc < 2.33: glibc_mallinfo() found nothing
    text = _exported(absent)
    assert "malloc_in_use_bytes" not in text and "malloc_free_bytes" not in text
    assert "malloc_mmapped_bytes" not in text
    assert "kubelet_dra_malloc_trims_total" in text  # the counters stay
    assert "kubelet_dra_python_allocated_blocks" in text  # CPython's own: everywhere


def test_glibcs_heap_gauges_read_the_real_mallinfo2() -> None:
    # This machine's glibc (>= 2.33): a live 4 MB of blocks below mmap's size is in use.
    state = memtrim.glibc_mallinfo()
    assert state is not None, "this test runs on glibc 2.33 or later"
    in_use, free, mmapped = state()
    blocks = [bytearray(4000) for _ in range(1000)]
    grown, _, _ = state()
    assert grown - in_use >= 3_900_000, (in_use, grown)
    assert free >= 0 and len(blocks) == 1000
    # One chunk far above glibc's mmap threshold (32 MiB at most) is mmapped on its own.
    big = bytearray(64 * 2**20)
    assert state()[2] - mmapped >= 64 * 2**20 and len(big) == 64 * 2**20
    text = _exported(memtrim.Trimmer(60, clock=clock.FakeClock()))
    families = {f.name: f for f in parser.text_string_to_metric_families(text)}
    for name in (
        "kubelet_dra_malloc_in_use_bytes",
        "kubelet_dra_malloc_free_bytes",
        "kubelet_dra_malloc_mmapped_bytes",
    ):
        assert families[name].type == "gauge"
        assert families[name].samples[0].value >= 0
    assert families["kubelet_dra_malloc_in_use_bytes"].samples[0].value > 1_000_000


def test_pythons_allocated_blocks_follow_the_objects_alive() -> None:
    def exported() -> float:
        text = _exported(memtrim.Trimmer(60, clock=clock.FakeClock()))
        families = {f.name: f for f in parser.text_string_to_metric_families(text)}
        family = families["kubelet_dra_python_allocated_blocks"]
        assert family.type == "gauge"
        return float(family.samples[0].value)

    before = exported()
    objects = [object() for _ in range(100_000)]
    during = exported()
    del objects
    after = exported()
    assert during - before >= 100_000, (before, during)
    assert after - before < 10_000, (before, after)  # freed: back where it was


@pytest.mark.parametrize(
    ("set_", "param", "env", "value"),
    [
        (memtrim.cap_arenas, memtrim.M_ARENA_MAX, "MALLOC_ARENA_MAX", 2),
        (memtrim.fix_trim_threshold, memtrim.M_TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_", 131072),
    ],
)
def test_mallopt_is_called_unless_the_operator_chose(
    set_: Callable[..., bool], param: int, env: str, value: int
) -> None:
    calls: list[tuple[int, int]] = []

    def mallopt(p: int, v: int) -> int:
        calls.append((p, v))
        return 1

    assert set_(value, mallopt=mallopt, environ={})
    assert calls == [(param, value)]
    assert not set_(0, mallopt=mallopt, environ={})
    assert not set_(value, mallopt=mallopt, environ={env: "4"})
    assert not set_(value, mallopt=lambda p, v: 0, environ={})  # refused
    assert calls == [(param, value)]


_ARENAS = """
import ctypes, sys, threading
from kubelet_dra import memtrim
memtrim.cap_arenas(int(sys.argv[1]), environ={})
gate = threading.Barrier(8)
def work():
    gate.wait()  # all eight alive at once: none can take an exited thread's arena
    kept = [bytearray(5000) for _ in range(100)]  # malloc'd in this thread
    gate.wait()
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
ctypes.CDLL("libc.so.6").malloc_stats()  # one "Arena N:" block per arena, on stderr
"""


@pytest.mark.parametrize(("most", "bound"), [(1, 1), (2, 2), (0, 9)])
def test_glibc_makes_no_more_arenas_than_the_cap(most: int, bound: int) -> None:
    # The real allocator: eight threads that each malloc get arenas of their own
    # (glibc's default allows 8 per core) unless the cap holds them.
    done = subprocess.run(
        [sys.executable, "-c", _ARENAS, str(most)], capture_output=True, text=True, check=True,
        env={k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"},
    )  # fmt: skip
    arenas = done.stderr.count("Arena ")
    assert 1 <= arenas <= bound, done.stderr
    if most == 0:
        assert arenas > 2, done.stderr  # uncapped, the threads spread


_THREAD_BURST = """
import ctypes, sys, threading
from kubelet_dra import memtrim
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
memtrim.cap_arenas(2, environ={})
memtrim.fix_trim_threshold(int(sys.argv[1]), environ={})
def burst():
    big = libc.malloc(1 << 20)  # mmapped; once freed, glibc's dynamic thresholds rise
    libc.free(big)
    chunks = [libc.malloc(100_000) for _ in range(15)]  # now from this thread's arena
    for chunk in chunks: libc.free(chunk)
thread = threading.Thread(target=burst)
thread.start()
thread.join()
memtrim.glibc_trim()()  # what the Trimmer does: it never trims another arena's top
libc.malloc_stats()  # "Arena 1:" is the thread's, its "system bytes" what its heap holds
"""


@pytest.mark.parametrize("limit", [0, 131072])
def test_a_worker_threads_burst_goes_back_with_the_fixed_threshold(limit: int) -> None:
    # The real allocator: a worker thread frees an mmapped megabyte (glibc then raises its
    # trim threshold to 2 MiB), then 1.5 MB of its arena. With glibc's dynamic threshold
    # the heap keeps it after malloc_trim; with 128 KiB fixed, free gives it back.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run(
        [sys.executable, "-c", _THREAD_BURST, str(limit)], capture_output=True, text=True,
        check=True, env=env,
    )  # fmt: skip
    arena = done.stderr.split("Arena 1:")[1]
    held = int(arena.split("system bytes")[1].split("=")[1].split()[0])
    if limit:
        assert held < 400_000, done.stderr
    else:
        assert held > 1_000_000, done.stderr  # the mechanism the fixed threshold removes
