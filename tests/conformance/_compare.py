"""What the runner compares, and how a difference is shown and explained.

An :class:`Observed` difference is one comparison the two sides disagree on,
named by kind, place (sync point), subject and field: one entry, resource,
health or message of a container's ``allocatedResourcesStatus``, whether one
pod was announced since the previous sync point, one device's health or
message as each cache reads it, the outcome of a registration or prepare, a
row of the checkpoint as our CLI reads it, or the twin failing. A scenario's
declared differences must cover every observed one (:func:`classify`), and
every declaration is checked per comparison (:class:`Tally`): each comparison
in its scope (sync point, subject, field) must differ with the declared values,
and each sync point, subject and field it names must show that difference at
least once. So a declaration over 16,000 devices fails when one of them reads
the same on both sides, and a difference no declaration predicts fails too.
The run summary counts, per declaration, the comparisons in scope, matched
(the sides agreed) and differed.

Order: kubelet 1.38 sorts entries by name and resources by resourceID, so
from 1.38 on lists are compared exactly, order included. Earlier kubelets
build the entry list by iterating a Go map, whose order is random by design;
there entries are compared by name, and each entry's resources (an ordered
append over the driver's prepare answer) exactly.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tests.conformance import _rules
from tests.conformance import _scenario as sc

FIELDS = ("containerStatuses", "initContainerStatuses")
DEFAULT_TIMEOUT_NS = 30_000_000_000


@dataclasses.dataclass(frozen=True)
class Observed:
    kind: str
    at: str
    subject: str
    ours: Any
    twin: Any
    field: str = ""
    detail: str = ""
    """What the sides said beyond the compared values (error texts), for the report."""

    def render(self) -> str:
        field = f" {self.field}" if self.field else ""
        head = f"[{self.kind}] at {self.at}: {self.subject}{field}"
        if self.detail:
            head += f"\n    ({_short(self.detail)})"
        if self.kind in ("status", "sidecar") and isinstance(self.ours, list | dict):
            ours_lines = json.dumps(self.ours, indent=1, ensure_ascii=False).splitlines()
            twin_lines = json.dumps(self.twin, indent=1, ensure_ascii=False).splitlines()
            diff = difflib.unified_diff(
                twin_lines, ours_lines, "twin (kubelet)", "ours", lineterm="", n=2
            )
            return head + "\n    " + "\n    ".join(diff)
        twin, ours = _short(self.twin), _short(self.ours)
        if isinstance(self.twin, str) and isinstance(self.ours, str):
            twin, ours = _around_difference(self.twin, self.ours)
        if self.kind == "predicted":
            return f"{head}\n    predicted: {twin}\n    announced: {ours}"
        return f"{head}\n    twin (kubelet): {twin}\n    ours:           {ours}"


def _around_difference(a: str, b: str, limit: int = 600) -> tuple[str, str]:
    """Two long texts shown from a little before where they first differ (a message cut
    at 1 kB differs in its last bytes)."""
    if max(len(a), len(b)) <= limit:
        return _short(a), _short(b)
    same = next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )
    start = max(0, same - 40)

    def part(text: str) -> str:
        return f"({len(text)} chars, from char {start}) " + _short(text[start:], 200)

    return part(a), part(b)


def _short(value: Any, limit: int = 600) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


# -- statuses ------------------------------------------------------------------


def entries(status: Mapping[str, Any] | None, field: str) -> dict[str, list[Any]]:
    """Container name -> its ``allocatedResourcesStatus`` (missing = empty)."""
    out: dict[str, list[Any]] = {}
    for cs in (status or {}).get(field) or ():
        out[str(cs.get("name"))] = [_entry(e) for e in cs.get("allocatedResourcesStatus") or ()]
    return out


def _entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "name": entry.get("name"),
        "resources": [
            {k: r[k] for k in ("resourceID", "health", "message") if r.get(k) is not None}
            for r in entry.get("resources") or ()
        ],
    }


def compare_status(
    at: str,
    pod: str,
    ours: Mapping[str, Any],
    twin: Mapping[str, Any],
    *,
    ordered: bool,
    tally: Tally | None = None,
    kind: str = "status",
) -> list[Observed]:
    """Every container's entries, each one compared on its own (``kind``: ``sidecar``
    for the sidecar's writes read back from its API stand-in).

    Fields: ``entries order`` (from 1.38: the entry names in order), ``entry <name>``
    (present on one side only: the resources, or null), ``entry <name> order`` (the same
    resources in another order: the resourceIDs), ``entry <name> resource <id>`` (present
    on one side only) and ``entry <name> resource <id> health|message``.
    """
    found: list[Observed] = []
    for kind_field in FIELDS:
        mine, theirs = entries(ours, kind_field), entries(twin, kind_field)
        for container in sorted(set(mine) | set(theirs)):
            subject = f"pod {pod} {kind_field}[{container}]"
            a, b = mine.get(container, []), theirs.get(container, [])

            def add(field: str, x: Any, y: Any, subject: str = subject) -> None:
                if tally is not None:
                    tally.compare(kind, at, subject, field, x, y)
                if x != y:
                    found.append(Observed(kind, at, subject, x, y, field))

            if ordered:
                add("entries order", [e["name"] for e in a], [e["name"] for e in b])
            by_a = {str(e["name"]): e["resources"] for e in a}
            by_b = {str(e["name"]): e["resources"] for e in b}
            for name in sorted(set(by_a) | set(by_b)):
                ra, rb = by_a.get(name), by_b.get(name)
                if ra is None or rb is None:
                    add(f"entry {name}", ra, rb)
                    continue
                _compare_resources(add, f"entry {name}", ra, rb)
    return found


def _compare_resources(add: Any, prefix: str, a: list[Any], b: list[Any]) -> None:
    ids_a = [str(r.get("resourceID")) for r in a]
    ids_b = [str(r.get("resourceID")) for r in b]
    if len(set(ids_a)) != len(ids_a) or len(set(ids_b)) != len(ids_b):
        add(prefix, a, b)  # duplicate IDs: no per-resource reading
        return
    if sorted(ids_a) == sorted(ids_b) and len(ids_a) > 1:
        add(f"{prefix} order", ids_a, ids_b)
    res_a = {str(r.get("resourceID")): r for r in a}
    res_b = {str(r.get("resourceID")): r for r in b}
    for rid in sorted(set(res_a) | set(res_b)):
        x, y = res_a.get(rid), res_b.get(rid)
        if x is None or y is None:
            add(f"{prefix} resource {rid}", x, y)
            continue
        for key in ("health", "message"):
            add(f"{prefix} resource {rid} {key}", x.get(key, ""), y.get(key, ""))


def compare_announced(
    at: str,
    ours: set[str],
    twin: set[str],
    pods: Iterable[str],
    *,
    tally: Tally | None = None,
) -> list[Observed]:
    """Per pod: announced since the previous sync point or not (``pod <name>``, field
    ``announced``, values true/false)."""
    found = []
    for pod in sorted(set(pods) | ours | twin):
        subject = f"pod {pod}"
        if tally is not None:
            tally.compare("announced", at, subject, "announced", pod in ours, pod in twin)
        if (pod in ours) != (pod in twin):
            found.append(Observed("announced", at, subject, pod in ours, pod in twin, "announced"))
    return found


def compare_predicted(
    at: str,
    ours: set[str],
    twin: set[str],
    predicted: sc.Announced,
    *,
    tally: Tally | None = None,
) -> list[Observed]:
    """Each side's announced pods against the prediction (a ``Sync.announced``): kind
    ``predicted``, subject ``announced by ours|twin``; ``ours`` holds what that side
    announced and ``twin`` what the model predicted."""
    found = []
    for side, actual, want in (("ours", ours, predicted.ours), ("twin", twin, predicted.twin)):
        subject = f"announced by {side}"
        if tally is not None:
            tally.compare("predicted", at, subject, "announced", sorted(actual), sorted(want))
        if actual != set(want):
            found.append(
                Observed("predicted", at, subject, sorted(actual), sorted(want), "announced")
            )
    return found


# -- the twin's cache as its checkpoint reads ----------------------------------


#: Why a registration was refused, read off the error text: (rule, words that name it).
#: The kubelet's texts (``dra_plugin_manager.go``: ``validateDriverName``,
#: ``validateEndpoint``, ``RegisterPlugin``, the version negotiation) and ours
#: (``plugin/validation.py``, ``plugin/getinfo.py``, the suite's duplicate check) share
#: these words; the first rule whose words all appear names the refusal.
REFUSAL_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("driver name", ("driver name",)),
    ("endpoint empty", ("empty dra plugin endpoint",)),
    ("endpoint not absolute", ("endpoint", "absolute path")),
    ("endpoint too long", ("endpoint", "longer than")),
    ("endpoint not plain", ("endpoint", "plain path")),
    ("endpoint already registered", ("already registered",)),
    ("no supported version", ("supported",)),
)


def refusal_rule(text: str) -> str:
    """The rule a registration refusal names, or ``other: <text>`` (never equal to the
    other side's unless the texts are): both sides refusing is the same only for one
    reason."""
    lowered = text.lower()
    for rule, words in REFUSAL_RULES:
        if all(word in lowered for word in words):
            return rule
    return f"other: {text}"


def twin_lease(entry: Mapping[str, Any]) -> float:
    """A checkpoint entry's lease as ``cache show`` prints it (the default where unset)."""
    return int(entry.get("HealthCheckTimeout") or DEFAULT_TIMEOUT_NS) / 1e9


def compare_devices(
    at: str,
    ours: Mapping[tuple[str, str, str], tuple[str, str]],
    twin: Mapping[tuple[str, str, str], Sequence[str]],
    *,
    limit: int = 20,
    tally: Tally | None = None,
) -> list[Observed]:
    """Per device (``<driver>/<pool>/<device>``): fields ``health`` and ``message``, ours
    as our cache reads it and the twin's as the kubelet's own ``getHealthInfo`` returned it
    at the same sync point (the twin's ``sync`` reply)."""
    found = Findings(tally, limit)
    for key, mine in ours.items():
        theirs = tuple(twin.get(key) or ("Unknown", ""))
        subject = "/".join(key)
        for i, field in enumerate(("health", "message")):
            if tally is not None:
                tally.compare("devices", at, subject, field, mine[i], theirs[i])
            if mine[i] != theirs[i]:
                found.add(Observed("devices", at, subject, mine[i], theirs[i], field))
    return found.items


# -- the checkpoint as our CLI reads it ----------------------------------------


def checkpoint_rows(state: Any) -> list[dict[str, Any]]:
    """The twin's checkpoint as ``cache show`` should list it (stored values)."""
    rows = []
    if isinstance(state, dict):
        for driver, drv in state.items():
            for entry in ((drv or {}).get("Devices") or {}).values():
                rows.append(
                    {
                        "driver": driver,
                        "pool": entry.get("PoolName", ""),
                        "device": entry.get("DeviceName", ""),
                        "stored": _stored(entry.get("Health")),
                        "message": entry.get("Message") or "",
                        "lease": f"{twin_lease(entry):g}s",
                    }
                )
    return sorted(rows, key=row_key)


def _stored(value: Any) -> str:
    return str(value) if value in ("Healthy", "Unhealthy", "Unknown") else "Unknown"


def row_key(row: Mapping[str, Any]) -> tuple[str, str, str]:
    return (str(row["driver"]), str(row["pool"]), str(row["device"]))


def compare_cli(
    cli_rows: Sequence[Mapping[str, Any]],
    state: Any,
    *,
    limit: int = 20,
    tally: Tally | None = None,
) -> list[Observed]:
    """Per device row of ``cache show`` (subject ``<driver>/<pool>/<device>``, field
    ``cache show``: the row, or null where one side has none)."""
    mine = sorted(
        (
            {k: row[k] for k in ("driver", "pool", "device", "stored", "message", "lease")}
            for row in cli_rows
        ),
        key=row_key,
    )
    theirs = checkpoint_rows(state)
    a = {row_key(r): r for r in mine}
    b = {row_key(r): r for r in theirs}
    found = Findings(tally, limit)
    for key in sorted(set(a) | set(b)):
        subject = "/".join(key)
        if tally is not None:
            tally.compare("checkpoint", "end", subject, "cache show", a.get(key), b.get(key))
        if a.get(key) != b.get(key):
            found.add(Observed("checkpoint", "end", subject, a.get(key), b.get(key), "cache show"))
    return found.items


# -- explaining ------------------------------------------------------------------


@dataclasses.dataclass
class Verdict:
    unexplained: list[Observed]
    missing: list[sc.Difference]
    seen: list[sc.Difference]
    earlier: list[Observed] = dataclasses.field(default_factory=list)
    """Undeclared differences of attempts that then failed on timing (they fail the run)."""
    why: list[str] = dataclasses.field(default_factory=list)
    """For each of ``missing``: what of its prediction did not come true."""

    @property
    def ok(self) -> bool:
        return not self.unexplained and not self.missing and not self.earlier


def covers(diff: sc.Difference, obs: Observed, expected: Mapping[str, Any] | None = None) -> bool:
    """Whether ``diff`` declares ``obs``: its kind, place, subject, field and both values
    (``expected``: each side's value as the declaration gives it for this comparison, its
    rules computed; by default its fixed values)."""
    if not in_scope(diff, obs.kind, obs.at, obs.subject, obs.field):
        return False
    if diff.blanket:
        return True  # only with sc.ALLOW_BLANKET, to measure the old declarations
    values = diff.fixed if expected is None else expected
    return all(getattr(obs, side) == value for side, value in values.items())


def in_place(diff: sc.Difference, kind: str, at: str) -> bool:
    """Whether a declaration names this kind of comparison at this place (one of kind
    ``status`` names the sidecar's status comparisons too: both are our pipeline)."""
    named = kind in diff.kinds or (kind == "sidecar" and "status" in diff.kinds)
    return named and (not diff.at or any(sc.at_matches(a, at) for a in diff.at))


def names_subject(diff: sc.Difference, subject: str, field: str) -> bool:
    """Whether a declaration names this subject and field (a blanket one names all)."""
    return diff.blanket or (subject in diff.subjects and field in diff.field)


def in_scope(diff: sc.Difference, kind: str, at: str, subject: str, field: str) -> bool:
    """Whether a comparison lies in the declaration's scope (what it could mask)."""
    return in_place(diff, kind, at) and names_subject(diff, subject, field)


@dataclasses.dataclass
class Count:
    """One declaration's comparisons in a run: in its scope, of which ``matched`` (the
    sides agreed: the predicted difference did not show), ``differed`` (with the declared
    values) and ``otherwise`` (with other values: undeclared, unless another declaration
    has them); and where the declared difference showed."""

    in_scope: int = 0
    matched: int = 0
    differed: int = 0
    otherwise: int = 0
    at: set[str] = dataclasses.field(default_factory=set)
    subjects: set[str] = dataclasses.field(default_factory=set)
    fields: set[str] = dataclasses.field(default_factory=set)
    first_matched: str = ""
    """The first comparison in scope where the sides agreed, for the report."""

    def failures(self, diff: sc.Difference) -> list[str]:
        """What of the declaration did not come true (nothing: it holds)."""
        if diff.blanket:
            return [] if self.differed or self.otherwise else ["no difference in its scope"]
        out = []
        if not self.differed:
            out.append("no comparison in its scope differed with its values")
        if self.matched:
            out.append(
                f"{self.matched} comparisons in its scope agreed (first: {self.first_matched})"
            )
        missing_at = [a for a in diff.at if not any(sc.at_matches(a, seen) for seen in self.at)]
        missing_subjects = sorted(diff.subjects - self.subjects)
        missing_fields = [f for f in diff.field if f not in self.fields]
        for what, items in (
            ("sync points", missing_at),
            ("subjects", missing_subjects),
            ("fields", missing_fields),
        ):
            if items and self.differed:
                shown = ", ".join(items[:5]) + (f", ... ({len(items)})" if len(items) > 5 else "")
                out.append(f"not seen at {what} {shown}")
        return out

    def render(self) -> str:
        return f"{self.in_scope} in scope, {self.matched} matched, {self.differed} differed" + (
            f", {self.otherwise} otherwise" if self.otherwise else ""
        )


class Tally:
    """Counts every comparison a run makes and checks every declaration of the run's
    line per comparison (:class:`Count`): each comparison in a declaration's scope must
    differ with its values (fixed, or computed by its rules from the comparison)."""

    def __init__(
        self, declared: Sequence[sc.Difference], scenario: sc.Scenario | None = None
    ) -> None:
        self.declared = list(declared)
        self.scenario = scenario
        self.total = 0
        self.by_kind: dict[str, int] = {}
        self.counts = [Count() for _ in self.declared]
        self.views: dict[str, _rules.DeviceView] = {}
        """Sync point -> our cache's view of every device (for ``entry-from-our-view``)."""
        # (kind, place) -> the declarations naming it. A big driver's sync point compares
        # ~38,000 device fields against ~40 declarations: matching the place once per
        # sync point instead of once per comparison took a 16,384-device run's tally from
        # most of its sync time (3 s of 4 under load, so past its 30 s leases) to a
        # set lookup per comparison.
        self._by_place: dict[tuple[str, str], tuple[int, ...]] = {}

    @property
    def masked(self) -> list[int]:
        """Per declaration: the comparisons in its scope."""
        return [c.in_scope for c in self.counts]

    def compare(self, kind: str, at: str, subject: str, field: str, ours: Any, twin: Any) -> None:
        """One comparison and the values each side gave."""
        self.total += 1
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
        for i in self._named(kind, at):
            diff = self.declared[i]
            if not names_subject(diff, subject, field):
                continue
            count = self.counts[i]
            count.in_scope += 1
            if ours == twin:
                count.matched += 1
                if not count.first_matched:
                    count.first_matched = f"at {at}: {subject} {field}"
            elif diff.blanket or self._as_declared(i, kind, at, subject, field, ours, twin):
                count.differed += 1
                count.at.add(at)
                count.subjects.add(subject)
                count.fields.add(field)
            else:
                count.otherwise += 1

    def expected(self, i: int, kind: str, at: str, subject: str, field: str) -> dict[str, Any]:
        """Both sides' values as declaration ``i`` gives them for this comparison."""
        diff = self.declared[i]
        values = dict(diff.fixed)
        if diff.rules:
            if self.scenario is None:
                raise ValueError(f"{diff.where()}: a rule needs the scenario")
            comparison = _rules.Comparison(
                self.scenario, kind, at, subject, field, self.views.get(at, {})
            )
            for side, rule in diff.rules.items():
                values[side] = _rules.RULES[rule](comparison)
        return values

    def _as_declared(
        self, i: int, kind: str, at: str, subject: str, field: str, ours: Any, twin: Any
    ) -> bool:
        want = self.expected(i, kind, at, subject, field)
        return want.get("ours") == ours and want.get("twin") == twin

    def covering(self, obs: Observed) -> frozenset[int]:
        """The declarations (by index) that declare ``obs``."""
        return frozenset(
            i
            for i in self._named(obs.kind, obs.at)
            if in_scope(self.declared[i], obs.kind, obs.at, obs.subject, obs.field)
            and (
                self.declared[i].blanket
                or self._as_declared(
                    i, obs.kind, obs.at, obs.subject, obs.field, obs.ours, obs.twin
                )
            )
        )

    def _named(self, kind: str, at: str) -> tuple[int, ...]:
        found = self._by_place.get((kind, at))
        if found is None:
            found = tuple(i for i, d in enumerate(self.declared) if in_place(d, kind, at))
            self._by_place[(kind, at)] = found
        return found


class Findings:
    """The differences one comparison pass keeps for the report: at most ``limit``
    undeclared ones (a report names a few), and of the declared ones, one for each
    declaration it is the first to show (the :class:`Tally` counts every one of them).
    A big driver differs on thousands of devices by design; kept in order up to a limit,
    those crowded out every declaration whose subjects came later."""

    def __init__(self, tally: Tally | None, limit: int) -> None:
        self.items: list[Observed] = []
        self._tally = tally
        self._limit = limit
        self._undeclared = 0
        self._shown: set[int] = set()

    def add(self, obs: Observed) -> None:
        which = self._tally.covering(obs) if self._tally is not None else frozenset()
        if which:
            if not which <= self._shown:
                self.items.append(obs)
                self._shown |= which
        elif self._undeclared < self._limit:
            self.items.append(obs)
            self._undeclared += 1


def declared_on(scenario: sc.Scenario, line: str) -> list[sc.Difference]:
    return [d for d in scenario.differences if line in d.lines]


def classify(
    scenario: sc.Scenario,
    line: str,
    observed: Iterable[Observed],
    earlier: Iterable[Observed] = (),
    tally: Tally | None = None,
) -> Verdict:
    """The run's verdict: every observed difference declared (its values included), every
    declaration holding per comparison (``tally``: the run's; none: nothing compared)."""
    if tally is None:
        tally = Tally(declared_on(scenario, line), scenario)
    observed = list(observed)
    unexplained = [o for o in observed if not tally.covering(o)]
    seen, missing, why = [], [], []
    for diff, count in zip(tally.declared, tally.counts, strict=True):
        failed = count.failures(diff)
        if failed:
            missing.append(diff)
            why.append(f"{count.render()}: " + "; ".join(failed))
        else:
            seen.append(diff)
    return Verdict(unexplained, missing, seen, list(earlier), why)
