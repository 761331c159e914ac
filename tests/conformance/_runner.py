"""Play a scenario against the kubelet twin and our library and compare them.

One :class:`Run` per (scenario, kubelet line): its own directory, drivers,
twin process and ``DRAHealthManager``. Both sides register the same endpoints,
prepare the same pods through the same driver sockets and stream from the
same health services. After each driver action the run *settles*: it waits a
minimum of :data:`SETTLE` seconds, then polls until our stream counted the
reports and the twin's checkpoint is stable, with a deadline. Before a sync
point it keeps :data:`DEADLINE_MARGIN` seconds away from every lease deadline
it caused, so wall-clock leases cannot make a comparison flaky.

:func:`run_all` runs many scenarios concurrently on one event loop, so the
wall-clock waits of the kubelet (5 s reconnects, leases) overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import io
import json
import logging
import pathlib
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from kubelet_dra import cli
from kubelet_dra.state import kubeletcheckpoint
from kubelet_dra.status import claims as claims_mod
from tests.conformance import _compare, _drivers, _godriver, _objects, _ours, _sidecar, _twinlike
from tests.conformance import _scenario as sc

SETTLE = 0.3
"""Minimum seconds after a driver action before anything is read."""
SETTLE_DEADLINE = 8.0
"""Longest wait for the twin's checkpoint to settle after a driver action."""
REPORT_DEADLINE = 30.0
"""Longest wait for our stream to take a report (then the run's timing failed)."""
DEADLINE_MARGIN = 0.5
"""A sync point keeps at least this far from any lease deadline."""
OUR_RECONNECT = (1.6, 2.0)
"""Earliest and latest reconnect of our stream after an end (backoff 2 s, jitter 20%)."""
KUBELET_RECONNECT = 5.0
"""The kubelet's fixed pause before it reopens a stream (``wait.Until``, 5 s)."""
ATTEMPTS = 3
"""Runs of a scenario whose timing a slow machine could not keep (never one that
showed a difference)."""
STATE_FILE = "dra_health_state"
#: The lines whose ``dra_manager_state`` our reader parses (the sidecar's lines): there a
#: prepare on both sides is compared by the devices each recorded, not only its outcome.
PREPARED_LINES = _sidecar.LINES
STREAM_DEADLINE = 10.0
"""Longest wait for one side's health stream after it registered (a loaded machine)."""


class TimingError(Exception):
    """A sync point fell too close to a lease deadline to compare reliably.

    ``observed``: what the attempt had compared by then (kept: an undeclared difference
    there fails the run even if a later attempt keeps its timing)."""

    observed: list[_compare.Observed]

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.observed = []


TwinFactory = Callable[[str], Awaitable[_twinlike.TwinLike]]
Driver = _drivers.ScenarioDriver | _godriver.GoHelperDriver


@dataclasses.dataclass
class RunResult:
    scenario: str
    line: str
    version: str
    seconds: float
    observed: list[_compare.Observed]
    verdict: _compare.Verdict
    error: str = ""
    attempts: int = 1
    timing: bool = False
    """The run could not keep its timing in :data:`ATTEMPTS` attempts."""
    alone: bool = False
    """Re-run on its own after its timing failed among concurrent runs."""
    compared: int = 0
    """Comparisons the run made (the last attempt)."""
    by_kind: dict[str, int] = dataclasses.field(default_factory=dict)
    """The same, per kind (``status``, ``sidecar``, ``devices``...)."""
    counts: list[tuple[sc.Difference, _compare.Count]] = dataclasses.field(default_factory=list)
    """Per declaration of the line: its comparisons (in scope, matched, differed)."""
    earlier: list[_compare.Observed] = dataclasses.field(default_factory=list)
    """Everything attempts that failed on timing observed (their undeclared differences
    are in ``verdict.earlier`` and fail the run)."""

    @property
    def ok(self) -> bool:
        return not self.error and self.verdict.ok

    def cell(self) -> str:
        """The matrix cell: same, or the declared differences it showed."""
        if not self.ok:
            return "FAILED"
        features = sorted({d.feature for d in self.verdict.seen})
        if not features:
            return "same"
        return "declared difference (" + ", ".join(features) + ")"

    def report(self) -> str:
        alone = " (re-run alone after the concurrent pass)" if self.alone else ""
        lines = [f"{self.scenario} on kubelet {self.line} ({self.version}){alone}:"]
        if self.error:
            lines.append(f"  run error: {self.error}")
        for obs in self.verdict.unexplained:
            lines.append("  UNDECLARED " + obs.render().replace("\n", "\n  "))
        for obs in self.verdict.earlier:
            lines.append(
                "  UNDECLARED (in an attempt that then failed on timing) "
                + obs.render().replace("\n", "\n  ")
            )
        for diff, why in zip(self.verdict.missing, self.verdict.why, strict=False):
            lines.append(f"  DECLARED BUT NOT SEEN: {diff.where()}\n    ({why})")
        return "\n".join(lines)


def _twin_line(line: str) -> int:
    return int(line.split(".")[1])


CAP = 16_384
"""The kubelet's devices per driver from 1.37 (healthinfo.go maxDevicesPerDriver)."""


def twin_streams(
    line: str, services: Sequence[str], served: Sequence[str] = ("v1", "v1alpha1")
) -> bool:
    """Whether this kubelet line opens a health stream the driver sees, for these
    advertised services and the health versions the driver serves (``served``)."""
    if _twin_line(line) >= 37:
        return any(s in services for s in ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"))
    # Up to 1.36 the manager always watches v1alpha1 (plugin/dra_plugin.go: its
    # healthClient is a v1alpha1 DRAResourceHealthClient); a driver that does not serve it answers
    # UNIMPLEMENTED from gRPC itself, so no stream reaches the driver.
    return "v1alpha1" in served


class Run:
    def __init__(
        self,
        scenario: sc.Scenario,
        line: str,
        twin: _twinlike.TwinLike,
        workdir: pathlib.Path,
        gohelper: _godriver.GoHelperEnv | None = None,
    ) -> None:
        self.scenario = scenario
        self.gohelper = gohelper
        self.line = line
        self.twin = twin
        self.dir = workdir
        self.ours = _ours.OurSide(workdir / "ours", node=scenario.node, registry=workdir / "reg")
        self.sidecar: _sidecar.SidecarSide | None = None
        """Our sidecar's writes, compared too on :data:`_sidecar.LINES` (set up in _setup)."""
        self.drivers: dict[tuple[str, str], Driver] = {}
        self.registered: dict[tuple[str, str], str] = {}  # (driver, endpoint name) -> socket
        self.observed: list[_compare.Observed] = []
        self.tally = _compare.Tally(_compare.declared_on(scenario, line), scenario)
        self.at = "setup"
        self.claims = {c.name: _objects.claim_object(scenario, c) for c in scenario.claims}
        self.pods = {p.name: _objects.pod_object(scenario, p) for p in scenario.pods}
        self.names = _objects.pod_uid_names(scenario)
        self.keys = list(sc.iter_devices(scenario))
        # Per device: (nominal report time, real report time, lease). Nominal time is
        # the scenario's own clock: the sum of its waits (settling counts as zero).
        self.leases: dict[tuple[str, str, str], tuple[float, float, float]] = {}
        self.nominal = 0.0
        self.ends: dict[tuple[str, str], tuple[float, float, int]] = {}
        self._sockets = 0

    # -- the whole run -----------------------------------------------------

    async def execute(self) -> RunResult:
        started = time.monotonic()
        error = ""
        try:
            await self._setup()
            for i, step in enumerate(self.scenario.timeline):
                self.at = f"step {i} ({step.kind})"
                await self._step(step)
            self.at = "end"
            await self._final()
            self.tally.compare("twin", self.at, "twin", "exit", "running", "running")
        except _twinlike.TwinTimeout as exc:
            timing = TimingError(f"the twin fell behind: {exc}")
            timing.observed = self._undeclared()
            raise timing from None
        except _twinlike.TwinCrashed as exc:
            reason = _crash_reason(str(exc))
            self.tally.compare("twin", self.at, "twin", "exit", "running", reason)
            self.observed.append(
                _compare.Observed("twin", self.at, "twin", "running", reason, "exit", str(exc))
            )
        except TimingError as exc:
            exc.observed = self._undeclared()
            raise
        except Exception as exc:
            error = f"{self.at}: {type(exc).__name__}: {exc}"
        finally:
            await self._teardown()
        verdict = _compare.classify(self.scenario, self.line, self.observed, tally=self.tally)
        return RunResult(
            self.scenario.name,
            self.line,
            getattr(self.twin, "version", ""),
            time.monotonic() - started,
            self.observed,
            verdict,
            error,
            compared=self.tally.total,
            by_kind=dict(self.tally.by_kind),
            counts=list(zip(self.tally.declared, self.tally.counts, strict=True)),
        )

    def _undeclared(self) -> list[_compare.Observed]:
        """What this attempt observed that no declaration has (it fails the run even if a
        later attempt keeps its timing)."""
        return [o for o in self.observed if not self.tally.covering(o)]

    async def _setup(self) -> None:
        twin_dir = self.dir / "twin"
        twin_dir.mkdir(parents=True)
        if self.scenario.checkpoint is not None:
            (twin_dir / STATE_FILE).write_text(self.scenario.checkpoint)
        await self._twin_ok("start", self.twin.start(str(twin_dir), self.scenario.node))
        await self.ours.start()
        if self.line in _sidecar.LINES:
            self.sidecar = _sidecar.SidecarSide(
                self.dir / "sidecar", node=self.scenario.node, kubelet_dir=twin_dir
            )
        if self.scenario.uses_go_helper():
            await self._claims_from_apiserver()
        else:
            self._admit_to_sidecar()
        if self.sidecar is not None:
            self.sidecar.add_claims(self.claims)
            await self.sidecar.start()
        await self._twin_ok("claims", self.twin.claims(list(self.claims.values())))
        for driver in self.scenario.drivers:
            await self._start_endpoint(driver, "main", register=driver.registered)
        for pod in self.scenario.pods:
            if pod.prepare:
                await self._prepare(pod.name, fails=pod.prepare_fails)
        await self._settle()

    async def _claims_from_apiserver(self) -> None:
        """Create the claims in the kube-apiserver and use them as read back on both sides.

        The Go helper driver's NodePrepareResources fetches each claim there and checks
        its UID against the kubelet's, so the twin's fake clientset and our side get the
        server's objects (its UIDs); each run has namespaces of its own on the shared
        server, and the pods move to them too.
        """
        if self.gohelper is None:
            raise RuntimeError(
                "the scenario uses the Go helper driver: the run needs a kube-apiserver "
                "(run it through the conformance tests or _suite, which start one)"
            )
        store = _godriver.ApiClaims(self.gohelper.apiserver)
        self.pods = {
            name: _godriver.namespaced(pod, store.namespace(pod["metadata"]["namespace"]))
            for name, pod in self.pods.items()
        }
        self.claims = {
            name: _godriver.namespaced(obj, store.namespace(obj["metadata"]["namespace"]))
            for name, obj in self.claims.items()
        }
        self._admit_to_sidecar()  # first: the claims are reserved for the pods' UIDs
        created = await asyncio.to_thread(store.create, list(self.claims.values()))
        self.claims = {obj["metadata"]["name"]: obj for obj in created}

    def _admit_to_sidecar(self) -> None:
        """Bind the pods in the sidecar's API stand-in; every side then uses the UIDs it
        gave them (in the pods, and the claims reserved for or owned by them)."""
        if self.sidecar is None:
            return
        uids = self.sidecar.admit(self.pods)
        self.pods = {name: _objects.with_uids(pod, uids) for name, pod in self.pods.items()}
        self.claims = {name: _objects.with_uids(obj, uids) for name, obj in self.claims.items()}
        self.names = {uids.get(uid, uid): name for uid, name in self.names.items()}

    async def _teardown(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.twin.stop(), 10)
        kill = getattr(self.twin, "kill", None)
        if kill is not None:
            with contextlib.suppress(Exception):
                await kill()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ours.stop(), 15)
        if self.sidecar is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.sidecar.stop(), 15)
        for drv in self.drivers.values():
            with contextlib.suppress(Exception):
                await drv.stop()

    async def _twin_ok(self, op: str, call: Awaitable[_twinlike.Reply]) -> _twinlike.Reply:
        reply = await call
        if op == "state" and "not JSON" in str(reply.get("error", "")):
            # The kubelet itself loads an unparsable checkpoint as an empty cache.
            return {"ok": True, "state": None, "raw": reply.get("error")}
        if not reply.get("ok", False) and op in ("start", "claims", "sync", "state"):
            raise _twinlike.TwinCrashed(f"{op} failed: {reply.get('error')}")
        return reply

    # -- endpoints -----------------------------------------------------------

    def _driver_spec(self, name: str) -> sc.Driver:
        return next(d for d in self.scenario.drivers if d.name == name)

    async def _start_endpoint(self, spec: sc.Driver, endpoint: str, *, register: bool) -> None:
        self._sockets += 1
        uids = {name: str(obj["metadata"]["uid"]) for name, obj in self.claims.items()}
        answers = _objects.prepare_answers(self.scenario, spec.name, uids)
        drv: Driver
        if spec.go_helper:
            assert self.gohelper is not None  # _setup refused the run otherwise
            binary = self.gohelper.binaries.get(spec.implementation)
            if binary is None:
                raise RuntimeError(f"no build of the {spec.implementation} driver")
            drv = _godriver.GoHelperDriver(
                spec.name,
                binary=binary,
                workdir=self.dir / f"s{self._sockets}",
                kubeconfig=self.gohelper.apiserver.kubeconfig,
                # One list for every claim (the scenario loader checked they agree).
                prepare_devices=next(iter(answers.values()), []),
                unimplemented=spec.unimplemented,
            )
        else:
            drv = _drivers.ScenarioDriver(
                spec.name,
                registry=self.dir / "reg",
                plugin_dir=self.dir / f"s{self._sockets}",
                answers=answers,
                health_versions=spec.health_versions,
                dra_versions=spec.dra_versions,
                unimplemented=spec.unimplemented,
                supported_versions=spec.services,
                prepare_errors=spec.prepare_errors,
            )
        old = self.drivers.get((spec.name, endpoint))
        if old is not None and old._devices is not None:
            drv._devices = list(old._devices)  # a restarted driver knows its devices
        await drv.start()
        self.drivers[(spec.name, endpoint)] = drv
        if register:
            await self._register(spec.name, endpoint)

    async def _register(self, driver: str, endpoint: str) -> None:
        """Register on the twin, then on ours, each time noting which health stream that
        side opened (the driver counts the calls per method and version)."""
        drv = self.drivers[(driver, endpoint)]
        socket = str(drv.dra_socket)
        services = drv.supported_versions
        health = any("DRAResourceHealth" in s for s in services)
        before = dict(drv.calls)
        twin = await self.twin.register(driver, socket, services)
        served = tuple(getattr(drv, "health_versions", ("v1", "v1alpha1")))
        if twin.get("ok") and twin_streams(self.line, services, served):
            await self._stream_opened(drv, before, "the twin")
        twin_stream = _new_streams(before, drv.calls)
        before = dict(drv.calls)
        ours = await self.ours.register(driver, socket, services)
        if ours is None and health:
            await self._stream_opened(drv, before, "our side")
        ours_stream = _new_streams(before, drv.calls)
        before = dict(drv.calls)
        if await self._sidecar_registered(driver, socket, services, ours) and health:
            await self._stream_opened(drv, before, "our sidecar")
        # Subjects name the scenario's endpoint ("main"), not the run's socket path.
        self._compare_registration(driver, endpoint, twin, ours, refused=False)
        subject = f"register {driver} at {endpoint}"
        if twin.get("ok") and ours is None:
            self.tally.compare(
                "registration", self.at, subject, "health stream", ours_stream, twin_stream
            )
        if twin.get("ok") and ours is None and ours_stream != twin_stream:
            self.observed.append(
                _compare.Observed(
                    "registration", self.at, subject, ours_stream, twin_stream, "health stream"
                )
            )
        self.registered[(driver, endpoint)] = socket
        await asyncio.sleep(SETTLE)

    async def _sidecar_registered(
        self, driver: str, endpoint: str, services: Sequence[str], ours: str | None
    ) -> bool:
        """Register the sidecar like our node agent: the same validation, so the same
        outcome, or the run is broken. Whether it registered."""
        if self.sidecar is None:
            return False
        refused = await self.sidecar.register(driver, endpoint, services)
        if refused != ours:
            raise RuntimeError(
                f"the sidecar's registration of {endpoint} ({refused or 'accepted'}) differs "
                f"from the node agent's ({ours or 'accepted'}): the same code refused apart"
            )
        return refused is None

    async def _stream_opened(self, drv: Driver, before: Mapping[str, int], side: str) -> None:
        """A side that registered a health service opens a stream (every line does, even one
        the driver answers UNIMPLEMENTED): not within the deadline is the machine's timing."""
        if not await _until(lambda: _stream_calls(drv) > _count_streams(before), STREAM_DEADLINE):
            raise TimingError(f"{side} opened no health stream within {STREAM_DEADLINE:g}s")

    def _compare_registration(
        self,
        driver: str,
        endpoint: str,
        twin: _twinlike.Reply,
        ours: str | None,
        *,
        refused: bool,
    ) -> None:
        """The outcome on each side against each other and against the scenario's: both
        refusing is the same only where the scenario says the registration is refused,
        and then only for the same reason (the rule each error text names)."""
        twin_out = "accepted" if twin.get("ok") else "refused"
        ours_out = "accepted" if ours is None else "refused"
        subject = f"register {driver} at {endpoint}"
        self.tally.compare("registration", self.at, subject, "outcome", ours_out, twin_out)
        expected = "refused" if refused else "accepted"
        detail = f"ours: {ours or 'accepted'}; twin: {twin.get('error') or 'accepted'}"
        if twin_out != ours_out or ours_out != expected:
            if twin_out == ours_out:
                detail += f"; the scenario says {expected}"
            self.observed.append(
                _compare.Observed(
                    "registration", self.at, subject, ours_out, twin_out, "outcome", detail
                )
            )
            return
        if ours is not None:
            mine = _compare.refusal_rule(ours)
            theirs = _compare.refusal_rule(str(twin.get("error") or ""))
            self.tally.compare("registration", self.at, subject, "reason", mine, theirs)
            if mine != theirs:
                self.observed.append(
                    _compare.Observed(
                        "registration", self.at, subject, mine, theirs, "reason", detail
                    )
                )

    async def _deregister(self, driver: str, endpoint: str) -> None:
        socket = self.registered.pop((driver, endpoint), None)
        if socket is None:
            return
        await self.twin.deregister(driver, socket)
        for side in self._our_sides():
            await side.deregister(driver, socket)

    def _our_sides(self) -> list[_ours.Registrations]:
        """Our node agent, and the sidecar where the line compares it."""
        return [self.ours] + ([self.sidecar] if self.sidecar is not None else [])

    # -- the timeline ----------------------------------------------------------

    async def _step(self, step: sc.Step) -> None:
        args = step.args
        handler = getattr(self, f"_do_{step.kind}")
        await handler(args)

    async def _do_report(self, args: sc.Report) -> None:
        drv = self.drivers[(args.driver, args.endpoint)]
        devices = [d for report in args.devices for d in report.expand()]
        sent = devices
        before = self._our_reports(args.driver, args.endpoint)
        for i in range(args.times):
            sent = devices
            if args.alternate and sent:
                health = "Healthy" if i % 2 == 0 else "Unhealthy"
                sent = [{**d, "health": health} for d in devices]
            await drv.set_health(*sent)
        now = time.time()
        for d in devices:
            lease = d["timeout_seconds"] if d["timeout_seconds"] > 0 else 30
            self.leases[(args.driver, d["pool"], d["device"])] = (self.nominal, now, lease)
        if before and not drv.silent:

            def caught_up() -> bool:
                now = self._our_reports(args.driver, args.endpoint)
                return all(now.get(i, 0) >= n + args.times for i, n in before.items())

            if not await _until(caught_up, REPORT_DEADLINE):
                raise TimingError(f"our stream: {args.times} reports took over {REPORT_DEADLINE}s")
        if sent and not drv.silent:
            await self._twin_took(args.driver, sent[0])
            if len(sent) > 1 and (_twin_line(self.line) < 37 or len(sent) <= CAP):
                # A big report: its last device too (a 1.35 run under load once read the
                # checkpoint with the first 16,384 of 20,000 devices only). From 1.37 the
                # kubelet ignores devices past the cap: nothing to wait for there.
                await self._twin_took(args.driver, sent[-1])
        await self._settle()

    async def _twin_took(self, driver: str, device: dict[str, Any]) -> None:
        """Wait until the twin's checkpoint shows the report's first device (if the twin
        streams at all; a twin that does not is given a few seconds, then the stable
        checkpoint of :meth:`_settle` decides)."""
        health = device["health"]
        if isinstance(health, int):
            health = {1: "Healthy", 2: "Unhealthy"}.get(health, "Unknown")
        request: dict[str, Any] = {
            "driver": driver,
            "pool": device["pool"],
            "device": device["device"],
            "health": health,
            "timeoutMs": 3000,
        }
        message = str(device.get("message") or "")
        # The 1.35 helper's v1alpha1 carries no message: the checkpoint shows none.
        carried = self._driver_spec(driver).implementation != "go-helper-v0.35"
        if _twin_line(self.line) >= 36 and carried and len(message.encode()) <= 1024:
            request["message"] = message
        call = getattr(self.twin, "call", None)
        if call is not None:
            await call("wait_state", **request)

    def _our_reports(self, driver: str, endpoint: str) -> dict[int, int]:
        """Per side of ours (by position) whose stream of the endpoint is up: the reports
        it took."""
        socket = self.registered.get((driver, endpoint))
        counts = {}
        for i, side in enumerate(self._our_sides()):
            state = side.stream_state(socket) if socket else None
            if state is not None and state[0] in ("connecting", "streaming"):
                counts[i] = state[1]
        return counts

    async def _do_silence(self, args: sc.EndpointRef) -> None:
        self.drivers[(args.driver, args.endpoint)].set_silent(True)

    async def _do_resume(self, args: sc.EndpointRef) -> None:
        drv = self.drivers[(args.driver, args.endpoint)]
        drv.set_silent(False)
        drv.unimplemented = False

    async def _do_end_stream(self, args: sc.EndStream) -> None:
        drv = self.drivers[(args.driver, args.endpoint)]
        calls = _stream_calls(drv)
        # The end's time is taken once the driver ended the streams: the Go helper driver
        # does that when it polls its control file, which a loaded machine can delay.
        await drv.end_streams(args.code)
        self.ends[(args.driver, args.endpoint)] = (self.nominal, time.time(), calls)
        await self._after_stream_end(args.driver, args.endpoint)

    async def _do_unimplemented(self, args: sc.EndpointRef) -> None:
        drv = self.drivers[(args.driver, args.endpoint)]
        drv.unimplemented = True
        await drv.end_streams("UNIMPLEMENTED", fakedriver_not_supported())
        await self._after_stream_end(args.driver, args.endpoint)

    async def _after_stream_end(self, driver: str, endpoint: str) -> None:
        def ended() -> bool:
            return not self._our_reports(driver, endpoint)

        await _until(ended, SETTLE_DEADLINE)
        await self._settle()

    async def _do_restart(self, args: sc.Restart) -> None:
        drv = self.drivers[(args.driver, args.endpoint)]
        if not args.new_socket:
            self.ends[(args.driver, args.endpoint)] = (self.nominal, time.time(), 0)
            await drv.restart()  # a new process: its call counts start again
            await self._after_stream_end(args.driver, args.endpoint)
            return
        await self._deregister(args.driver, args.endpoint)
        await drv.stop()
        await self._start_endpoint(self._driver_spec(args.driver), args.endpoint, register=True)
        await self._settle()

    async def _do_reregister(self, args: sc.EndpointRef) -> None:
        await self._deregister(args.driver, args.endpoint)
        await self._settle()
        await self._register(args.driver, args.endpoint)
        await self._settle()

    async def _do_start_endpoint(self, args: sc.StartEndpoint) -> None:
        await self._start_endpoint(self._driver_spec(args.driver), args.endpoint, register=True)
        await self._settle()

    async def _do_stop_endpoint(self, args: sc.EndpointRef) -> None:
        await self._deregister(args.driver, args.endpoint)
        await self.drivers[(args.driver, args.endpoint)].stop()
        await self._settle()

    async def _do_deregister(self, args: sc.EndpointRef) -> None:
        await self._deregister(args.driver, args.endpoint)
        await self._settle()

    async def _do_register(self, args: sc.Register) -> None:
        twin = await self.twin.register(args.driver, args.endpoint, args.services)
        ours = await self.ours.register(args.driver, args.endpoint, args.services)
        await self._sidecar_registered(args.driver, args.endpoint, args.services, ours)
        self._compare_registration(args.driver, args.endpoint, twin, ours, refused=args.refused)
        await asyncio.sleep(SETTLE)

    async def _do_prepare(self, args: sc.PodRef) -> None:
        await self._prepare(args.pod, fails=args.fails)
        await self._settle()

    async def _prepare(self, name: str, *, fails: bool) -> None:
        pod = self.pods[name]
        twin = await self.twin.prepare(pod)
        twin_error = "" if twin.get("ok") and not twin.get("error") else str(twin.get("error"))
        ours = await self.ours.prepare(pod, self.claims)
        if any("DEADLINE_EXCEEDED" in text for text in (twin_error, ours or "")):
            # The driver's answer came too late on a loaded machine: timing, not a result.
            raise TimingError(f"prepare of pod {name} timed out: {ours or twin_error}")
        if (twin_error or ours) and self.scenario.uses_go_helper():
            # Its claims come from the kube-apiserver and it prepares every claim: a failure
            # is a broken run (claims or answers not what the scenario says), and a failure
            # on both sides must not pass as "same".
            raise RuntimeError(
                f"prepare of pod {name} failed with the Go helper driver: "
                f"twin: {twin_error or 'prepared'}; ours: {ours or 'prepared'}"
            )
        self._compare_prepare(name, ours, twin_error, fails=fails)
        compared = self.line in PREPARED_LINES or self.scenario.compare_prepared
        if not ours and not twin_error and compared:
            self._compare_prepared_devices(name)
        if self.sidecar is not None and not twin_error:
            self.sidecar.started(pod)

    def _compare_prepare(
        self, name: str, ours: str | None, twin_error: str, *, fails: bool
    ) -> None:
        """By content: the outcome (both failing is the same only where the scenario says
        the pod's prepare fails) and, when both failed, which of the pod's claims each
        error names."""
        subject = f"pod {name}"
        expected = "failed" if fails else "prepared"
        ours_out = "failed" if ours else "prepared"
        twin_out = "failed" if twin_error else "prepared"
        self.tally.compare("prepare", self.at, subject, "outcome", ours_out, twin_out)
        detail = f"ours: {ours or 'prepared'}; twin: {twin_error or 'prepared'}"
        if ours_out != twin_out or ours_out != expected:
            if ours_out == twin_out:
                detail += f"; the scenario says {expected}"
            self.observed.append(
                _compare.Observed(
                    "prepare", self.at, subject, ours_out, twin_out, "outcome", detail
                )
            )
            return
        if ours and twin_error:
            claims = [c.claim for c in self.scenario.pod(name).claims]
            mine = sorted(c for c in claims if c in ours)
            theirs = sorted(c for c in claims if c in twin_error)
            self.tally.compare("prepare", self.at, subject, "claims named", mine, theirs)
            if mine != theirs:
                self.observed.append(
                    _compare.Observed(
                        "prepare", self.at, subject, mine, theirs, "claims named", detail
                    )
                )

    def _compare_prepared_devices(self, name: str) -> None:
        """Both prepared: each of the pod's claims holds the same devices on both sides
        (driver, pool, device, requests, CDI IDs), ours as our node agent keeps them and the
        twin's as its ``dra_manager_state`` records them."""
        pod = self.pods[name]
        namespace = str(pod["metadata"]["namespace"])
        found = kubeletcheckpoint.read(self.dir / "twin" / kubeletcheckpoint.FILE_NAME)
        if found is None:
            raise RuntimeError(f"the twin prepared pod {name} and wrote no checkpoint")
        twin_claims = {(c.namespace, c.name): c.devices for c in found}
        for ref in self.scenario.pod(name).claims:
            key = (namespace, ref.claim)
            subject = f"pod {name} claim {ref.claim}"
            mine = _prepared(self.ours.claim_devices.get(key, ()))
            theirs = _prepared(twin_claims.get(key, ()))
            self.tally.compare("prepare", self.at, subject, "devices", mine, theirs)
            if mine != theirs:
                self.observed.append(
                    _compare.Observed("prepare", self.at, subject, mine, theirs, "devices")
                )

    async def _do_unprepare(self, args: sc.PodRef) -> None:
        pod = self.pods[args.pod]
        if self.sidecar is not None:
            self.sidecar.ended(pod)
        reply = await self.twin.unprepare(pod)
        self.tally.compare(
            "prepare", self.at, f"pod {args.pod}", "unprepare",
            "unprepared", "unprepared" if reply.get("ok") else "failed",
        )  # fmt: skip
        if not reply.get("ok"):
            self.observed.append(
                _compare.Observed(
                    "prepare", self.at, f"pod {args.pod}", "unprepared", "failed", "unprepare",
                    str(reply.get("error")),
                )
            )  # fmt: skip
        self.ours.unprepare(pod)
        await self._settle()

    async def _do_pause_updates(self, args: sc.PauseUpdates) -> None:
        # Only the twin: our pipeline marks pods dirty and never drops one.
        reply = await self.twin.pause_updates()
        if not reply.get("ok"):
            raise _twinlike.TwinCrashed(f"pause_updates failed: {reply.get('error')}")

    async def _do_wait(self, args: sc.Wait) -> None:
        self.nominal += args.seconds
        await asyncio.sleep(args.seconds)

    async def _do_sync(self, args: sc.Sync) -> None:
        self.at = f"sync {args.name}"
        await self._away_from_deadlines()
        if not await _until(self.ours.settled, REPORT_DEADLINE):
            raise TimingError("our deadline task or status callback fell behind wall-clock time")
        if self.sidecar is not None and not await _until(self.sidecar.settled, REPORT_DEADLINE):
            raise TimingError("our sidecar's deadline task, watches or writes fell behind")
        kept = len(self.observed)
        await self._compare_at(args)
        try:
            self._still_before_deadlines()
        except TimingError:
            # The comparisons straddled a lease deadline the scenario means to be ahead
            # (a 16,384-device sync point takes seconds on a loaded machine): what they
            # saw is the clock's, not a difference of either side. Earlier sync points'
            # differences stay and fail the run.
            del self.observed[kept:]
            raise

    def _still_before_deadlines(self) -> None:
        """After a sync point's comparisons: no lease the scenario means to be running
        came within :data:`DEADLINE_MARGIN` of its deadline while they were made."""
        close = self._running_lease_near_deadline(time.time())
        if close:
            raise TimingError(f"the sync point's comparisons ended {close}")

    def _running_lease_near_deadline(self, now: float) -> str:
        """A lease the scenario means to be running whose real deadline is less than
        :data:`DEADLINE_MARGIN` ahead at ``now``, described; "" if none."""
        for key, (nominal, real, lease) in self.leases.items():
            if self.nominal - nominal <= lease and now > real + lease - DEADLINE_MARGIN:
                return (
                    f"{now - real:.2f}s after the report of {'/'.join(key)}, "
                    f"within {DEADLINE_MARGIN}s of its {lease:g}s lease"
                )
        return ""

    async def _compare_at(self, args: sc.Sync) -> None:
        reply = await self._twin_ok("sync", self.twin.sync(list(self.pods.values()), self.keys))
        # Our cache at the same sync point, before anything else is compared: a rule
        # (entry-from-our-view) reads it for the status entries.
        our_view = self.ours.devices(self.keys)
        self.tally.views[args.name] = our_view
        announced = self.ours.take_announced()
        twin_announced = {self.names.get(u, u) for u in reply.get("announced") or ()}
        ours_announced = {self.names.get(u, u) for u in announced}
        self.observed += _compare.compare_announced(
            args.name, ours_announced, twin_announced, self.pods, tally=self.tally
        )
        if args.announced is not None:
            self.observed += _compare.compare_predicted(
                args.name, ours_announced, twin_announced, args.announced, tally=self.tally
            )
        statuses = reply.get("statuses") or {}
        ordered = _twin_line(self.line) >= 38
        for name, pod in self.pods.items():
            uid = pod["metadata"]["uid"]
            self.observed += _compare.compare_status(
                args.name, name, self.ours.status_of(pod), statuses.get(uid) or {},
                ordered=ordered, tally=self.tally,
            )  # fmt: skip
            if self.sidecar is not None:
                differs = _compare.compare_status(
                    args.name, name, self.sidecar.status_of(pod), statuses.get(uid) or {},
                    ordered=ordered, tally=self.tally, kind="sidecar",
                )  # fmt: skip
                why = self.sidecar.explain(pod) if differs else ""
                self.observed += [dataclasses.replace(o, detail=why) for o in differs]
        # The twin's view: what the kubelet's own getHealthInfo returned for each device
        # in that sync reply, in the order the runner asked.
        twin_view = dict(zip(self.keys, reply.get("devices") or (), strict=False))
        self.observed += _compare.compare_devices(args.name, our_view, twin_view, tally=self.tally)
        if self.scenario.compare_stored:
            state = (await self._twin_ok("state", self.twin.state())).get("state")
            await self._compare_stored(args.name, state)

    async def _compare_stored(self, at: str, state: Any) -> None:
        rows, error = await _cache_show(self.dir / "ours", flag="--state-dir")
        ours = sorted("/".join(_compare.row_key(r)) for r in rows)
        twin = sorted("/".join(_compare.row_key(r)) for r in _compare.checkpoint_rows(state))
        self.tally.compare("stored", at, "stored", "devices", error or ours, twin)
        if error or ours != twin:
            self.observed.append(
                _compare.Observed("stored", at, "stored", error or ours, twin, "devices")
            )

    async def _away_from_deadlines(self) -> None:
        """Keep a sync point on the side of every lease deadline the scenario means.

        The scenario's nominal clock says whether a lease has run out at this sync
        point; real time must agree, at least :data:`DEADLINE_MARGIN` away from the
        deadline. Just past one, the run waits a little; on the wrong side (a slow
        machine stretched the settling) it raises :class:`TimingError`, and the run
        is repeated rather than compared by luck.
        """
        now = time.time()
        close = self._running_lease_near_deadline(now)
        if close:
            raise TimingError(
                f"the sync point came {close} (the scenario means it to be before the deadline)"
            )
        wait = 0.0
        for nominal, real, lease in self.leases.values():
            if self.nominal - nominal > lease:  # meant expired: at least the margin past it
                wait = max(wait, real + lease + DEADLINE_MARGIN - now)
        wait = max(wait, self._away_from_reconnects(now))
        if wait:
            await asyncio.sleep(wait)
        await self._reconnected()

    async def _reconnected(self) -> None:
        """After a reconnect the scenario means to have happened: both streams are open again
        (the driver counted both calls) and both sides took the first report."""
        waited = False
        for key, (nominal, _, calls) in self.ends.items():
            drv = self.drivers.get(key)
            if (
                drv is None
                or self.nominal - nominal < KUBELET_RECONNECT
                or key not in self.registered
            ):
                continue
            sides = len(self._our_sides())
            await _until(functools.partial(_reconnected, drv, calls, sides), 10.0)
            waited = True
        if waited:
            await self._settle()

    def _away_from_reconnects(self, now: float) -> float:
        """Like leases, for the reconnect after a stream ended: we reconnect after
        :data:`OUR_RECONNECT` (at the earliest), the kubelet after :data:`KUBELET_RECONNECT`.
        A sync point is meant before both or after both, never in between."""
        wait = 0.0
        for (driver, endpoint), (nominal, real, _) in self.ends.items():
            meant, elapsed = self.nominal - nominal, now - real
            if meant < OUR_RECONNECT[0]:
                if elapsed > OUR_RECONNECT[0] - DEADLINE_MARGIN:
                    raise TimingError(
                        f"{driver} ({endpoint}): the sync point came {elapsed:.2f}s after the "
                        "stream ended, too close to our reconnect"
                    )
            elif meant >= KUBELET_RECONNECT:
                wait = max(wait, KUBELET_RECONNECT + DEADLINE_MARGIN - elapsed)
            else:
                raise TimingError(
                    f"{driver} ({endpoint}): a sync point {meant:g}s after a stream end falls "
                    f"between our reconnect and the kubelet's ({KUBELET_RECONNECT:g}s)"
                )
        return wait

    async def _settle(self) -> None:
        """Both sides reflect the last action: a minimum wait, then a stable checkpoint."""
        await asyncio.sleep(SETTLE)
        deadline = time.monotonic() + SETTLE_DEADLINE
        previous = None
        while time.monotonic() < deadline:
            raw = (await self._twin_ok("state", self.twin.state())).get("raw")
            if raw == previous:
                return
            previous = raw
            await asyncio.sleep(0.15)

    # -- after the run -------------------------------------------------------

    async def _final(self) -> None:
        path = self.dir / "twin" / STATE_FILE
        for _ in range(5):
            before = await self._twin_ok("state", self.twin.state())
            if not path.exists():
                return
            rows, error = await _cache_show(path, process=not self.scenario.generated)
            after = await self._twin_ok("state", self.twin.state())
            if after.get("raw") == before.get("raw"):
                break  # the CLI read what the twin's view shows (no reconnect in between)
        state = after.get("state")
        self.tally.compare("checkpoint", "end", "cache show", "exit", error, "")
        if error:
            self.observed.append(
                _compare.Observed(
                    "checkpoint", "end", "cache show", f"error: {error}",
                    f"{len(_compare.checkpoint_rows(state))} devices", "exit",
                )
            )  # fmt: skip
            return
        self.observed += _compare.compare_cli(rows, state, tally=self.tally)


def fakedriver_not_supported() -> str:
    from kubelet_dra.testing import fakedriver

    return fakedriver.NOT_SUPPORTED


def _reconnected(drv: Driver, calls: int, sides: int) -> bool:
    # The twin and each of our sides opened a new stream since ``calls`` were counted.
    return _stream_calls(drv) >= calls + 1 + sides


def _stream_calls(drv: Driver) -> int:
    return _count_streams(drv.calls)


def _count_streams(calls: Mapping[str, int]) -> int:
    return sum(n for m, n in calls.items() if m.startswith("NodeWatchResources/"))


def _new_streams(before: Mapping[str, int], after: Mapping[str, int]) -> list[str]:
    """The health API versions whose streams were opened between two call counts."""
    return sorted(
        m.removeprefix("NodeWatchResources/")
        for m, n in after.items()
        if m.startswith("NodeWatchResources/") and n > before.get(m, 0)
    )


def _crash_reason(text: str) -> str:
    """The twin's failure in a form a declaration can fix: the Go panic's first line (no
    addresses or goroutine numbers), else the error's first line."""
    for line in text.splitlines():
        if "panic: " in line:
            return line[line.index("panic: ") :].strip()
    return text.splitlines()[0].strip() if text else ""


async def _until(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def _cache_show(
    path: pathlib.Path, *, flag: str = "--kubelet-state", process: bool = False
) -> tuple[list[dict[str, Any]], str]:
    """``kubelet-dra-health cache show --kubelet-state PATH --output json`` (or ``--state-dir``).

    ``process``: as a separate process, exactly as a user runs it; otherwise the same
    parser and handler in this process (starting the interpreter and importing the
    package costs seconds per call on a loaded machine).
    """
    argv = ["cache", "show", flag, str(path), "--output", "json"]
    if process:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kubelet_dra", *argv,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await proc.communicate()
        code, text, errtext = proc.returncode, out.decode(), err.decode(errors="replace")
    else:
        ns = cli.build_parser().parse_args(argv)
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = ns.handler(ns)
        text, errtext = stdout.getvalue(), stderr.getvalue()
    if code != 0:
        return [], f"exit {code}: {errtext.strip()}"
    return json.loads(text), ""


async def run_one(
    scenario: sc.Scenario,
    line: str,
    factory: TwinFactory,
    *,
    keep: bool = False,
    gohelper: _godriver.GoHelperEnv | None = None,
    earlier: Sequence[_compare.Observed] = (),
) -> RunResult:
    """One run; repeated (at most :data:`ATTEMPTS` times) only if its timing failed.

    What a failed attempt compared before its timing failed is kept (``earlier``, from
    previous calls too): its undeclared differences fail the run."""
    seen = list(earlier)
    for attempt in range(1, ATTEMPTS + 1):
        # Short directories: unix socket paths are limited to 107 bytes.
        workdir = pathlib.Path(tempfile.mkdtemp(prefix="kc"))
        began = time.monotonic()
        try:
            twin = await factory(line)
            result = await Run(scenario, line, twin, workdir, gohelper).execute()
            result.attempts = attempt
            result.earlier = seen
            result.verdict = dataclasses.replace(
                result.verdict, earlier=_undeclared(scenario, line, seen)
            )
            return result
        except TimingError as exc:
            seen += exc.observed
            if attempt == ATTEMPTS:
                verdict = _compare.classify(scenario, line, [], _undeclared(scenario, line, seen))
                return RunResult(
                    scenario.name, line, "", time.monotonic() - began, [], verdict,
                    f"timing could not be kept in {ATTEMPTS} attempts: {exc}", ATTEMPTS,
                    timing=True, earlier=seen,
                )  # fmt: skip
        finally:
            if not keep:
                shutil.rmtree(workdir, ignore_errors=True)
    raise AssertionError("unreachable")


def _undeclared(
    scenario: sc.Scenario, line: str, observed: Sequence[_compare.Observed]
) -> list[_compare.Observed]:
    """Of what failed attempts observed, what no declaration of the line has."""
    tally = _compare.Tally(_compare.declared_on(scenario, line), scenario)
    return [o for o in observed if not tally.covering(o)]


async def run_all(
    scenarios: Sequence[sc.Scenario],
    line: str,
    factory: TwinFactory,
    *,
    concurrency: int = 24,
    gohelper: _godriver.GoHelperEnv | None = None,
) -> list[RunResult]:
    """Every scenario that names ``line``, at most ``concurrency`` at a time (``gohelper``:
    the kube-apiserver and driver builds of scenarios with a Go helper driver)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(scenario: sc.Scenario) -> RunResult:
        async with gate:
            return await run_one(scenario, line, factory, gohelper=gohelper)

    quiet = logging.getLogger("kubelet_dra")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # drivers misbehave on purpose
    try:
        chosen = [s for s in scenarios if line in s.lines]
        results = list(await asyncio.gather(*(one(s) for s in chosen)))
        # A run whose timing failed among many concurrent runs (on a machine loaded by
        # something else too) gets its attempts again on its own; a run that showed a
        # difference never does.
        for i, result in enumerate(results):
            if result.timing:
                results[i] = await run_one(
                    chosen[i], line, factory, gohelper=gohelper, earlier=result.earlier
                )
                results[i].alone = True
        return results
    finally:
        quiet.setLevel(level)  # later tests in this process read our logs


def _prepared(devices: Sequence[claims_mod.PreparedDevice]) -> list[list[Any]]:
    """A claim's prepared devices as comparable, order-free rows."""
    return sorted(
        [d.driver, d.pool, d.device, sorted(d.request_names), list(d.cdi_ids)] for d in devices
    )
