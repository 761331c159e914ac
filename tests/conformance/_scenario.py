"""The conformance scenario language: YAML files parsed into a typed model.

A scenario describes the inputs both sides get (drivers, their devices, claims,
pods) and a timeline of driver actions with sync points; the runner
(``_runner``) plays it against the kubelet twin and our library and compares
what they compute. ``differences`` declares where they differ on purpose.
See ``docs/conformance-internals.md`` for the language with examples.

Nothing here mirrors a kubelet file; the claim and pod objects built by
:mod:`_objects` are the ``resource.k8s.io/v1`` and ``v1`` shapes the kubelet's
DRA manager (``pkg/kubelet/cm/dra/manager.go``) reads.
"""

from __future__ import annotations

import functools
import pathlib
import re
from collections.abc import Iterator
from typing import Any, Literal

import pydantic
import yaml

SCENARIO_DIR = pathlib.Path(__file__).resolve().parent / "scenarios"

LINES: tuple[str, ...] = ("1.34", "1.35", "1.36", "1.37", "1.38")
"""Kubelet lines by minor version, oldest first (the twin maps them to tags)."""

FEATURES: dict[str, str] = {
    # Deliberate differences of ours (every line).
    "unknown-at-deadline": "Unknown at the lease deadline (kubernetes #140819)",
    "terminated-pods": "health of terminated pods (kubernetes #132978)",
    "rolling-upgrade": "per-endpoint ownership in a rolling upgrade (kubernetes #140818)",
    "no-dropped-notifications": "no dropped notifications (the kubelet's 100-slot channel)",
    "init-containers": "restartable init containers (kubernetes #139940)",
    "lease-outlives-stream": (
        "a stream end keeps the devices' last state until their lease runs out "
        "(the kubelet's clearDriver clears the driver at once)"
    ),
    "message-char-boundary": "message cut at a character boundary",
    "revived-device": "a report reviving an expired device is a change",
    "own-resource-ids": "a resourceID of its own for each device sharing a first CDI ID",
    # Behaviour of newer lines that older lines lack (we follow the newest).
    "sorted-output": "sorted allocatedResourcesStatus (kubelet 1.38)",
    "registration-validation": "driver name and endpoint validation (kubelet 1.38)",
    "null-maps": "null maps in a checkpoint (kubelet 1.38)",
    "device-cap": "16,384 devices per driver (kubelet 1.37)",
    "stale-deletion": "expired unreported entries deleted (kubelet 1.37)",
    "health-negotiation": "health service negotiation, UNIMPLEMENTED stops (kubelet 1.37)",
    "health-message": "health messages (kubelet 1.36)",
    "subrequest-filter": "request filter of sub-requests (kubelet 1.36)",
    "claim-name-fallback": "entries for claims the pod names directly (kubelet 1.36)",
    "health-timeout": "per-device health timeouts (kubelet 1.35)",
}

KINDS = (
    "status",
    "announced",
    "devices",
    "stored",
    "registration",
    "prepare",
    "checkpoint",
    "twin",
    "sidecar",
)
"""What is compared; a declared difference names the kinds it shows up in. ``sidecar``
is the status comparison of our sidecar's writes (``_sidecar``); a ``status``
declaration covers it too."""

Health = Literal["Healthy", "Unhealthy", "Unknown"] | int


class _Model(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)


class Repeat(_Model):
    """A long message: ``text`` repeated ``times`` (e.g. 600 x "é")."""

    text: str
    times: int = pydantic.Field(ge=1, le=100_000)
    prefix: str = ""

    def render(self) -> str:
        return self.prefix + self.text * self.times


class DeviceReport(_Model):
    """One device of a health report (``pool``/``device`` or a ``count`` of them)."""

    pool: str = "pool"
    device: str = ""
    count: int = pydantic.Field(default=0, ge=0, le=50_000)
    """With ``count``: devices ``<device><i>`` for i in ``start`` .. ``start+count-1``."""
    start: int = 0
    health: Health = "Healthy"
    message: str | Repeat = ""
    timeout: int = 0
    """``health_check_timeout_seconds`` (0: the default 30 s)."""

    @pydantic.model_validator(mode="after")
    def _named(self) -> DeviceReport:
        if not self.device:
            raise ValueError("a device report needs `device` (a name, or a prefix with `count`)")
        return self

    def expand(self) -> list[dict[str, Any]]:
        """The FakeDriver's device dicts."""
        message = self.message.render() if isinstance(self.message, Repeat) else self.message
        names = (
            [f"{self.device}{i}" for i in range(self.start, self.start + self.count)]
            if self.count
            else [self.device]
        )
        return [
            {
                "pool": self.pool,
                "device": name,
                "health": self.health,
                "message": message,
                "timeout_seconds": self.timeout,
            }
            for name in names
        ]


IMPLEMENTATIONS: dict[str, str] = {
    "fake": "our FakeDriver (tests/conformance/_drivers.py), in the runner's process",
    "go-helper": "the interop Go driver on the kubeletplugin helper v0.37.2 (health v1, v1alpha1)",
    "go-helper-v0.35": "the interop Go driver on the kubeletplugin helper v0.35.10 (v1alpha1)",
}
"""Driver implementations a scenario can choose (``implementation`` of a driver)."""


class Driver(_Model):
    """A DRA driver (a FakeDriver or the Go helper driver on its own socket) and how it
    registers."""

    name: str
    implementation: Literal["fake", "go-helper", "go-helper-v0.35"] = "fake"
    """Which program serves the driver's sockets (:data:`IMPLEMENTATIONS`). A Go helper
    driver answers with what its helper serves: ``health_versions``, ``dra_versions`` and
    ``services`` are not set for it."""
    health_versions: tuple[Literal["v1", "v1alpha1"], ...] = ("v1", "v1alpha1")
    dra_versions: tuple[Literal["v1", "v1beta1"], ...] = ("v1",)
    services: tuple[str, ...] | None = None
    """What registration advertises (default: from the versions served)."""
    unimplemented: bool = False
    """Every health stream is answered with UNIMPLEMENTED."""
    registered: bool = True
    """Registered on both sides before the timeline starts."""
    prepare_errors: int = pydantic.Field(default=0, ge=0, le=100)
    """Its first this many ``NodePrepareResources`` calls (from either side; each side
    makes one per prepare attempt) answer an error for every claim (FakeDriver only)."""

    @property
    def go_helper(self) -> bool:
        return self.implementation != "fake"

    @pydantic.model_validator(mode="after")
    def _helper_serves(self) -> Driver:
        fixed = {"health_versions", "dra_versions", "services", "prepare_errors"}
        fixed &= self.model_fields_set
        if self.go_helper and fixed:
            raise ValueError(
                f"driver {self.name!r}: {', '.join(sorted(fixed))} cannot be chosen for "
                f"implementation {self.implementation} (its kubeletplugin helper decides "
                "what it serves and advertises)"
            )
        return self


class AllocatedDevice(_Model):
    """One allocation result of a claim and what the driver's prepare returns for it."""

    driver: str
    pool: str = "pool"
    device: str
    request: str = ""
    """The allocation result's request (``req`` or ``req/sub``)."""
    request_names: tuple[str, ...] | None = None
    """``request_names`` of the prepare answer (default: the request, if any)."""
    cdi: tuple[str, ...] = ()
    share_id: str | None = None
    returned: bool = True
    """Whether NodePrepareResources returns this device (the kubelet only knows those)."""

    def answer(self) -> dict[str, Any]:
        names = self.request_names
        if names is None:
            names = (self.request,) if self.request else ()
        out: dict[str, Any] = {
            "pool": self.pool,
            "device": self.device,
            "requests": list(names),
            "cdi_device_ids": list(self.cdi),
        }
        if self.share_id is not None:
            out["share_id"] = self.share_id
        return out


class Claim(_Model):
    """A ResourceClaim: direct, or generated from ``template`` for one pod."""

    name: str
    namespace: str = "default"
    devices: tuple[AllocatedDevice, ...]
    template: str | None = None
    """The ResourceClaimTemplate it was generated from (its owner is the pod using it)."""


class PodClaimRef(_Model):
    """A pod's ``spec.resourceClaims`` entry: a claim by name or through a template."""

    name: str
    claim: str
    """The ResourceClaim object (for a template: the generated claim)."""
    template: str | None = None
    status_name: bool = True
    """For templates: record the generated name in ``status.resourceClaimStatuses``."""


class Container(_Model):
    """A container and its ``resources.claims`` as ``ref`` or ``ref/request[/sub]``."""

    name: str
    claims: tuple[str, ...] = ()
    restartable: bool = False
    """Init containers only: ``restartPolicy: Always`` (a sidecar)."""

    def claim_refs(self) -> list[tuple[str, str]]:
        out = []
        for text in self.claims:
            ref, _, request = text.partition("/")
            out.append((ref, request))
        return out


class Pod(_Model):
    name: str
    namespace: str = "default"
    claims: tuple[PodClaimRef, ...] = ()
    containers: tuple[Container, ...] = (Container(name="main"),)
    init_containers: tuple[Container, ...] = ()
    prepare: bool = True
    """Prepared (PrepareResources) before the timeline starts."""
    prepare_fails: bool = False
    """The prepare before the timeline fails (on both sides unless a difference is
    declared): only then is a failure on both sides the same."""

    @pydantic.model_validator(mode="after")
    def _refs_known(self) -> Pod:
        refs = {c.name for c in self.claims}
        for container in (*self.containers, *self.init_containers):
            for ref, _ in container.claim_refs():
                if ref not in refs:
                    raise ValueError(
                        f"container {container.name!r} uses claim {ref!r}, "
                        f"which is not among the pod's claims {sorted(refs)}"
                    )
        return self


# -- the timeline ----------------------------------------------------------------


class _Step(_Model):
    pass


class Report(_Step):
    driver: str
    endpoint: str = "main"
    devices: tuple[DeviceReport, ...] = ()
    times: int = pydantic.Field(default=1, ge=1, le=1000)
    """Send the report this many times (a flood)."""
    alternate: bool = False
    """With ``times``: flip Healthy/Unhealthy on every send (each one a change)."""


class EndpointRef(_Step):
    driver: str
    endpoint: str = "main"


class EndStream(EndpointRef):
    code: str | None = None
    """A gRPC status code name; ``None`` ends the stream cleanly (EOF)."""


class Restart(EndpointRef):
    new_socket: bool = True
    """Deregister the old socket and register a new one (a new driver pod)."""


class StartEndpoint(EndpointRef):
    """A second endpoint of a driver (the new pod of a rolling upgrade)."""


class Register(_Step):
    """Register a literal endpoint (validation scenarios; nothing serves it)."""

    driver: str
    endpoint: str
    services: tuple[str, ...] = ("v1.DRAPlugin", "v1.DRAResourceHealth")
    refused: bool = False
    """The registration is refused (on both sides unless a difference is declared):
    only then is a refusal on both sides the same."""


class Announced(_Model):
    """The pods each side announces between the previous sync point and this one."""

    ours: tuple[str, ...] = ()
    twin: tuple[str, ...] = ()


class Sync(_Step):
    name: str
    announced: Announced | None = None
    """Where given (the generator's model of both sides), each side's announced pods must
    be exactly these: a miss is kind ``predicted``, which no declaration can cover."""


class Wait(_Step):
    seconds: float = pydantic.Field(gt=0, le=60)


class PodRef(_Step):
    pod: str
    fails: bool = False
    """``prepare`` only: PrepareResources fails (on both sides unless a difference is
    declared): only then is a failure on both sides the same."""


class PauseUpdates(_Step):
    """The kubelet's sync loop is busy until the next sync point: nobody reads the
    manager's notification channel (100 slots; the kubelet drops what does not fit)."""


STEP_KINDS: dict[str, type[_Step]] = {
    "report": Report,
    "silence": EndpointRef,
    "resume": EndpointRef,
    "end_stream": EndStream,
    "unimplemented": EndpointRef,
    "restart": Restart,
    "reregister": EndpointRef,
    "start_endpoint": StartEndpoint,
    "stop_endpoint": EndpointRef,
    "register": Register,
    "deregister": EndpointRef,
    "prepare": PodRef,
    "unprepare": PodRef,
    "sync": Sync,
    "wait": Wait,
    "pause_updates": PauseUpdates,
}
_SHORTHAND = {"sync": "name", "wait": "seconds", "prepare": "pod", "unprepare": "pod"}


class Step(_Model):
    """One timeline entry: ``{<kind>: <arguments>}``."""

    kind: str
    args: pydantic.SerializeAsAny[_Step]


def _parse_step(raw: Any, index: int) -> Step:
    if not isinstance(raw, dict) or len(raw) != 1:
        raise ValueError(
            f"timeline[{index}] must be a mapping with exactly one action, got {raw!r}"
        )
    ((kind, args),) = raw.items()
    model = STEP_KINDS.get(kind)
    if model is None:
        raise ValueError(
            f"timeline[{index}]: unknown action {kind!r} (one of {', '.join(STEP_KINDS)})"
        )
    if kind in _SHORTHAND and not isinstance(args, dict):
        args = {_SHORTHAND[kind]: args}
    elif isinstance(args, str):
        args = {"driver": args}
    try:
        return Step(kind=kind, args=model.model_validate(args or {}))
    except pydantic.ValidationError as exc:
        raise ValueError(f"timeline[{index}] ({kind}): {_short(exc)}") from None


def _short(exc: pydantic.ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in exc.errors()
    )


RULE_NAMES = ("message-cut-at-character", "message-cut-bytes", "entry-from-our-view")
"""Rules a declaration can name for a side's value (``tests/conformance/_rules.py``)."""

ALLOW_BLANKET = False
"""Whether a declaration may leave out its scope (``subject`` and ``field``): only to
measure what the old, blanket declarations masked (``_suite --allow-blanket``)."""

AT_SPECIAL = ("setup", "end")
"""Where a declaration can show besides the sync points: before the timeline and after
it (the ``cache show`` check); ``step <i>`` names one timeline step (a registration)."""


class Difference(_Model):
    """A deliberate difference, scoped: which feature, on which lines, and exactly where it
    shows: sync points (``at``), subjects, fields and, where fixed, each side's value.

    A comparison is covered only if its kind, sync point, subject and field are all named
    (and its values are the declared ones where ``ours``/``twin`` are given); every other
    comparison still compares. ``docs/conformance.md`` lists the subjects and fields.
    """

    feature: str
    lines: tuple[str, ...] = LINES
    kinds: tuple[str, ...]
    at: tuple[str, ...] = ()
    """Sync points (or ``setup``, ``end``, ``step <i>``) where it shows."""
    subject: tuple[str, ...] = ()
    """What differs: ``pod <pod> <containerStatuses|initContainerStatuses>[<container>]``
    (status), ``pod <pod>`` (announced, prepare), ``<driver>/<pool>/<device>`` (devices,
    checkpoint), ``register <driver> at <endpoint>``, ``twin``, ``stored``."""
    field: tuple[str, ...] = ()
    """Which part of the subject differs, e.g. ``entry claim:r0`` or ``message``."""
    ours: Any = None
    """Our value, where it is fixed (compared exactly, ``null`` included; leave it out
    where it is not fixed)."""
    twin: Any = None
    """The kubelet's value, where it is fixed."""
    ours_rule: str = ""
    """Where our value depends on the comparison: the rule that computes it (one of
    :data:`RULE_NAMES`, ``tests/conformance/_rules.py``) instead of ``ours``."""
    twin_rule: str = ""
    """The same for the kubelet's value."""
    note: str = ""

    @pydantic.field_validator("feature")
    @classmethod
    def _feature(cls, value: str) -> str:
        if value not in FEATURES:
            raise ValueError(f"unknown feature {value!r} (one of {', '.join(FEATURES)})")
        return value

    @pydantic.field_validator("lines", mode="before")
    @classmethod
    def _lines(cls, value: Any) -> Any:
        return _expand_lines(value)

    @pydantic.field_validator("at", "subject", "field", mode="before")
    @classmethod
    def _listed(cls, value: Any) -> Any:
        return (value,) if isinstance(value, str) else value

    @pydantic.field_validator("subject", mode="after")
    @classmethod
    def _ranges(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(name for item in value for name in _expand_range(item))

    @functools.cached_property
    def subjects(self) -> frozenset[str]:
        """``subject`` as a set (a range can name thousands of devices)."""
        return frozenset(self.subject)

    @pydantic.field_validator("kinds")
    @classmethod
    def _kinds(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for kind in value:
            if kind not in KINDS:
                raise ValueError(f"unknown kind {kind!r} (one of {', '.join(KINDS)})")
        return value

    @pydantic.model_validator(mode="after")
    def _both_sides(self) -> Difference:
        if ALLOW_BLANKET or self.blanket:
            return self  # _scoped says what is missing
        for side in ("ours", "twin"):
            rule = getattr(self, f"{side}_rule")
            if rule and rule not in RULE_NAMES:
                raise ValueError(f"unknown {side}_rule {rule!r} (one of {', '.join(RULE_NAMES)})")
            if rule and side in self.model_fields_set:
                raise ValueError(f"difference {self.feature}: give {side} or {side}_rule, not both")
            if not rule and side not in self.model_fields_set:
                raise ValueError(
                    f"difference {self.feature}: a declaration fixes both sides' values; give "
                    f"{side} (null included) or {side}_rule"
                )
        return self

    @pydantic.model_validator(mode="after")
    def _scoped(self) -> Difference:
        if not self.blanket or ALLOW_BLANKET:
            return self
        left = [name for name in ("at", "subject", "field") if not getattr(self, name)]
        raise ValueError(
            f"difference {self.feature}: a declaration names where it shows; give "
            f"{', '.join(left)} (see 'Declared differences' in docs/conformance.md)"
        )

    @property
    def blanket(self) -> bool:
        """Declared the old way: a kind of comparison, at no subject and field."""
        return not (self.at and self.subject and self.field)

    @property
    def fixed(self) -> dict[str, Any]:
        """The sides whose value the declaration fixes."""
        return {k: getattr(self, k) for k in ("ours", "twin") if k in self.model_fields_set}

    @property
    def rules(self) -> dict[str, str]:
        """The sides whose value a rule computes, with the rule's name."""
        return {
            k: getattr(self, f"{k}_rule") for k in ("ours", "twin") if getattr(self, f"{k}_rule")
        }

    def where(self) -> str:
        """One line naming the scope (for reports)."""
        parts = [f"{self.feature} ({', '.join(self.kinds)})"]
        if self.at:
            parts.append("at " + ", ".join(self.at))
        if self.subject:
            shown = (
                self.subject
                if len(self.subject) <= 6
                else (*self.subject[:3], f"... ({len(self.subject)} subjects)", self.subject[-1])
            )
            parts.append("on " + ", ".join(shown))
        if self.field:
            parts.append("field " + ", ".join(self.field))
        parts += [f"{k} = {_short_value(v)}" for k, v in self.fixed.items()]
        parts += [f"{k} by rule {v}" for k, v in self.rules.items()]
        return " ".join(parts)


def _short_value(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def at_matches(declared: str, at: str) -> bool:
    """Whether an observation's place (``sync s1``, ``step 3 (register)``, ``end``) is the
    declared one (``s1``, ``step 3``, ``end``)."""
    if at.startswith("sync "):
        at = at[len("sync ") :]
    return declared == at or at.startswith(declared + " (")


_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")


def _expand_range(item: str) -> list[str]:
    """``dev-{16384..19999}``: one subject per number, both ends included (the devices
    past the cap, named one by one without listing 3,616 of them)."""
    match = _RANGE.search(item)
    if match is None:
        return [item]
    low, high = int(match.group(1)), int(match.group(2))
    if high < low or high - low > 100_000:
        raise ValueError(f"bad range {match.group(0)!r} in {item!r}")
    return [item[: match.start()] + str(n) + item[match.end() :] for n in range(low, high + 1)]


def _expand_lines(value: Any) -> Any:
    """``all``, a list of lines, or ``"<1.38"`` / ``">=1.37"`` ranges."""
    if value in (None, "all"):
        return LINES
    if isinstance(value, str):
        value = [value]
    out: list[str] = []
    for raw in value:
        item = str(raw)
        for op in ("<=", ">=", "<", ">"):
            if item.startswith(op):
                bound = _minor(item[len(op) :])
                out += [line for line in LINES if _compare(_minor(line), op, bound)]
                break
        else:
            if item not in LINES:
                raise ValueError(f"unknown kubelet line {item!r} (one of {', '.join(LINES)})")
            out.append(item)
    return tuple(line for line in LINES if line in out)


def _minor(line: str) -> int:
    try:
        return int(line.split(".")[1])
    except (IndexError, ValueError):
        raise ValueError(f"unknown kubelet line {line!r}") from None


def _compare(a: int, op: str, b: int) -> bool:
    return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


class Scenario(_Model):
    name: str
    description: str
    upstream: str = ""
    """The upstream test (reference section 6) or change this scenario covers."""
    lines: tuple[str, ...] = LINES
    node: str = "node-1"
    drivers: tuple[Driver, ...]
    claims: tuple[Claim, ...] = ()
    pods: tuple[Pod, ...] = ()
    checkpoint: str | None = None
    """Text of a ``dra_health_state`` the twin starts from."""
    compare_stored: bool = False
    """Also compare which devices each side stores (our store through ``cache show
    --state-dir``, the twin's checkpoint) at every sync point."""
    compare_prepared: bool = False
    """Compare the devices each side recorded per claim after every prepare both made on
    every line of the scenario (by default only on the runner's ``PREPARED_LINES``)."""
    timeline: tuple[Step, ...]
    differences: tuple[Difference, ...] = ()
    generated: bool = False

    @pydantic.field_validator("lines", mode="before")
    @classmethod
    def _lines(cls, value: Any) -> Any:
        return _expand_lines(value)

    @pydantic.field_validator("timeline", mode="before")
    @classmethod
    def _timeline(cls, value: Any) -> Any:
        if not isinstance(value, list | tuple):
            raise ValueError("timeline must be a list of actions")
        return tuple(v if isinstance(v, Step) else _parse_step(v, i) for i, v in enumerate(value))

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> Scenario:
        drivers = {d.name for d in self.drivers}
        claims = {c.name for c in self.claims}
        pods = {p.name for p in self.pods}
        for claim in self.claims:
            for dev in claim.devices:
                if dev.driver not in drivers:
                    raise ValueError(f"claim {claim.name!r}: unknown driver {dev.driver!r}")
        for pod in self.pods:
            for ref in pod.claims:
                if ref.claim not in claims:
                    raise ValueError(f"pod {pod.name!r}: unknown claim {ref.claim!r}")
        syncs: list[str] = []
        for i, step in enumerate(self.timeline):
            args = step.args
            if isinstance(args, Sync):
                if args.name in syncs:
                    raise ValueError(f"timeline[{i}]: sync point {args.name!r} is used twice")
                syncs.append(args.name)
            if isinstance(args, Report | EndpointRef) and args.driver not in drivers:
                raise ValueError(f"timeline[{i}] ({step.kind}): unknown driver {args.driver!r}")
            if isinstance(args, PodRef) and args.pod not in pods:
                raise ValueError(f"timeline[{i}] ({step.kind}): unknown pod {args.pod!r}")
        if not syncs:
            raise ValueError("the timeline has no sync point: nothing would be compared")
        _go_helper_can(self)
        for diff in self.differences:
            for name in diff.at:
                index = name.removeprefix("step ")
                known = name in syncs or name in AT_SPECIAL
                if not known and index.isdigit() and int(index) < len(self.timeline):
                    known = True
                if not known:
                    raise ValueError(f"difference {diff.feature}: unknown sync point {name!r}")
        return self

    def uses_go_helper(self) -> bool:
        """Whether a driver of this scenario is the Go helper driver (which needs the
        claims in a kube-apiserver)."""
        return any(d.go_helper for d in self.drivers)

    def sync_names(self) -> list[str]:
        return [s.args.name for s in self.timeline if isinstance(s.args, Sync)]

    def pod(self, name: str) -> Pod:
        return next(p for p in self.pods if p.name == name)

    def claim(self, name: str) -> Claim:
        return next(c for c in self.claims if c.name == name)


def _go_helper_can(scenario: Scenario) -> None:
    """Refuse what the Go helper driver cannot do (its control file, ``driver/common``).

    Its NodePrepareResources answers every claim with one scripted device list, it has
    no share IDs, it sends one report per control-file change, and a health stream it
    ends always ends with a gRPC status (never a clean EOF).
    """
    helper = {d.name for d in scenario.drivers if d.go_helper}
    if not helper:
        return
    for name in sorted(helper):
        answers = {
            claim.name: [d.answer() for d in claim.devices if d.driver == name and d.returned]
            for claim in scenario.claims
            if any(d.driver == name for d in claim.devices)
        }
        if any(not a for a in answers.values()):
            raise ValueError(
                f"driver {name!r} (Go helper) must return at least one device per claim "
                "(with an empty list it answers with its health devices instead)"
            )
        distinct = {repr(a) for a in answers.values()}
        if len(distinct) > 1:
            raise ValueError(
                f"driver {name!r} (Go helper) answers every claim with one device list, but "
                f"claims {sorted(answers)} are allocated different devices of it: give each "
                "claim its own driver"
            )
        for claim in scenario.claims:
            for dev in claim.devices:
                if dev.driver == name and dev.share_id is not None:
                    raise ValueError(
                        f"claim {claim.name!r}: share_id is not supported by the Go helper "
                        f"driver {name!r}"
                    )
    for i, step in enumerate(scenario.timeline):
        args = step.args
        where = f"timeline[{i}] ({step.kind})"
        if isinstance(args, Report) and args.driver in helper:
            if args.times != 1:
                raise ValueError(
                    f"{where}: the Go helper driver sends one report per control-file change; "
                    "times/alternate need the FakeDriver"
                )
            for report in args.devices:
                if isinstance(report.health, int) and report.health not in (0, 1, 2):
                    raise ValueError(
                        f"{where}: health {report.health} cannot be scripted for the Go helper "
                        "driver (its control file knows HEALTHY, UNHEALTHY and UNKNOWN)"
                    )
        if isinstance(args, EndStream) and args.driver in helper:
            if args.code is None or args.code.upper() == "OK":
                raise ValueError(
                    f"{where}: the Go helper driver cannot end a stream cleanly (EOF); "
                    "give a gRPC code such as UNAVAILABLE"
                )
            if args.code.upper() not in GO_HELPER_CODES:
                raise ValueError(
                    f"{where}: code {args.code!r} is not one the Go helper driver knows "
                    f"(one of {', '.join(GO_HELPER_CODES)})"
                )


GO_HELPER_CODES = (
    "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
    "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE",
)  # fmt: skip
"""The gRPC codes of the Go helper driver's ``stream_error`` (``driver/common/control.go``)."""


class ScenarioError(Exception):
    """A scenario file that does not parse or validate; the message names the file."""


def load(path: pathlib.Path) -> Scenario:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path.name}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ScenarioError(f"{path.name}: a scenario is a YAML mapping")
    raw.setdefault("name", path.stem)
    # Declarations kept in one table (the matrix module) rather than in each file.
    from tests.conformance import _matrix

    raw["differences"] = [*(raw.get("differences") or ()), *_matrix.declared(path.stem)]
    try:
        scenario = Scenario.model_validate(raw)
    except pydantic.ValidationError as exc:
        raise ScenarioError(f"{path.name}: {_short(exc)}") from None
    if scenario.name != path.stem:
        raise ScenarioError(f"{path.name}: name {scenario.name!r} differs from the file name")
    return scenario


def load_all(directory: pathlib.Path = SCENARIO_DIR) -> list[Scenario]:
    return [load(path) for path in sorted(directory.glob("*.yaml"))]


def iter_devices(scenario: Scenario) -> Iterator[tuple[str, str, str]]:
    """Every (driver, pool, device) the scenario allocates or reports, once."""
    seen: set[tuple[str, str, str]] = set()
    for claim in scenario.claims:
        for dev in claim.devices:
            key = (dev.driver, dev.pool, dev.device)
            if key not in seen:
                seen.add(key)
                yield key
    for step in scenario.timeline:
        if isinstance(step.args, Report):
            for report in step.args.devices:
                for d in report.expand():
                    key = (step.args.driver, d["pool"], d["device"])
                    if key not in seen:
                        seen.add(key)
                        yield key
