"""Run the scripted Go interop driver (``driver/current`` or ``driver/v035``) as a subprocess.

:class:`DriverProcess` starts one driver binary, writes its JSON control file atomically,
collects the JSON event lines it prints on stdout (``ready``, ``call``, ``stream_open``,
``sent``, ``stream_closed``, ...) and stops it. The control file format is defined by
``driver/common/control.go``; :func:`device` builds one entry of its ``devices`` list.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

Event = dict[str, Any]

DEFAULT_DRIVER_NAME = "interop.kubelet-dra.test"


def device(
    device_name: str,
    health: str = "HEALTHY",
    *,
    pool: str = "pool-0",
    message: str = "",
    timeout_seconds: int = 0,
    last_updated: int = 0,
) -> dict[str, Any]:
    """One scripted device health entry of the control file."""
    entry: dict[str, Any] = {"pool": pool, "device": device_name, "health": health}
    if message:
        entry["message"] = message
    if timeout_seconds:
        entry["timeout_seconds"] = timeout_seconds
    if last_updated:
        entry["last_updated"] = last_updated
    return entry


class DriverProcess:
    """One running interop driver. Use :meth:`start`, then :meth:`stop` (or the fixture)."""

    def __init__(
        self,
        binary: Path,
        *,
        driver_name: str,
        registry_dir: Path,
        plugin_data_dir: Path,
        control_file: Path,
        log_dir: Path,
        kubeconfig: Path | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.binary = binary
        self.driver_name = driver_name
        self.registry_dir = registry_dir
        self.plugin_data_dir = plugin_data_dir
        self.control_file = control_file
        self.stderr_path = log_dir / f"{driver_name}.stderr.log"
        self.kubeconfig = kubeconfig
        self.extra_args = tuple(extra_args)
        self.events: list[Event] = []
        self._cond = threading.Condition()
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    @property
    def registration_socket(self) -> Path:
        """``<registry dir>/<driver>-reg.sock``, the socket the kubelet's watcher finds."""
        return self.registry_dir / f"{self.driver_name}-reg.sock"

    @property
    def dra_socket(self) -> Path:
        """The DRA service socket (``<plugin data dir>/dra.sock``), GetInfo's endpoint."""
        return self.plugin_data_dir / "dra.sock"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def helper_version(self) -> str:
        ready = self.find("ready")
        return str(ready[0]["helper_version"]) if ready else ""

    def control(self, script: Mapping[str, Any]) -> None:
        """Replace the control file atomically; the driver applies it within ~100 ms."""
        tmp = self.control_file.with_name(self.control_file.name + ".tmp")
        tmp.write_text(json.dumps(script))
        os.replace(tmp, self.control_file)

    def start(self, script: Mapping[str, Any] | None = None, timeout: float = 30.0) -> None:
        """Write the initial script, start the driver and wait for its ready line."""
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self.plugin_data_dir.mkdir(parents=True, exist_ok=True)
        self.control(script or {})
        cmd = [
            str(self.binary),
            f"--driver-name={self.driver_name}",
            f"--registry-dir={self.registry_dir}",
            f"--plugin-data-dir={self.plugin_data_dir}",
            f"--control-file={self.control_file}",
            *self.extra_args,
        ]
        if self.kubeconfig is not None:
            cmd.append(f"--kubeconfig={self.kubeconfig}")
        with self.stderr_path.open("ab") as stderr:
            self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr)
        self._reader = threading.Thread(
            target=self._read, name="interop-driver-stdout", daemon=True
        )
        self._reader.start()
        try:
            self.wait_for("ready", timeout=timeout)
        except Exception:
            self.stop()
            raise

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for raw in self._proc.stdout:
            try:
                event = json.loads(raw)
            except ValueError:
                event = {"event": "unparsed", "line": raw.decode(errors="replace")}
            with self._cond:
                self.events.append(event)
                self._cond.notify_all()
        with self._cond:
            self.events.append({"event": "exited", "time": time.time()})
            self._cond.notify_all()

    def find(self, name: str, pred: Callable[[Event], bool] | None = None) -> list[Event]:
        """Events seen so far with this name (and matching ``pred``)."""
        with self._cond:
            return [e for e in self.events if e.get("event") == name and (pred is None or pred(e))]

    def wait_for(
        self,
        name: str,
        pred: Callable[[Event], bool] | None = None,
        *,
        count: int = 1,
        timeout: float = 10.0,
    ) -> list[Event]:
        """Wait until ``count`` matching events were seen; return them all."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = [
                    e for e in self.events if e.get("event") == name and (pred is None or pred(e))
                ]
                if len(found) >= count:
                    return found
                if name != "exited" and any(e.get("event") == "exited" for e in self.events):
                    raise RuntimeError(f"driver exited while waiting for {name!r}: {self.stderr()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"no {count}x {name!r} event within {timeout}s; events: {self.events[-20:]}"
                    )
                self._cond.wait(left)

    def calls(self, method_suffix: str) -> list[Event]:
        """``call`` events (unary RPCs the driver served) whose method ends with the suffix."""
        return self.find("call", lambda e: str(e.get("method", "")).endswith(method_suffix))

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def kill(self) -> int | None:
        """SIGKILL the driver (its sockets stay behind, as after a crash)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
        return self.stop()

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM the driver (SIGKILL after ``timeout``) and return its exit code."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._reader is not None:
            self._reader.join(5)
        if proc.stdout is not None:
            proc.stdout.close()
        return proc.returncode
