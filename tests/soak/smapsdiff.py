"""``python -m tests.soak.smapsdiff BEFORE AFTER``: where a process's RSS went between two
snapshots of its ``/proc/<pid>/smaps`` (the soak keeps one a minute, ``smaps/``).

Each mapping is put in a kind, from what the kernel says of it alone:

- ``malloc main heap``: ``[heap]``, glibc's main arena (``brk``);
- ``malloc thread arena``: an anonymous read-write mapping at a 64 MiB boundary followed
  by the ``PROT_NONE`` rest of its 64 MiB reservation (glibc's ``HEAP_MAX_SIZE``);
- ``thread stack``: an anonymous read-write mapping right after a small ``PROT_NONE``
  guard (``pthread_create``'s stacks, which glibc caches after the thread ends);
- ``other anonymous``: CPython's small-object arenas (mmapped 1 MiB at a time, and
  merged by the kernel with their neighbours), chunks malloc mmapped on their own,
  gRPC's and OpenSSL's own mappings;
- ``libraries``: the shared objects' pages (code read on first use, and their
  relocated data); ``files``: any other file; ``[stack]`` and the rest by name.

It prints the resident KiB of each kind in both snapshots and the difference, then the
mappings that grew most. Which kind grew says what to look at next: a heap with glibc's
in-use bytes flat is free heap kept (``docs/memory.md``); a library's pages are code run
for the first time in this process's life; CPython's arenas are Python objects.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path

_HEADER = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ \S+\s*(.*)$")
_ARENA = 64 * 1024  # KiB: glibc's HEAP_MAX_SIZE on 64 bits
_GUARD_MAX = 64  # KiB: the largest PROT_NONE guard taken for a thread stack's


@dataclasses.dataclass
class Mapping:
    start: int
    end: int
    perms: str
    path: str
    rss_kib: int = 0
    kind: str = ""

    @property
    def size_kib(self) -> int:
        return (self.end - self.start) // 1024


def parse(text: str) -> list[Mapping]:
    """The mappings of one smaps text, in address order, each with its kind."""
    maps: list[Mapping] = []
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            start, end, perms, path = header.groups()
            maps.append(Mapping(int(start, 16), int(end, 16), perms, path.strip()))
        elif line.startswith("Rss:") and maps:
            maps[-1].rss_kib = int(line.split()[1])
    for i, m in enumerate(maps):
        m.kind = _kind(m, maps[i - 1] if i else None, maps[i + 1] if i + 1 < len(maps) else None)
    return maps


def _kind(m: Mapping, before: Mapping | None, after: Mapping | None) -> str:
    if m.path == "[heap]":
        return "malloc main heap"
    if m.path.startswith("["):
        return m.path
    if m.path:
        return "libraries" if ".so" in Path(m.path).name else "files"
    if m.perms.startswith("---"):
        return "guards and reservations"
    if _arena(m, after):
        return "malloc thread arena"
    if before is not None and _guard_of(before, m):
        return "thread stack"
    return "other anonymous"


def _guard_of(before: Mapping, m: Mapping) -> bool:
    """``before`` is a small ``PROT_NONE`` anonymous mapping right below ``m``."""
    small = before.size_kib <= _GUARD_MAX and before.end == m.start
    return small and not before.path and before.perms.startswith("---")


def _arena(m: Mapping, after: Mapping | None) -> bool:
    if m.start % (_ARENA * 1024) or after is None or after.path:
        return False
    contiguous = after.start == m.end and after.perms.startswith("---")
    return contiguous and m.size_kib + after.size_kib == _ARENA


def by_kind(maps: list[Mapping]) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in maps:
        out[m.kind] = out.get(m.kind, 0) + m.rss_kib
    return out


def report(before: list[Mapping], after: list[Mapping], top: int = 10) -> str:
    a, b = by_kind(before), by_kind(after)
    lines = ["| kind | before KiB | after KiB | change KiB |", "|---|---:|---:|---:|"]
    kinds = [k for k in set(a) | set(b) if a.get(k) or b.get(k)]
    for kind in sorted(kinds, key=lambda k: -abs(b.get(k, 0) - a.get(k, 0))):
        lines.append(f"| {kind} | {a.get(kind, 0)} | {b.get(kind, 0)} | "
                     f"{b.get(kind, 0) - a.get(kind, 0):+d} |")  # fmt: skip
    total_a, total_b = sum(a.values()), sum(b.values())
    lines.append(f"| total | {total_a} | {total_b} | {total_b - total_a:+d} |")
    old = {(m.start, m.path): m for m in before}
    grown = sorted(
        ((m.rss_kib - (old[(m.start, m.path)].rss_kib if (m.start, m.path) in old else 0), m)
         for m in after),
        key=lambda pair: -pair[0],
    )  # fmt: skip
    lines += ["", "| mapping | kind | size KiB | RSS KiB | grew KiB |", "|---|---|---:|---:|---:|"]
    for delta, m in grown[:top]:
        if delta <= 0:
            break
        name = Path(m.path).name if m.path else f"{m.start:x}"
        lines.append(f"| {name} | {m.kind} | {m.size_kib} | {m.rss_kib} | {delta:+d} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak.smapsdiff", description=__doc__)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--top", type=int, default=10, help="mappings listed (default 10)")
    ns = parser.parse_args(argv)
    print(report(parse(ns.before.read_text()), parse(ns.after.read_text()), ns.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
