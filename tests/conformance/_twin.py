"""Client of the kubelet twin: the kubelet's own DRA manager, one Go binary per upstream line.

The twin (``tests/conformance/twin/<line>``, protocol in ``tests/conformance/PROTOCOL.md``)
runs ``k8s.io/kubernetes/pkg/kubelet/cm/dra`` of one Kubernetes release in-process and is
driven over stdin/stdout with one JSON object per line each way. :class:`Twin` starts it,
sends a command, waits for its one reply line and keeps the process's stderr (klog) for
failure messages; :func:`binary` builds a line once per version and source hash through
``tests/interop/_build.py`` (``BuildUnavailable`` -> the caller skips, ``BuildFailed`` ->
the caller fails).

Run ``python -m tests.conformance._twin [version ...]`` to prebuild lines and print the
build times and binary sizes.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import selectors
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.interop import _build

TWIN_DIR = Path(__file__).resolve().parent / "twin"

#: The upstream lines, oldest first (the newest patch of each minor, then the beta).
LINES: tuple[str, ...] = ("v1.34.4", "v1.35.5", "v1.36.4", "v1.37.2", "v1.38.0-beta.0")

#: Module directory per line (tests/conformance/twin/<dir>): "v1.37.2" -> "v137".
LINE_DIRS: dict[str, str] = {v: "v" + "".join(v[1:].split(".")[:2]) for v in LINES}

#: Lines whose go directive is newer than the installed Go: the toolchain they build with.
TOOLCHAINS: dict[str, str] = {"v1.38.0-beta.0": "go1.27.3"}

#: Health API versions each line's manager watches, newest first (it picks the first one the
#: driver advertises from 1.37 on; up to 1.36 it always opens v1alpha1).
HEALTH_VERSIONS: dict[str, tuple[str, ...]] = {
    "v1.34.4": ("v1alpha1",),
    "v1.35.5": ("v1alpha1",),
    "v1.36.4": ("v1alpha1",),
    "v1.37.2": ("v1", "v1alpha1"),
    "v1.38.0-beta.0": ("v1", "v1alpha1"),
}

#: Lines with the ResourceHealthStatusMessage gate (the message reaches the pod status).
MESSAGE_LINES: frozenset[str] = frozenset({"v1.36.4", "v1.37.2", "v1.38.0-beta.0"})

#: Seconds for one reply; registration, prepare and stop finish in well under a second.
DEFAULT_TIMEOUT = 30.0


def artifact(version: str) -> _build.GoArtifact:
    """The build description of the twin for ``version`` (one of :data:`LINES`)."""
    if version not in LINE_DIRS:
        raise KeyError(f"unknown kubelet line {version!r}; known: {', '.join(LINES)}")
    toolchain = TOOLCHAINS.get(version)
    return _build.GoArtifact(
        name="kubelet-twin",
        version=version,
        module=LINE_DIRS[version],
        binary="kubelet-twin",
        extra_sources=("common",),
        root=TWIN_DIR,
        env=(("GOTOOLCHAIN", toolchain),) if toolchain else (),
    )


def binary(version: str, *, log: bool = True) -> Path:
    """The twin binary for ``version``, built on first use and cached.

    Raises ``_build.BuildUnavailable`` (no Go, no module proxy: skip) or
    ``_build.BuildFailed`` (a compile error: fail).
    """
    return _build.ensure_artifact(artifact(version), log=log)


_OUTCOMES: dict[str, Path | _build.BuildUnavailable | _build.BuildFailed] = {}


def require_binary(version: str) -> Path:
    """:func:`binary` for a test: skips (no Go, no proxy) or fails (compile error).

    The outcome is remembered for the session, so a failed build is not retried per test.
    Call it from a fixture that runs outside the test's timeout (a cold build takes
    minutes), e.g. with ``pytest.mark.timeout(..., func_only=True)``.
    """
    import pytest

    outcome = _OUTCOMES.get(version)
    if outcome is None:
        try:
            outcome = binary(version)
        except (_build.BuildUnavailable, _build.BuildFailed) as exc:
            outcome = exc
        _OUTCOMES[version] = outcome
    if isinstance(outcome, _build.BuildUnavailable):
        pytest.skip(f"kubelet twin {version} unavailable: {outcome.reason}")
    if isinstance(outcome, _build.BuildFailed):
        pytest.fail(f"building the kubelet twin {version} failed: {outcome}", pytrace=False)
    return outcome


class TwinError(Exception):
    """The twin failed: a protocol error, a timeout, or the process died."""


class Twin:
    """One running twin process for a line; every method returns the parsed reply.

    ``ok: false`` replies raise :class:`TwinError` unless ``check=False`` is given (a refusal
    of the kubelet code, such as a refused registration, is then returned as the reply).
    The error message carries the tail of the twin's stderr.
    """

    def __init__(
        self,
        version: str,
        *,
        path: str | os.PathLike[str] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        verbosity: int = 4,
    ) -> None:
        self.version = version
        self.path = Path(path) if path is not None else binary(version)
        self.timeout = timeout
        self.verbosity = verbosity
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=400)
        self._stderr_thread: threading.Thread | None = None
        self._buffer = b""

    # -- process -----------------------------------------------------------

    def launch(self) -> Twin:
        """Start the process (the manager itself starts with :meth:`start`)."""
        if self._proc is not None:
            raise TwinError("already launched")
        self._proc = subprocess.Popen(
            [str(self.path), f"-v={self.verbosity}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self._stderr_thread = threading.Thread(
            target=self._read_stderr, name=f"twin-{self.version}-stderr", daemon=True
        )
        self._stderr_thread.start()
        return self

    def _read_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        for raw in self._proc.stderr:
            self._stderr.append(raw.decode(errors="replace").rstrip("\n"))

    @property
    def stderr(self) -> str:
        """The twin's recent stderr (klog), for failure messages."""
        return "\n".join(self._stderr)

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def close(self) -> None:
        """Ask the twin to stop if it still runs, then make sure the process is gone."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(TwinError, OSError, ValueError):
                self.call({"op": "stop"}, timeout=10.0)
            try:
                proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5.0)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        if self._stderr_thread is not None:
            self._stderr_thread.join(timeout=5.0)
        if proc.stderr is not None:
            proc.stderr.close()

    def __enter__(self) -> Twin:
        return self.launch()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- protocol ----------------------------------------------------------

    def _fail(self, message: str) -> TwinError:
        proc, reader = self._proc, self._stderr_thread
        if proc is not None and proc.poll() is not None and reader is not None:
            # The process is gone, but its last words (a Go panic) may still be in the
            # pipe: read them all first (a CI run once missed the panic this way).
            reader.join(timeout=5.0)
        lines = list(self._stderr)
        # A panic's goroutine dump can outrun the tail: keep its first line too.
        panics = [line for line in lines[:-60] if line.startswith(("panic:", "fatal error:"))]
        return TwinError(
            f"twin {self.version}: {message}\n--- twin stderr (tail) ---\n"
            + "\n".join(panics[:1] + lines[-60:])
        )

    def _read_line(self, deadline: float) -> bytes:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        fd = proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not sel.select(remaining):
                    raise TimeoutError
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise EOFError
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def call(
        self, request: Mapping[str, Any], *, timeout: float | None = None, check: bool = True
    ) -> dict[str, Any]:
        """Send one command and return its reply (see PROTOCOL.md)."""
        proc = self._proc
        if proc is None or proc.stdin is None:
            raise TwinError("not launched")
        if proc.poll() is not None:
            raise self._fail(f"the process has exited with {proc.returncode}")
        limit = self.timeout if timeout is None else timeout
        try:
            proc.stdin.write(json.dumps(request).encode() + b"\n")
            proc.stdin.flush()
            line = self._read_line(time.monotonic() + limit)
        except TimeoutError:
            raise self._fail(f"no reply to {request.get('op')!r} within {limit}s") from None
        except (EOFError, BrokenPipeError):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=2.0)
            raise self._fail(
                f"the process ended (exit {proc.poll()}) during {request.get('op')!r}"
            ) from None
        try:
            reply = json.loads(line)
        except json.JSONDecodeError as exc:
            raise self._fail(f"reply to {request.get('op')!r} is not JSON: {line!r}") from exc
        if not isinstance(reply, dict):
            raise self._fail(f"reply to {request.get('op')!r} is not an object: {line!r}")
        if check and not reply.get("ok"):
            raise self._fail(f"{request.get('op')!r} failed: {reply.get('error')}")
        return reply

    # -- commands ----------------------------------------------------------

    def start(
        self, state_dir: str | os.PathLike[str], node_name: str = "twin-node"
    ) -> dict[str, Any]:
        """Create the manager on ``state_dir`` and start it; the reply names the line."""
        reply = self.call({"op": "start", "stateDir": str(state_dir), "nodeName": node_name})
        if reply.get("version") != self.version:
            raise self._fail(f"built for {reply.get('version')}, expected {self.version}")
        return reply

    def claims(self, claims: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Create or replace ResourceClaims (resource.k8s.io/v1 JSON) in the fake clientset."""
        return self.call({"op": "claims", "claims": list(claims)})

    def register(
        self,
        driver: str,
        endpoint: str | os.PathLike[str],
        services: Sequence[str],
        *,
        check: bool = True,
    ) -> dict[str, Any]:
        """ValidatePlugin then RegisterPlugin, as the kubelet's plugin watcher calls them."""
        return self.call(
            {
                "op": "register",
                "driver": driver,
                "endpoint": str(endpoint),
                "services": list(services),
            },
            check=check,
        )

    def deregister(self, driver: str, endpoint: str | os.PathLike[str]) -> dict[str, Any]:
        return self.call({"op": "deregister", "driver": driver, "endpoint": str(endpoint)})

    def prepare(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        """PrepareResources; a refusal comes back as the reply's ``error``."""
        return self.call({"op": "prepare", "pod": pod})

    def unprepare(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        return self.call({"op": "unprepare", "pod": pod})

    def sync(
        self,
        pods: Iterable[Mapping[str, Any]],
        *,
        settle_ms: int | None = None,
        devices: Iterable[Sequence[str]] = (),
    ) -> dict[str, Any]:
        """Announced pod UIDs since the last sync, each pod's status after the update and
        each of ``devices`` ((driver, pool, device)) as the manager's getHealthInfo reads it.

        ``settle_ms`` (the twin's default: 100) is how long the twin first waits for quiet
        after the last checkpoint write or notification (see PROTOCOL.md).
        """
        request: dict[str, Any] = {"op": "sync", "pods": list(pods), "devices": list(devices)}
        if settle_ms is not None:
            request["settleMs"] = settle_ms
        return self.call(request)

    def pause_updates(self) -> dict[str, Any]:
        """Stop reading ``Updates()`` until the next ``sync`` (a busy kubelet sync loop)."""
        return self.call({"op": "pause_updates"})

    def state(self) -> dict[str, Any]:
        """The ``dra_health_state`` checkpoint: ``state`` (parsed or None) and ``raw``."""
        return self.call({"op": "state"})

    def wait_state(
        self,
        driver: str,
        pool: str,
        device: str,
        *,
        health: str | None = None,
        message: str | None = None,
        absent: bool = False,
        timeout: float = 10.0,
    ) -> dict[str, Any]:
        """Wait until the checkpoint holds the device (with ``health``/``message``) or not."""
        request: dict[str, Any] = {
            "op": "wait_state",
            "driver": driver,
            "pool": pool,
            "device": device,
            "absent": absent,
            "timeoutMs": int(timeout * 1000),
        }
        if health is not None:
            request["health"] = health
        if message is not None:
            request["message"] = message
        return self.call(request, timeout=timeout + DEFAULT_TIMEOUT)

    def stop(self) -> dict[str, Any]:
        """Stop the manager (Manager.Stop where the line has it); the process then exits 0."""
        reply = self.call({"op": "stop"})
        assert self._proc is not None
        try:
            self._proc.wait(timeout=10.0)
        except subprocess.TimeoutExpired:
            raise self._fail("did not exit after stop") from None
        return reply


def main(argv: Sequence[str]) -> int:
    """Prebuild the named lines (all by default); print build times and binary sizes."""
    status = 0
    for version in argv or LINES:
        begin = time.monotonic()
        try:
            path = binary(version)
        except _build.BuildUnavailable as exc:
            print(f"{version}: unavailable: {exc.reason}", flush=True)
            status = max(status, 2)
            continue
        except _build.BuildFailed as exc:
            print(f"{version}: FAILED: {exc}", flush=True)
            status = 1
            continue
        size = path.stat().st_size / 2**20
        print(
            f"{version}: {path} ({size:.1f} MiB; this call {time.monotonic() - begin:.1f}s; "
            f"recorded build {_build.build_info(path)})",
            flush=True,
        )
    return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
