"""``kubectl dra-health``: the command line, the three commands and the watch loop.

Exit status: 0 done; 1 a one-line error (unreachable or forbidden API, missing pod, bad
kubeconfig); 2 a usage error; 3 ``--fail-on`` matched. ``--fail-on`` looks at every device
(``devices``), entry (``pods``) or resource (``describe``) in scope (namespace, node, driver),
whatever ``--health`` or ``--all`` shows. See the "kubectl dra-health" section of
``docs/kubectl.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import queue
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, TextIO

from kubelet_dra import __version__
from kubelet_dra.kube.events import DEVICE_HEALTH_UNKNOWN, DEVICE_HEALTHY, DEVICE_UNHEALTHY
from kubelet_dra.kubectl import _model as model
from kubelet_dra.kubectl import _render as render
from kubelet_dra.kubectl._api import ClaimFetcher, Reader, ToolError
from kubelet_dra.status import claims as claims_mod
from kubelet_dra.status import podjson

PROG = "kubectl dra-health"
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_FAILED_ON = 0, 1, 2, 3
EVENT_REASONS = frozenset({DEVICE_UNHEALTHY, DEVICE_HEALTHY, DEVICE_HEALTH_UNKNOWN})
DEFAULT_SHOWN = frozenset({model.UNHEALTHY, model.UNKNOWN})
WATCH_TIMEOUT = 300  # seconds per watch request; the loop starts the next one
SIGNAL_CHECK = 0.5
"""Longest sleep of a watch's main thread, so that a Ctrl-C taken by another thread is
handled within it (see ``_next_event``)."""
TAINT_REFRESH = 30.0  # seconds a watch reuses the DeviceTaintRules it read
#: ``Settings.pod_condition_type``: its variable and default (a unit test keeps them equal).
CONDITION_TYPE_VARIABLE = "KUBELET_DRA_POD_CONDITION_TYPE"
DEFAULT_CONDITION_TYPE = "DeviceHealthy"
_CLEAR = "\x1b[H\x1b[2J"
Results = dict[claims_mod.ClaimKey, tuple[model.Result, ...]]


def _healths(text: str) -> frozenset[str]:
    values = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        match = next((h for h in model.HEALTH_VALUES if h.lower() == part.lower()), None)
        if match is None:
            raise argparse.ArgumentTypeError(
                f"{part!r} is not one of {', '.join(model.HEALTH_VALUES)}"
            )
        values.add(match)
    if not values:
        raise argparse.ArgumentTypeError("give at least one of Healthy, Unhealthy, Unknown")
    return frozenset(values)


def _common(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """Flags every command takes; on the main parser too (``-A devices`` and ``devices -A``)."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    add = parser.add_argument
    add(
        "-n",
        "--namespace",
        default=default(None),
        help="only pods in this namespace (default: the context's; for devices, every namespace)",
    )
    add("-A", "--all-namespaces", action="store_true", default=default(False),
        help="every namespace (the default of `devices`)")  # fmt: skip
    add("--kubeconfig", default=default(None), help="a kubeconfig file (default: KUBECONFIG)")
    add("--context", default=default(None), help="the kubeconfig context to use")
    add("--node", default=default(None), help="only pods on this node (field selector)")
    add("--driver", default=default(None), help="only devices of this DRA driver")
    add(
        "--fail-on",
        type=_healths,
        default=default(frozenset()),
        metavar="HEALTH[,HEALTH]",
        help="exit 3 when a device in scope has one of these healths, e.g. Unhealthy,Unknown",
    )
    add(
        "--condition-type",
        default=default(None),
        help="our pod condition's type (default: KUBELET_DRA_POD_CONDITION_TYPE or DeviceHealthy)",
    )


def _listing(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--health", type=_healths, default=None, metavar="HEALTH[,HEALTH]",
        help="show these healths (default: Unhealthy,Unknown)")  # fmt: skip
    add("--all", action="store_true", help="show every health, Healthy too")
    add(
        "-o",
        "--output",
        choices=("table", "wide", "json", "yaml"),
        default="table",
        help="wide adds taints and claims (devices) or the node (pods); json and yaml are "
        "the documented kubelet-dra.io/v1alpha1 lists",
    )
    add("-w", "--watch", action="store_true", help="redraw on every change")
    # Bounded watches, for tests and scripts: stop after N outputs or S seconds.
    add("--watch-max-redraws", type=int, default=0, help=argparse.SUPPRESS)
    add("--watch-seconds", type=float, default=0.0, help=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Device health of DRA devices as pods report it (KEP-4680), cluster-wide.",
    )
    # The package's version alone on a line, as ``kubelet-dra-health --version`` prints it.
    parser.add_argument("--version", action="version", version=__version__)
    _common(parser, suppress=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    devices = sub.add_parser("devices", help="one row per device pods report")
    pods = sub.add_parser("pods", help="one row per pod, container and resource")
    describe = sub.add_parser("describe", help="describe pod NAME: the device health of a pod")
    for child in (devices, pods):
        _common(child, suppress=True)
        _listing(child)
    _common(describe, suppress=True)
    describe.add_argument("kind", choices=("pod", "pods", "po"))
    describe.add_argument("name")
    return parser


_DEFAULTS: dict[str, Any] = {
    "namespace": None, "all_namespaces": False, "kubeconfig": None, "context": None,
    "node": None, "driver": None, "fail_on": frozenset(), "condition_type": None,
}  # fmt: skip


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ns = build_parser().parse_args(argv)
    for key, value in _DEFAULTS.items():
        if not hasattr(ns, key):
            setattr(ns, key, value)
    if getattr(ns, "all", False) and getattr(ns, "health", None) is not None:
        build_parser().error("--all and --health exclude each other")
    return ns


@dataclasses.dataclass(frozen=True)
class Scope:
    namespace: str | None  # None: every namespace
    node: str | None
    driver: str | None
    shown: frozenset[str]
    fail_on: frozenset[str]
    condition_type: str
    output: str

    running_only: bool = False  # leave out pods that have terminated

    @property
    def pod_selector(self) -> str:
        """The field selector of the pod list and watch (the server filters)."""
        terms = [f"spec.nodeName={self.node}"] if self.node else []
        if self.running_only:
            terms += ["status.phase!=Succeeded", "status.phase!=Failed"]
        return ",".join(terms)

    @functools.cached_property
    def wanted(self) -> frozenset[str]:
        """What must be computed: what is shown and what ``--fail-on`` looks at."""
        return self.shown | self.fail_on


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    ns = parse(argv)
    stdout = out or sys.stdout
    from kubelet_dra.kubectl import _config  # imports the client: after argument errors

    try:
        conn = _config.connect(ns.kubeconfig, ns.context)
        with conn.client:
            reader = Reader(conn.client)
            if ns.command == "describe":
                return _describe(reader, ns, conn.namespace, stdout)
            return _listing_command(reader, ns, conn.namespace, stdout)
    except ToolError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


def _condition_type(ns: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> str:
    """``--condition-type``, else the sidecar's setting from its variable, else its default.

    Only this one variable is read: building the sidecar's whole ``Settings`` would make an
    unrelated bad ``KUBELET_DRA_*`` value an error here (and importing pydantic-settings
    took a third of a second of start-up).
    """
    if ns.condition_type is not None:
        return str(ns.condition_type)
    return environ.get(CONDITION_TYPE_VARIABLE, DEFAULT_CONDITION_TYPE)


def _scope(ns: argparse.Namespace, context_namespace: str) -> Scope:
    if ns.all_namespaces:
        namespace = None
    elif ns.namespace:
        namespace = ns.namespace
    else:  # `devices` is cluster-wide unless narrowed; `pods` follows kubectl get pods
        namespace = None if ns.command == "devices" else context_namespace
    shown = frozenset(model.HEALTH_VALUES) if ns.all else (ns.health or DEFAULT_SHOWN)
    # A terminated pod keeps its last report (written for its post-mortem, e.g. a Job's
    # podFailurePolicy): `pods` shows it, but it says nothing about the device any more.
    return Scope(
        namespace, ns.node, ns.driver, shown, ns.fail_on, _condition_type(ns), ns.output,
        running_only=ns.command == "devices",
    )  # fmt: skip


# -- devices and pods ----------------------------------------------------------------------


class View:
    """The pods in scope as views, the claims read so far, and rendering of either command."""

    def __init__(self, reader: Reader, scope: Scope, command: str) -> None:
        self.reader, self.scope, self.command = reader, scope, command
        self.pods: dict[tuple[str, str], model.PodView] = {}
        self.results: Results = {}
        self.reported = 0  # devices or entries before the health filter
        self._rules: tuple[float, list[dict[str, Any]]] | None = None
        self.failed = False  # --fail-on matched in the last output

    def load(self) -> str:
        """List every pod in scope; returns the list's resourceVersion."""
        meta: dict[str, str] = {}
        self.pods = {}
        resolve = self.command == "devices" or self.scope.driver is not None
        fetcher = ClaimFetcher(self.reader, self.scope.namespace, model.claim_results)
        with fetcher:
            for page in self.reader.pod_pages(self.scope.namespace, self.scope.pod_selector, meta):
                for pod in page:
                    view = self.apply("ADDED", pod)
                    if resolve and view is not None:
                        # Claims of entries we may show are read while the next pages come.
                        fetcher.want(self._wanted_claims(view))
            found = fetcher.results()
        for key in fetcher.wanted:
            self.results[key] = found.get(key, ())
        return meta.get("resourceVersion", "")

    def _wanted_claims(self, view: model.PodView) -> Iterator[claims_mod.ClaimKey]:
        for res in view.resources:
            claim = view.claim_of(res.entry) if res.health in self.scope.wanted else None
            if claim is not None and claim not in self.results:
                yield claim

    def apply(self, kind: str, pod: Mapping[str, Any]) -> model.PodView | None:
        key = (podjson.namespace(pod), str(podjson.metadata(pod).get("name", "")))
        if kind == "DELETED":
            self.pods.pop(key, None)
            return None
        view = model.pod_view(pod, self.scope.condition_type)
        if view.resources:
            self.pods[key] = view
            return view
        self.pods.pop(key, None)
        return None

    def fetch_claims(self, keys: Iterable[claims_mod.ClaimKey]) -> None:
        missing = sorted(set(keys) - set(self.results))
        found = self.reader.claims(missing, self.scope.namespace)
        for key in missing:
            claim = found.get(key)
            self.results[key] = model.claim_results(claim) if claim is not None else ()

    def render(self) -> tuple[str, bool]:
        """The output and whether ``--fail-on`` matched (kept in ``failed`` too)."""
        text, self.failed = self._devices() if self.command == "devices" else self._pod_rows()
        return text, self.failed

    def _devices(self) -> tuple[str, bool]:
        scope = self.scope
        wanted, self.reported = model.device_groups(self.pods.values(), scope.wanted)
        self.fetch_claims(c for m in wanted.values() for c in model.claims_of(m))
        rows = [model.device_row(k, m, self.results) for k, m in wanted.items()]
        if scope.driver:
            rows = [r for r in rows if model.driver_matches(scope.driver, r.device, r.resource_id)]
        failed = any(r.health in scope.fail_on for r in rows)
        rows = model.sort_devices([r for r in rows if r.health in scope.shown])
        if scope.output != "table" and rows:
            rules = self._taint_rules()
            for row in rows:
                row.taints = model.taints_for(row.device, rules)
        if scope.output in ("json", "yaml"):
            return render.document(model.device_list(rows), scope.output), failed
        return render.devices_table(rows, scope.output == "wide") if rows else "", failed

    def _taint_rules(self) -> list[dict[str, Any]]:
        """DeviceTaintRules, read again when older than TAINT_REFRESH (a watch redraws often)."""
        now = time.monotonic()
        if self._rules is None or now - self._rules[0] >= TAINT_REFRESH:
            self._rules = (now, self.reader.taint_rules() or [])
        return self._rules[1]

    def _pod_rows(self) -> tuple[str, bool]:
        scope = self.scope
        rows = model.pod_rows(self.pods.values())
        self.reported = len(rows)
        rows = [r for r in rows if r.health in scope.wanted]
        if scope.driver:
            rows = self._of_driver(rows, scope.driver)
        failed = any(r.health in scope.fail_on for r in rows)
        rows = [r for r in rows if r.health in scope.shown]
        if scope.output in ("json", "yaml"):
            return render.document(model.pod_list(rows), scope.output), failed
        return render.pods_table(rows, scope.output == "wide") if rows else "", failed

    def _of_driver(self, rows: list[model.PodRow], driver: str) -> list[model.PodRow]:
        claim_of = {id(r): self.pods[(r.namespace, r.name)].claim_of(r.claim) for r in rows}
        self.fetch_claims(c for c in claim_of.values() if c is not None)
        kept = []
        for r in rows:
            claim, view = claim_of[id(r)], self.pods[(r.namespace, r.name)]
            results = self.results[claim] if claim else ()
            device = model.resolve(r.resource_id, r.claim, results, view)
            if model.driver_matches(driver, device, r.resource_id):
                kept.append(r)
        return kept


def _listing_command(
    reader: Reader, ns: argparse.Namespace, context_namespace: str, out: TextIO
) -> int:
    scope = _scope(ns, context_namespace)
    view = View(reader, scope, ns.command)
    version = view.load()
    text, failed = view.render()
    if not ns.watch:
        _emit(text, view, scope, out, first=True)
        return EXIT_FAILED_ON if failed else EXIT_OK
    try:  # the first output inside: an interrupt may land as its write returns
        _emit(text, view, scope, out, first=True)
        failed = _watch(view, version, ns, out, text=text, failed=failed)
    except KeyboardInterrupt:  # the usual end of a watch: the last output decides
        failed = view.failed
    return EXIT_FAILED_ON if failed else EXIT_OK


def _emit(text: str, view: View, scope: Scope, out: TextIO, *, first: bool) -> None:
    tty = out.isatty()
    if not first:
        if tty:
            out.write(_CLEAR)
        elif scope.output == "yaml":
            out.write("---\n")
        elif scope.output != "json":
            out.write("\n")
    if text:
        out.write(text)
    elif scope.output in ("table", "wide"):
        what = "devices" if view.command == "devices" else "device health entries"
        note = f"No {what} with health {','.join(sorted(scope.shown))}"
        note += f" ({view.reported} reported in scope)." if view.reported else " (none reported)."
        # kubectl prints "No resources found" on stderr; in a watch, stdout shows the change.
        print(note, file=out if not first else sys.stderr)
    out.flush()


class _End:
    """The end of one watch request (``error`` set if it broke)."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


def _feed(
    reader: Reader, scope: Scope, version: str, timeout: int, events: queue.Queue[Any]
) -> None:
    """One watch request's events into ``events``, then an :class:`_End`."""
    try:
        for event in reader.watch_pods(scope.namespace, scope.pod_selector, version, timeout):
            events.put(event)
    except BaseException as exc:  # handed to the main thread, which raises it
        events.put(_End(exc))
    else:
        events.put(_End())


def _watch(
    view: View, version: str, ns: argparse.Namespace, out: TextIO, *, text: str, failed: bool
) -> bool:
    """Redraw on every change until interrupted (or the hidden bounds); the last --fail-on.

    A thread reads the watch; the loop applies every event already received before it
    renders, so a burst of pod updates costs one redraw, not one per pod.
    """
    deadline = time.monotonic() + ns.watch_seconds if ns.watch_seconds else None
    redraws = 1
    while deadline is None or time.monotonic() < deadline:
        timeout = WATCH_TIMEOUT
        if deadline is not None:
            timeout = max(1, min(timeout, math.ceil(deadline - time.monotonic())))
        events: queue.Queue[Any] = queue.Queue()
        feed = threading.Thread(
            target=_feed, args=(view.reader, view.scope, version, timeout, events), daemon=True
        )
        feed.start()
        ended = False
        while not ended:
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                return failed
            try:
                batch = [_next_event(events, wait)]
            except queue.Empty:
                return failed
            while not events.empty():
                batch.append(events.get_nowait())
            version, ended = _apply_batch(view, batch, version)
            new_text, failed = view.render()
            if new_text != text:
                text = new_text
                _emit(text, view, view.scope, out, first=False)
                redraws += 1
                if ns.watch_max_redraws and redraws >= ns.watch_max_redraws:
                    return failed
    return failed


def _next_event(events: queue.Queue[Any], wait: float | None) -> Any:
    """``events.get(timeout=wait)``, waking every :data:`SIGNAL_CHECK` seconds.

    Ctrl-C may be delivered to any thread, here often the feed thread blocked in
    its read; Python runs the handler only in the main thread, and only once that
    thread runs again, so a main thread asleep on the queue without a timeout never
    raised ``KeyboardInterrupt`` (a watch that did not end on SIGINT, seen in CI).
    """
    deadline = None if wait is None else time.monotonic() + wait
    while True:
        left = SIGNAL_CHECK if deadline is None else min(SIGNAL_CHECK, deadline - time.monotonic())
        try:
            return events.get(timeout=max(0.0, left))
        except queue.Empty:
            if deadline is not None and time.monotonic() >= deadline:
                raise


def _apply_batch(view: View, batch: list[Any], version: str) -> tuple[str, bool]:
    """Apply watch events; the resourceVersion to resume from and whether the request ended."""
    ended = False
    for item in batch:
        if isinstance(item, _End):
            if item.error is not None:
                raise item.error
            ended = True
            continue
        kind, obj = item
        if kind == "ERROR":
            if obj.get("code") != 410:
                raise ToolError(f"watch of pods: {obj.get('message') or obj}")
            version = view.load()  # too old: list again
            continue
        version = podjson.resource_version(obj) or version
        if kind != "BOOKMARK":
            view.apply(kind, obj)
    return version, ended


# -- describe ------------------------------------------------------------------------------


def _describe(reader: Reader, ns: argparse.Namespace, context_namespace: str, out: TextIO) -> int:
    namespace = ns.namespace or context_namespace
    condition_type = _condition_type(ns)
    pod = reader.pod(namespace, ns.name)
    view = model.pod_view(pod, condition_type)
    keys = [claims_mod.ClaimKey(namespace, name) for name in sorted(set(view.claims.values()))]
    found = reader.claims(keys, namespace)
    results = {k: model.claim_results(c) for k, c in found.items()}
    events = [
        e
        for e in reader.pod_events(namespace, ns.name, view.uid)
        if e.get("reason") in EVENT_REASONS
    ]
    out.write(
        render.describe(pod, view, results, events, condition_type=condition_type, now=time.time())
    )
    out.flush()
    resources = view.resources
    if ns.driver:
        resources = tuple(
            r for r in resources
            if model.driver_matches(ns.driver, _device(view, r, results), r.resource_id)
        )  # fmt: skip
    failed = any(r.health in ns.fail_on for r in resources)
    return EXIT_FAILED_ON if failed else EXIT_OK


def _device(
    view: model.PodView,
    res: model.Resource,
    results: Mapping[claims_mod.ClaimKey, Sequence[model.Result]],
) -> model.DeviceId | None:
    claim = view.claim_of(res.entry)
    return model.resolve(res.resource_id, res.entry, results.get(claim, ()) if claim else (), view)


def entry_point() -> None:
    """The console script ``kubectl-dra_health``."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    sys.exit(main())
