"""Under CI, a test that skipped is a failure unless ``tests/allowed-skips.toml`` names it.

A tier that needs Go, root or a tool skips with the reason where the machine cannot run it,
which is right on a laptop and wrong in CI: there a skipped tier would leave a green run that
proved less than it says. So with ``CI`` set (CI sets ``CI=true``; ``.ci/run`` sets it too),
every skip becomes a failure that names its reason, unless an entry of the allow-list matches
both its test id and its reason. An entry that applies to a run (some collected test matches
its pattern) but matched no skip in it fails the run too, so the list cannot go stale.

The root ``conftest.py`` wires the two hooks; this module holds the rules, and is pure
enough to unit-test (``tests/unit/test_skipguard.py``).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path

ALLOW_FILE = Path(__file__).resolve().parent / "allowed-skips.toml"
#: Values of ``CI`` that mean "not CI" (unset counts as not CI too).
_OFF = frozenset({"", "0", "false", "no", "off"})


def ci_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``CI`` is set to something that means yes."""
    return environ.get("CI", "").strip().lower() not in _OFF


@dataclasses.dataclass(frozen=True)
class Allowed:
    """One allow-list entry: a test-id pattern, a reason pattern, and why it may skip."""

    test: str
    reason: str
    why: str

    def applies_to(self, nodeid: str) -> bool:
        return fnmatch.fnmatchcase(nodeid, self.test)

    def matches(self, nodeid: str, reason: str) -> bool:
        return self.applies_to(nodeid) and re.search(self.reason, reason) is not None


def load(path: Path | None = None) -> tuple[Allowed, ...]:
    """The entries of the allow-list; a malformed entry is an error, not ignored."""
    path = path or ALLOW_FILE
    data = tomllib.loads(path.read_text())
    entries = []
    for index, raw in enumerate(data.get("skip", [])):
        missing = [k for k in ("test", "reason", "why") if not str(raw.get(k, "")).strip()]
        if missing:
            raise ValueError(f"{path.name}: entry {index} lacks {', '.join(missing)}")
        re.compile(raw["reason"])
        entries.append(Allowed(raw["test"], raw["reason"], raw["why"]))
    return tuple(entries)


def skip_reason(longrepr: object) -> str:
    """The reason of a skip report's ``longrepr`` (a ``(path, line, "Skipped: ...")`` tuple)."""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


class Guard:
    """What one session skipped, judged against the allow-list."""

    def __init__(self, allowed: Iterable[Allowed]) -> None:
        self.allowed = tuple(allowed)
        self.used: set[Allowed] = set()
        self.applicable: set[Allowed] = set()

    def collected(self, nodeids: Iterable[str]) -> None:
        """Note which entries the session's tests make applicable."""
        for nodeid in nodeids:
            self.applicable.update(a for a in self.allowed if a.applies_to(nodeid))

    def judge(self, nodeid: str, reason: str) -> Allowed | None:
        """The entry that allows this skip (and is now used), or None: it must fail."""
        for entry in self.allowed:
            if entry.matches(nodeid, reason):
                self.used.add(entry)
                return entry
        return None

    def stale(self) -> list[Allowed]:
        """Entries that applied to this run and allowed nothing in it."""
        return [a for a in self.allowed if a in self.applicable and a not in self.used]


def failure_text(nodeid: str, reason: str) -> str:
    return (
        f"skipped under CI: {reason}\n"
        f"A test that did not run is a failure in CI. Make {nodeid} run here, or add an "
        f"entry with its reason to tests/{ALLOW_FILE.name} (docs/testing.md)."
    )


def stale_text(entries: Iterable[Allowed]) -> str:
    lines = [f"tests/{ALLOW_FILE.name}: entries that allowed no skip in this run (remove them):"]
    lines += [f"  test={a.test!r} reason={a.reason!r}" for a in entries]
    return "\n".join(lines)
