"""``python -m tests.soak.tracediff DIR``: did the sidecar's Python objects grow in a life?

Reads the ``tracemalloc`` snapshots that ``python -m tests.soak --trace-python-memory``
keeps (``DIR`` is the run's ``tracemalloc/``; ``tracehook/sitecustomize.py`` writes them).
For one sidecar life (the one with the most snapshots unless ``--pid``) it prints the
traced total at each snapshot, split into what the JSON decoder made (pods, claims,
answers), TLS buffers and the rest, then the tracebacks that grew most between the first
snapshot ``--after`` seconds into the life and the last. Only what Python allocates is
traced: memory of the C libraries (gRPC core, OpenSSL, SQLite) and allocator overhead are
not in it (docs/memory.md).
"""

from __future__ import annotations

import argparse
import collections
import sys
import tracemalloc
from pathlib import Path

_NOISE = [
    tracemalloc.Filter(False, tracemalloc.__file__),
    tracemalloc.Filter(False, "*/tracehook/sitecustomize.py"),
]
#: Kinds of the series: a traceback through this file is counted in that kind.
_KINDS = (("json", "json/decoder.py"), ("tls", "asyncio/sslproto.py"))


def lives(where: Path) -> dict[int, list[tuple[float, Path]]]:
    """Each pid's snapshots as (seconds since its start, path), in order."""
    out: dict[int, list[tuple[float, Path]]] = collections.defaultdict(list)
    for path in sorted(where.glob("*.snap")):
        pid, seconds = path.stem.split("-", 1)
        out[int(pid)].append((float(seconds), path))
    return {pid: sorted(snaps) for pid, snaps in out.items()}


def load(path: Path) -> tracemalloc.Snapshot:
    return tracemalloc.Snapshot.load(str(path)).filter_traces(_NOISE)


def split(snapshot: tracemalloc.Snapshot) -> dict[str, int]:
    """Bytes traced in all, and in each of :data:`_KINDS`."""
    out = dict.fromkeys(["total", *(kind for kind, _ in _KINDS)], 0)
    for stat in snapshot.statistics("traceback"):
        out["total"] += stat.size
        files = " ".join(frame.filename for frame in stat.traceback)
        for kind, marker in _KINDS:
            if marker in files:
                out[kind] += stat.size
                break
    return out


def _telling(traceback: tracemalloc.Traceback) -> list[tracemalloc.Frame]:
    """The allocating frame, then the innermost three of ours (``kubelet_dra``) that led there."""
    frames = list(reversed(traceback))  # tracemalloc keeps the oldest first
    ours = [f for f in frames[1:] if "kubelet_dra" in f.filename][:3]
    return frames[:1] + ours


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak.tracediff", description=__doc__)
    parser.add_argument("dir", type=Path, help="the run's tracemalloc/ directory")
    parser.add_argument("--pid", type=int, default=None, help="the life (default: the longest)")
    parser.add_argument("--after", type=float, default=300, help="seconds into the life (300)")
    parser.add_argument("--top", type=int, default=15, help="tracebacks to print (15)")
    ns = parser.parse_args(argv)
    found = lives(ns.dir)
    if not found:
        print(f"tracediff: no snapshots in {ns.dir}", file=sys.stderr)
        return 2
    pid = ns.pid if ns.pid is not None else max(found, key=lambda p: len(found[p]))
    snaps = found[pid]
    print(f"life pid {pid}: {len(snaps)} snapshots, {snaps[0][0]:g}-{snaps[-1][0]:g} s\n")
    print("| seconds | traced MB | JSON decoded MB | TLS buffers MB | the rest MB |")
    print("|---:|---:|---:|---:|---:|")
    for seconds, path in snaps:
        part = split(load(path))
        rest = part["total"] - part["json"] - part["tls"]
        print(
            f"| {seconds:g} | {part['total'] / 1e6:.3f} | {part['json'] / 1e6:.3f} "
            f"| {part['tls'] / 1e6:.3f} | {rest / 1e6:.3f} |"
        )
    first = next((s for s in snaps if s[0] >= ns.after), snaps[0])
    before, after = load(first[1]), load(snaps[-1][1])
    print(f"\ngrew most from {first[0]:g} s to {snaps[-1][0]:g} s:\n")
    for stat in after.compare_to(before, "traceback")[: ns.top]:
        print(f"{stat.size_diff / 1024:+10.1f} KiB {stat.count_diff:+7d} blocks")
        for frame in _telling(stat.traceback):
            print(f"    {frame.filename}:{frame.lineno}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
