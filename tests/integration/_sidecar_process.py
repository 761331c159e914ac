"""Run ``python -m kubelet_dra run`` as a subprocess for the sidecar tests.

The sidecar is started with asyncio's subprocess support so that the test's
event loop keeps serving an in-process ``FakeDriver`` while the sidecar runs.
Its stderr is collected line by line (the metrics address is read from it).
Tuning settings that have no flag (poll intervals, backoff) are passed as
``KUBELET_DRA_*`` environment variables, as pydantic-settings reads them.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from kubelet_dra import settings
from kubelet_dra.status import podstatus
from kubelet_dra.testing import FakeApiServer, eventually, make_claim, make_pod
from kubelet_dra.testing._eventually import describe

from ._driver_fixtures import NODE, PIPELINE, make_settings

ROOT = pathlib.Path(__file__).resolve().parents[2]
DRIVER = "gpu.example.com"
FAST_ENV = {
    "KUBELET_DRA_REGISTRY_POLL_INTERVAL": "0.05",
    "KUBELET_DRA_STREAM_BACKOFF_INITIAL": "0.05",
    "KUBELET_DRA_STREAM_BACKOFF_MAX": "0.2",
    "KUBELET_DRA_WRITE_WINDOW": "0.01",
    "KUBELET_DRA_STORE_FLUSH_INTERVAL": "0.05",
}
__all__ = [
    "DRIVER",
    "FAST_ENV",
    "NODE",
    "ROOT",
    "SidecarExited",
    "SidecarProcess",
    "base_env",
    "cluster",
    "device",
    "health_of",
    "http_get",
    "pod_health",
    "run_python",
    "settings_for",
]
T = TypeVar("T")
_ADDRESS = re.compile(r"metrics, /healthz and /readyz on http://(\S+)")


def base_env(**extra: str) -> dict[str, str]:
    """The environment without any KUBELET_DRA_*, NODE_NAME or KUBECONFIG of the caller."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("KUBELET_DRA_") and k not in ("NODE_NAME", "KUBECONFIG")
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def run_python(*argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """``python *argv`` from the checkout, as a user would run it; it must exit 0."""
    done = subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def cluster(api: FakeApiServer) -> None:
    """Two pods on our node, one device each; one pod elsewhere that must not be written."""
    api.create_claim(make_claim("gpu-a", results=[(DRIVER, "pool", "gpu-0", "gpu")]))
    api.create_claim(make_claim("gpu-b", results=[(DRIVER, "pool", "gpu-1", "gpu")]))
    api.create_pod(make_pod("train-a", NODE, claims=["gpu-a"]))
    api.create_pod(make_pod("train-b", NODE, claims=["gpu-b"]))
    api.create_pod(make_pod("elsewhere", "node-2", claims=["gpu-a"]))


def settings_for(sockdir: pathlib.Path, api: FakeApiServer, **extra: Any) -> settings.Settings:
    """In-process pipeline settings against ``api``, with fast intervals for tests."""
    return make_settings(tuning=PIPELINE, sockdir=sockdir, api=api, **extra)


def pod_health(api: FakeApiServer, name: str) -> dict[str, tuple[str, str]]:
    """resourceID -> (health, message) in the pod's container ``main``."""
    status = api.get_pod("default", name).get("status") or {}
    entries = podstatus.container_entries(status, "containerStatuses", "main")
    return {
        r["resourceID"]: (r["health"], r.get("message", ""))
        for entry in entries
        for r in entry.get("resources", [])
    }


def health_of(api: FakeApiServer, name: str, device: str) -> str:
    return pod_health(api, name).get(f"{DRIVER}/pool/{device}", ("", ""))[0]


def device(name: str, health: str = "Healthy", **extra: Any) -> dict[str, Any]:
    return {"pool": "pool", "device": name, "health": health, **extra}


class SidecarExited(Exception):
    """The sidecar is gone: no use waiting any longer (not an ``AssertionError``, which
    ``eventually`` would take for "not yet")."""


class SidecarProcess:
    """``python -m kubelet_dra run`` with the given flags; ``async with`` kills it if left."""

    def __init__(
        self,
        sockdir: pathlib.Path,
        api: FakeApiServer,
        *,
        flags: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        metrics: bool = False,
    ) -> None:
        self.state_dir = sockdir / "state"
        self.registry = sockdir / "reg"
        kubeconfig = api.write_kubeconfig(sockdir / "kubeconfig")
        self.argv = [
            sys.executable,
            "-m",
            "kubelet_dra",
            "run",
            "--node-name",
            NODE,
            "--kubeconfig",
            str(kubeconfig),
            "--plugins-registry",
            str(self.registry),
            "--state-dir",
            str(self.state_dir),
            "--metrics-address",
            "127.0.0.1:0" if metrics else "",
            *flags,
        ]
        self.env = base_env(**{**FAST_ENV, **(env or {})})
        self.proc: asyncio.subprocess.Process | None = None
        self.stderr: list[str] = []
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> SidecarProcess:
        self.registry.mkdir(exist_ok=True)
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            cwd=ROOT,
            env=self.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            self.stderr.append(line.decode(errors="replace").rstrip("\n"))

    async def metrics_url(self, timeout: float = 20.0) -> str:
        """``http://host:port`` of the metrics server, read from the sidecar's log."""

        def address() -> str | None:
            found = [m for line in self.stderr if (m := _ADDRESS.search(line))]
            return f"http://{found[0][1]}" if found else None

        url = await self.until(address, timeout, "the metrics address in the log")
        assert url is not None  # eventually returns a truthy answer
        return url

    def check_running(self) -> None:
        assert self.proc is not None
        if self.proc.returncode is not None:
            raise SidecarExited(f"sidecar exited {self.proc.returncode}; stderr:\n{self.log}")

    async def until(
        self, predicate: Callable[[], T], timeout: float = 30.0, what: str | None = None
    ) -> T:
        """:func:`eventually` while the sidecar runs; fail with its log at the deadline or if
        it exits. The default allows for a slow start of a new interpreter on a loaded
        machine (a sidecar that exits fails at once)."""

        def check() -> T:
            self.check_running()
            return predicate()

        try:
            return await eventually(check, what=what or describe(predicate), timeout=timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nstderr:\n{self.log}") from None

    @property
    def log(self) -> str:
        return "\n".join(self.stderr)

    async def stop(self, sig: signal.Signals = signal.SIGTERM) -> tuple[int, float]:
        """Send ``sig``; return the exit code and the seconds it took to exit."""
        assert self.proc is not None
        started = time.monotonic()
        self.proc.send_signal(sig)
        code = await asyncio.wait_for(self.proc.wait(), 10.0)
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        return code, time.monotonic() - started


async def http_get(url: str) -> tuple[int, str]:
    """GET off the event loop (the sidecar's server may answer slowly on purpose)."""

    def fetch() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                return int(answer.status), answer.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode()

    return await asyncio.to_thread(fetch)
