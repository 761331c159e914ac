"""The ``kubelet-dra-health`` command: the sidecar and the tools.

The only module that configures logging and handles signals. Subcommands:

- ``run``: the sidecar (observer role), flags in :data:`RUN_FLAGS`, each also
  read from its environment variable through ``settings.Settings``;
- ``demo``: the whole pipeline on one machine (``commands/demo.py``);
- ``watch``: tail a driver's health stream (``commands/watch.py``);
- ``fake-driver``: run the test kit's DRA driver (``testing/fakedriver_control.py``);
- ``cache show``: read a health cache offline (``commands/cache.py``).

Exit codes: 0 success, 1 runtime failure, 2 bad flags or configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Coroutine, Sequence
from typing import Any

import pydantic

from kubelet_dra import __version__, errors
from kubelet_dra import settings as settings_mod
from kubelet_dra.commands import cache

EXIT_FAILURE = 1
EXIT_USAGE = 2

# flag -> (Settings field, environment variable, help)
RUN_FLAGS: dict[str, tuple[str, str, str]] = {
    "--node-name": ("node_name", "NODE_NAME", "handle only pods with spec.nodeName == NAME"),
    "--kubeconfig": (
        "kubeconfig",
        "KUBECONFIG",
        "API server to use (default: in-cluster, else ~/.kube/config)",
    ),
    "--plugins-registry": (
        "plugins_registry",
        "KUBELET_DRA_PLUGINS_REGISTRY",
        "where drivers' registration sockets appear",
    ),
    "--state-dir": ("state_dir", "KUBELET_DRA_STATE_DIR", "the persistent health cache"),
    "--pod-resources-socket": (
        "pod_resources_socket",
        "KUBELET_DRA_POD_RESOURCES_SOCKET",
        "the kubelet's PodResources API, whose answers name devices by their CDI device IDs "
        "(default /var/lib/kubelet/pod-resources/kubelet.sock); empty disables",
    ),
    "--kubelet-field-grace": (
        "kubelet_field_grace",
        "KUBELET_DRA_KUBELET_FIELD_GRACE",
        "auto beside a kubelet: seconds a pod's first field write waits for the "
        "kubelet's own entries (default 20); 0 disables",
    ),
    "--health-timeout": (
        "health_timeout",
        "KUBELET_DRA_HEALTH_TIMEOUT",
        "node default lease in seconds; a device's positive timeout wins",
    ),
    "--container-status": (
        "container_status",
        "KUBELET_DRA_CONTAINER_STATUS",
        "write allocatedResourcesStatus: auto (unless the kubelet does), on, off",
    ),
    "--pod-condition-type": (
        "pod_condition_type",
        "KUBELET_DRA_POD_CONDITION_TYPE",
        "pod condition type (default DeviceHealthy); empty disables",
    ),
    "--metrics-address": (
        "metrics_address",
        "KUBELET_DRA_METRICS_ADDRESS",
        "HOST:PORT for /metrics /healthz /readyz (default 127.0.0.1:9464); empty disables",
    ),
    # Load limits: docs/scaling.md says at which cluster size each matters.
    "--api-qps": (
        "api_qps",
        "KUBELET_DRA_API_QPS",
        "API requests per second of the status writer and events (default 50)",
    ),
    "--api-burst": (
        "api_burst",
        "KUBELET_DRA_API_BURST",
        "API request burst of the status writer and events (default 100)",
    ),
    "--write-concurrency": (
        "write_concurrency",
        "KUBELET_DRA_WRITE_CONCURRENCY",
        "pod status writes in flight at once (default 8)",
    ),
    "--pod-list-page-size": (
        "pod_list_page_size",
        "KUBELET_DRA_POD_LIST_PAGE_SIZE",
        "pods per page when the node's pods are listed again (default 10; 0 = one answer)",
    ),
    "--malloc-trim-interval": (
        "malloc_trim_interval",
        "KUBELET_DRA_MALLOC_TRIM_INTERVAL",
        "seconds between a full garbage collection and glibc malloc_trim giving freed heap "
        "back (default 60; 0 = never)",
    ),
    "--malloc-arena-max": (
        "malloc_arena_max",
        "KUBELET_DRA_MALLOC_ARENA_MAX",
        "glibc malloc arenas at most (default 2; 0 = glibc's default; MALLOC_ARENA_MAX wins)",
    ),
    "--malloc-trim-threshold": (
        "malloc_trim_threshold",
        "KUBELET_DRA_MALLOC_TRIM_THRESHOLD",
        "bytes free at the top of a glibc heap that free() gives back, fixed (default 131072; "
        "0 = glibc's dynamic threshold; MALLOC_TRIM_THRESHOLD_ wins)",
    ),
    # The taint bridge (docs/remediation.md).
    "--taint-effect": (
        "taint_effect",
        "KUBELET_DRA_TAINT_EFFECT",
        "DeviceTaintRule effect for unhealthy devices: off (default), None, NoSchedule, NoExecute",
    ),
    "--taint-after": (
        "taint_after",
        "KUBELET_DRA_TAINT_AFTER",
        "seconds a device stays Unhealthy before it is tainted (default 10; 0 = at once)",
    ),
    "--taint-unknown-after": (
        "taint_unknown_after",
        "KUBELET_DRA_TAINT_UNKNOWN_AFTER",
        "seconds a device stays Unknown before it is tainted (default: never)",
    ),
    "--untaint-after": (
        "untaint_after",
        "KUBELET_DRA_UNTAINT_AFTER",
        "seconds a tainted device stays Healthy before its rule goes (default 60)",
    ),
    "--taint-key": (
        "taint_key",
        "KUBELET_DRA_TAINT_KEY",
        "the taint's key (default kubelet-dra.io/unhealthy); its value is the health",
    ),
}

#: Flags with a fixed set of values.
_CHOICES: dict[str, list[str]] = {
    "--container-status": [m.value for m in settings_mod.ContainerStatusMode],
    "--taint-effect": [m.value for m in settings_mod.TaintEffect],
}


class _Parser(argparse.ArgumentParser):
    """argparse, but errors are one line on stderr and exit 2."""

    def error(self, message: str) -> Any:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``command="run"`` only what ``run`` needs.

    The other tools (demo, watch, the fake driver) import the test kit and
    YAML at module level; a sidecar that starts with ``run`` must not pay for
    them (about a tenth of a restart's time to ready).
    """
    parser = _Parser(
        prog="kubelet-dra-health",
        description="The kubelet's DRA device-health pipeline: sidecar, demo and tools.",
    )
    parser.add_argument("--version", action="version", version=__version__)
    _add_logging_flags(parser)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_run_parser(commands)
    if command != "run":
        _add_optional_commands(commands)
        cache.add_parser(commands)
    return parser


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (its first word that is not a flag), if any."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def _add_logging_flags(parser: argparse.ArgumentParser, *, repeated: bool = False) -> None:
    # Accepted before or after the subcommand; SUPPRESS keeps the subcommand's
    # copy from resetting a value given before it.
    verbose_default: Any = argparse.SUPPRESS if repeated else 0
    format_default: Any = argparse.SUPPRESS if repeated else "text"
    parser.add_argument(
        "-v", "--verbose", action="count", default=verbose_default, help="more logs"
    )
    parser.add_argument("--log-format", choices=["text", "json"], default=format_default)


def _add_run_parser(commands: Any) -> None:
    run = commands.add_parser("run", help="run the sidecar next to DRA drivers")
    for flag, (_field, env, text) in RUN_FLAGS.items():
        run.add_argument(flag, default=None, choices=_CHOICES.get(flag), help=f"{text} [env {env}]")
    # The earlier manifests' flag, kept so that they still start: accepted and ignored.
    run.add_argument(
        "--kubelet-root-dir",
        dest="deprecated_kubelet_root_dir",
        default=None,
        help="deprecated and ignored: names come from --pod-resources-socket "
        "[env KUBELET_DRA_KUBELET_ROOT_DIR]",
    )
    _add_logging_flags(run, repeated=True)
    run.set_defaults(handler=_cmd_run)


def _add_optional_commands(commands: Any) -> None:
    # Each tool registers itself; imported here so `run` does not pay for them
    # (build_parser("run") leaves them out).
    from kubelet_dra.commands import demo, watch
    from kubelet_dra.testing import fakedriver_control

    demo.add_parser(commands)
    watch.add_watch_parser(commands)
    fakedriver_control.add_fake_driver_parser(commands)


def run_settings(ns: argparse.Namespace) -> settings_mod.Settings:
    """Flags over environment over defaults; raises ConfigError on bad values.

    The error names the flag and its environment variable, not the Settings
    field, since that is what the user typed.
    """
    given = {field: getattr(ns, field) for field, _, _ in RUN_FLAGS.values()}
    values = {k: v for k, v in given.items() if v is not None}
    if "kubeconfig" not in values and os.environ.get("KUBECONFIG") == "":
        # An empty KUBECONFIG means "unset" to kubectl; pydantic would read it as ".".
        values["kubeconfig"] = None
    if getattr(ns, "deprecated_kubelet_root_dir", None) or os.environ.get(
        "KUBELET_DRA_KUBELET_ROOT_DIR"
    ):
        # The earlier manifests' flag and variable: `run` no longer reads the kubelet's files.
        logging.getLogger(__name__).warning(
            "--kubelet-root-dir (KUBELET_DRA_KUBELET_ROOT_DIR) is ignored: run names devices "
            "from the kubelet's PodResources API (--pod-resources-socket); the kubelet root "
            "dir need not be mounted"
        )
    values["kubelet_root_dir"] = None
    try:
        return settings_mod.Settings(**values)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        raise errors.ConfigError(f"invalid {_where(first['loc'])}: {first['msg']}") from exc


def _where(loc: tuple[int | str, ...]) -> str:
    field = str(loc[0]) if loc else ""
    for flag, (name, env, _text) in RUN_FLAGS.items():
        if field in (name, env, f"KUBELET_DRA_{name.upper()}"):
            return f"{flag} (or {env})"
    return field or "settings"


def _cmd_run(ns: argparse.Namespace) -> int:
    from kubelet_dra import kube, memtrim, metrics, sidecar

    settings = run_settings(ns)
    if not settings.node_name:
        raise errors.ConfigError("--node-name (or NODE_NAME) is required")
    if settings.metrics_address:
        metrics.parse_address(settings.metrics_address)
    # Credentials are checked before anything starts, so a bad kubeconfig is
    # one line on stderr and exit 2, not a log of a half-started sidecar.
    client = kube.load_client(settings.kubeconfig)
    # Before the sidecar makes any thread: an arena made already stays (memtrim.cap_arenas).
    memtrim.cap_arenas(settings.malloc_arena_max)
    memtrim.fix_trim_threshold(settings.malloc_trim_threshold)
    code = _run_loop(_serve(sidecar.Sidecar(settings, api_client=client)))
    _exit_if_threads_block(code)
    return code


def _run_loop(main: Coroutine[Any, Any, int]) -> int:
    """``asyncio.run`` without waiting for blocked worker threads at the end.

    ``asyncio.run`` joins the default executor, and a Kubernetes call stuck on
    a slow API server holds one of its threads for as long as the request's
    timeout. The sidecar must exit within seconds of SIGTERM, and by the time
    the loop ends the state file is flushed and closed, so such a call is
    abandoned instead (see :func:`_exit_if_threads_block`).
    """
    loop = asyncio.new_event_loop()
    executor = concurrent.futures.ThreadPoolExecutor(thread_name_prefix="kubelet-dra-io")
    loop.set_default_executor(executor)
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            _cancel_remaining(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            executor.shutdown(wait=False, cancel_futures=True)
            loop.close()


def _cancel_remaining(loop: asyncio.AbstractEventLoop) -> None:
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


def _exit_if_threads_block(code: int, grace: float = 0.5) -> None:
    """Exit now if worker threads (blocked API calls) would hold the interpreter open."""
    deadline = time.monotonic() + grace
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join(max(0.0, deadline - time.monotonic()))
    busy = [t.name for t in threading.enumerate() if t.is_alive() and not t.daemon]
    if len(busy) > 1:  # the main thread is always there
        logging.getLogger(__name__).info(
            "abandoning %d API calls still in flight; the state file is closed", len(busy) - 1
        )
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


async def _serve(sidecar: Any) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with sidecar:
        logging.getLogger(__name__).info("sidecar running; SIGTERM or SIGINT to stop")
        await stop.wait()
    return 0


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log collectors."""

    def format(self, record: logging.LogRecord) -> str:
        """``ts``, ``level``, ``logger``, ``msg`` and ``exc`` when there is one."""
        entry = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(verbosity: int, fmt: str) -> None:
    level = {0: logging.INFO, 1: logging.DEBUG}.get(verbosity, logging.DEBUG)
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Chatty libraries stay at WARNING unless -vv; sqlitedict logs a full
    # traceback for a file we already report in one line.
    for name in ("kubernetes", "urllib3", "grpc", "asyncio"):
        logging.getLogger(name).setLevel(logging.WARNING if verbosity < 2 else logging.DEBUG)
    logging.getLogger("sqlitedict").setLevel(logging.CRITICAL if verbosity < 2 else logging.DEBUG)


def main(argv: Sequence[str] | None = None) -> int:
    # gRPC's C core logs to stderr on its own (GOAWAY notices at INFO); keep our
    # stderr to our own log lines unless the user asked for its verbosity.
    # Set before build_parser(), which imports grpc.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    parser = build_parser(_command(sys.argv[1:] if argv is None else argv))
    ns = parser.parse_args(argv)
    configure_logging(ns.verbose, ns.log_format)
    try:
        return int(ns.handler(ns))
    except errors.ConfigError as exc:
        print(f"kubelet-dra-health: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 0
