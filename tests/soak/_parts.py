"""The soak's processes: the sidecar, the fake drivers, and the state dir on a tmpfs.

Every part is a real process so that SIGKILL is real: the sidecar is ``python -m
kubelet_dra run`` (its stderr appended to one log for all its lives), each driver is
``python -m kubelet_dra fake-driver`` (as ``tests/faults/test_driver_restarts.py`` runs
it) scripted over its JSON-lines control socket by a small blocking client (the soak's
conductor is threads, not a loop). The state dir is ``tests/faults/_tmpfs.Tmpfs``:
filled for a full disk, remounted read-only for a read-only one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from kubelet_dra.state import store
from tests.faults._tmpfs import Tmpfs

from . import _schedule as plan

ROOT = Path(__file__).resolve().parents[2]
NODE = "soak-node"
POOL = "pool"


def driver_name(index: int) -> str:
    return f"gpu{index}.soak.example.com"


def device_name(index: int) -> str:
    return f"dev-{index}"


def resource_id(driver: int, device: int) -> str:
    return f"{driver_name(driver)}/{POOL}/{device_name(device)}"


def parse_env(items: list[str]) -> dict[str, str]:
    """``NAME=VALUE`` items as a dict; ``ValueError`` for an item without a name."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--sidecar-env wants NAME=VALUE, not {item!r}")
        out[name.strip()] = value
    return out


def env() -> dict[str, str]:
    out = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("KUBELET_DRA_") and k not in ("NODE_NAME", "KUBECONFIG")
    }
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), out.get("PYTHONPATH")]))
    return out


def trace_env(where: Path, every: float = 60.0) -> dict[str, str]:
    """The sidecar's environment for ``--trace-python-memory`` (``tracehook/``)."""
    hook = Path(__file__).resolve().parent / "tracehook"
    return {
        "PYTHONTRACEMALLOC": "12",  # frames kept per allocation
        "KDRA_SOAK_TRACE_DIR": str(where),
        "KDRA_SOAK_TRACE_EVERY": f"{every:g}",
        "PYTHONPATH": os.pathsep.join([str(hook), env()["PYTHONPATH"]]),
    }


class Driver:
    """One fake driver process; ``start(devices)`` after a kill serves them again.

    It registers in a directory of its own under ``registry`` (the sidecar's, or the
    real kubelet's ``plugins_registry``: both watch subdirectories). ``prepare``
    (``"<namespace>/<claim>"`` -> devices) is what its ``NodePrepareResources`` answers
    a kubelet for each claim, kept across restarts.
    """

    def __init__(
        self,
        index: int,
        sockets: Path,
        logs: Path,
        *,
        registry: Path | None = None,
        prepare: dict[str, list[dict[str, str]]] | None = None,
    ) -> None:
        self.index = index
        self.name = driver_name(index)
        self.sockets = sockets
        self.registry_root = registry or sockets / "reg"
        self.prepare = prepare or {}
        self.log = logs / f"driver-{index}.log"
        self.generation = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    @property
    def registry(self) -> Path:
        return self.registry_root / f"d{self.index}g{self.generation}"

    @property
    def plugin_dir(self) -> Path:
        return self.sockets / f"p{self.index}g{self.generation}"

    @property
    def control(self) -> Path:
        return self.sockets / f"ctl{self.index}.sock"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, devices: list[dict[str, Any]], *, new_socket: bool = False) -> None:
        if new_socket:
            # A new pod of the driver: new sockets; the old pod's dirs go with it, as the
            # kubelet's removal of its volumes would take them.
            old = (self.registry, self.plugin_dir)
            self.generation += 1
            for path in old:
                shutil.rmtree(path, ignore_errors=True)
        self.registry.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable, "-m", "kubelet_dra", "fake-driver", "--name", self.name,
            "--registry", str(self.registry), "--plugin-dir", str(self.plugin_dir),
            "--control", str(self.control), "--devices", json.dumps(devices),
            "--resend", str(plan.RESEND),
        ]  # fmt: skip
        if self.prepare:
            argv += ["--prepare-claims", json.dumps(self.prepare)]
        with self.log.open("ab") as err:
            self.proc = subprocess.Popen(
                argv, cwd=ROOT, env=env(), stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=err,
            )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line or json.loads(line).get("event") != "ready":
            raise RuntimeError(f"driver {self.index} did not start: {line!r}")

    def kill(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()  # read once for "ready"; never left to the GC

    def streams_opened(self) -> tuple[int, int] | None:
        """(this driver process's pid, the health streams opened to it), or None if down."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return None
        try:
            calls = self.request("calls")["calls"]
        except (OSError, RuntimeError, ValueError):
            return None
        opened = sum(n for name, n in calls.items() if name.startswith("NodeWatchResources/"))
        return proc.pid, opened

    def request(self, op: str, **args: Any) -> dict[str, Any]:
        with self._lock, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(str(self.control))
            sock.sendall(json.dumps({"op": op, **args}).encode() + b"\n")
            answer: dict[str, Any] = json.loads(sock.makefile("rb").readline())
        if not answer.get("ok"):
            raise RuntimeError(answer.get("error", "control request failed"))
        return answer


class Sidecar:
    """``kubelet-dra-health run`` on a fixed metrics port, restarted after each fault."""

    def __init__(
        self,
        *,
        kubeconfig: Path,
        registry: Path,
        state_dir: Path,
        log: Path,
        port: int,
        kubelet_root: Path | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.port = port
        self.extra_env = dict(extra_env or {})
        self.state_dir = state_dir
        self.log = log
        self.argv = [
            sys.executable, "-m", "kubelet_dra", "run", "--node-name", NODE,
            "--kubeconfig", str(kubeconfig), "--plugins-registry", str(registry),
            "--state-dir", str(state_dir), "--metrics-address", f"127.0.0.1:{port}",
            # Beside the real kubelet: its PodResources socket, as a DaemonSet mounts it;
            # else none, so that no kubelet on this machine is taken for ours.
            "--pod-resources-socket",
            str(kubelet_root / "pod-resources" / "kubelet.sock") if kubelet_root else "",
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None
        self.lives = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def start(self) -> None:
        with self.log.open("ab") as err:
            err.write(f"--- life {self.lives} at {time.time():.1f} ---\n".encode())
            err.flush()
            self.proc = subprocess.Popen(
                self.argv, cwd=ROOT, env={**env(), **self.extra_env},
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            )  # fmt: skip
        self.lives += 1

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until ``/healthz`` answers 200 (the loop turns and the metrics port is up)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"sidecar exited: see {self.log.name}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{self.metrics_url}/healthz", timeout=2) as answer,
            ):
                if answer.status == 200:
                    return
            time.sleep(0.1)
        raise TimeoutError("sidecar not healthy in time")

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def signal(self, sig: signal.Signals, timeout: float = 30.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None


class StateDisk:
    """The sidecar's state dir on a 16 MiB tmpfs: full or read-only on demand."""

    SIZE = "16m"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.mount = Tmpfs(path, self.SIZE)
        self._filler = path / "filler"
        self.lock = threading.Lock()
        """Held for the whole of one disk fault."""

    def fill(self) -> None:
        chunk = b"\0" * (1 << 20)
        with contextlib.suppress(OSError), self._filler.open("wb") as f:
            while True:
                f.write(chunk)
                f.flush()

    def unfill(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._filler.unlink()

    def readonly(self, on: bool) -> None:
        self.mount.remount("ro" if on else "rw")

    def state_bytes(self) -> dict[str, int]:
        """Bytes of the state dir (``total``), of its main file (``db``) and its WAL (``wal``)."""
        sizes = {"total": 0, "db": 0, "wal": 0}
        for entry in self.path.iterdir():
            if entry.name != self._filler.name and entry.is_file():
                with contextlib.suppress(FileNotFoundError):
                    size = entry.stat().st_size
                    sizes["total"] += size
                    if entry.name == store.FILE_NAME:
                        sizes["db"] = size
                    elif entry.name == store.FILE_NAME + "-wal":
                        sizes["wal"] = size
        return sizes

    def close(self) -> None:
        self.mount.close()


def proc_stats(pid: int) -> dict[str, float] | None:
    """RSS (MiB), threads and open fds of ``pid``; ``None`` if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)

    def mib(name: str) -> float:
        return float(fields.get(name, "0 kB").split()[0]) / 1024

    return {
        "rss_mb": mib("VmRSS"),
        # The RSS's parts: anonymous memory (malloc's heaps, CPython's arenas, thread
        # stacks) and pages of files (the interpreter's and the libraries' code, mapped
        # on first use), so that a step can be told apart (docs/memory.md).
        "rss_anon_mb": mib("RssAnon"),
        "rss_file_mb": mib("RssFile") + mib("RssShmem"),
        "threads": float(fields["Threads"]),
        "fds": float(fds),
    }


def tcp_connections(pid: int, port: int) -> int | None:
    """TCP connections of ``pid`` to a local ``port`` (the fault proxy's: the API server's
    connections, urllib3's and the status-PATCH pool's), from ``/proc/<pid>/net/tcp``
    and the socket inodes among its fds; ``None`` if it is gone."""
    try:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        table = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    except (FileNotFoundError, ProcessLookupError):
        return None
    wanted = f":{port:04X}"
    # Columns: sl local_address rem_address st ... uid timeout inode.
    return sum(1 for row in map(str.split, table) if row[2].endswith(wanted) and row[9] in inodes)


def smaps(pid: int) -> str | None:
    """``/proc/<pid>/smaps`` (every mapping with its resident size), or ``None``."""
    try:
        return Path(f"/proc/{pid}/smaps").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None


#: Kubelet lines the soak can run beside (both know the message gate, added in 1.36).
KUBELET_LINES = ("1.37", "1.38")
KUBELET_GATES = {"ResourceHealthStatus": True, "ResourceHealthStatusMessage": True}


def kubelet_unavailable(line: str) -> str | None:
    """Why the real kubelet of ``line`` cannot run beside the soak here, or ``None``."""
    from tests.e2e import _node
    from tests.interop import _build

    if line not in KUBELET_LINES:
        return f"kubelet line {line} not one of {', '.join(KUBELET_LINES)}"
    reason = _node.unavailable_reason()
    if reason:
        return reason
    for name in (f"kubelet-{line}", "fakecri"):
        try:
            _build.ensure(name)
        except (_build.BuildUnavailable, _build.BuildFailed) as exc:
            return f"{name} unavailable: {exc}"
    return None


def choose_kubelet(choice: str) -> tuple[str | None, str | None]:
    """``(line to run, why not)`` for ``auto`` (1.37 where it can run), ``none`` or a line."""
    if choice == "none":
        return None, None
    line = "1.37" if choice == "auto" else choice
    reason = kubelet_unavailable(line)
    return (line, None) if reason is None else (None, f"no real kubelet {line}: {reason}")
