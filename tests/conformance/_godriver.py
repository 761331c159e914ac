"""The interop tests' Go helper driver as a conformance driver, and the claims it reads.

A scenario driver with ``implementation: go-helper`` (or ``go-helper-v0.35``) is served
by the scripted Go driver of ``tests/interop/driver``, built on the upstream
``k8s.io/dynamic-resource-allocation/kubeletplugin`` helper, instead of our FakeDriver.
:class:`GoHelperDriver` gives it the FakeDriver's interface the runner uses
(``set_health``, ``set_silent``, ``end_streams``, ``restart``, ``calls``, ...) by
rewriting the driver's JSON control file (``driver/common/control.go``) and reading the
JSON events it prints.

The helper's ``NodePrepareResources`` fetches every ResourceClaim from a kube-apiserver
and refuses one that is not allocated or whose UID differs from the kubelet's, so a run
with a Go helper driver first creates the scenario's claims in the interop suite's real
kube-apiserver (:class:`ApiClaims`): one namespace per run, the allocation and
``reservedFor`` written with a status update, then read back. Both sides then get the
claims as read back (the server's UIDs and defaults), and both prepare through the Go
driver's own answers. Nothing here mirrors a kubelet file.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import dataclasses
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from kubelet_dra.status.podjson import MutableObj as Obj
from tests.interop._apiserver import KubeApiServer
from tests.interop._driver import DriverProcess

BUILDS: dict[str, str] = {"go-helper": "driver-current", "go-helper-v0.35": "driver-v035"}
"""Scenario ``implementation`` -> the ``tests/interop/_build.py`` artifact serving it."""

POLL_MS = 20
"""The driver's control-file poll interval (its default is 100 ms)."""

_HEALTH = {0: "UNKNOWN", 1: "HEALTHY", 2: "UNHEALTHY"}
_BOOKKEEPING = ("resourceVersion", "managedFields", "generation", "creationTimestamp")


@dataclasses.dataclass(frozen=True)
class GoHelperEnv:
    """What runs with Go helper drivers need: the kube-apiserver and the driver builds."""

    apiserver: KubeApiServer
    binaries: Mapping[str, Path]
    """Scenario ``implementation`` -> driver binary (only those that were built)."""


@contextlib.contextmanager
def started_env(implementations: Iterable[str]) -> Iterator[GoHelperEnv]:
    """Outside pytest (``python -m tests.conformance._suite``): build what is missing,
    start a kube-apiserver of the interop suite's default configuration, stop it after."""
    from tests.interop import _apiserver, _build

    binaries = {i: _build.ensure(BUILDS[i]) for i in sorted(set(implementations))}
    workdir = Path(tempfile.mkdtemp(prefix="kc-apiserver-"))
    server = _apiserver.start_kube_apiserver(
        etcd_bin=_build.ensure("etcd"),
        apiserver_bin=_build.ensure("kube-apiserver"),
        workdir=workdir,
        feature_gates=_apiserver.DEFAULT_FEATURE_GATES,
    )
    try:
        yield GoHelperEnv(server, binaries)
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


# -- the claims in the kube-apiserver ------------------------------------------------------


class ApiClaims:
    """A run's ResourceClaims in the kube-apiserver, in namespaces of their own."""

    def __init__(self, server: KubeApiServer) -> None:
        from tests.interop._cluster import RealCluster

        self._cluster = RealCluster(server)
        self.prefix = f"kc{secrets.token_hex(5)}"

    def namespace(self, scenario_namespace: str) -> str:
        """The run's namespace for a namespace of the scenario (runs share the server)."""
        return f"{self.prefix}-{scenario_namespace}"[:63]

    def create(self, claims: Sequence[Obj]) -> list[Obj]:
        """Create each claim, write its status, and return it as the server has it now
        (minus the bookkeeping the fake clientset of the twin sets itself)."""
        try:
            out = []
            for claim in claims:
                created = self._cluster.create_claim(claim)
                for key in _BOOKKEEPING:
                    created["metadata"].pop(key, None)
                out.append(created)
            return out
        finally:
            self._cluster.close()


# -- the driver ----------------------------------------------------------------------------


def control_device(d: Mapping[str, Any]) -> Obj:
    """A FakeDriver device dict as an entry of the Go driver's ``devices`` list."""
    health = d["health"]
    health = _HEALTH[health] if isinstance(health, int) else str(health).upper()
    out: Obj = {"pool": d["pool"], "device": d["device"], "health": health}
    if d.get("message"):
        out["message"] = d["message"]
    if d.get("timeout_seconds"):
        out["timeout_seconds"] = d["timeout_seconds"]
    return out


class GoHelperDriver:
    """One endpoint of a driver, served by the Go helper driver process."""

    def __init__(
        self,
        name: str,
        *,
        binary: Path,
        workdir: Path,
        kubeconfig: Path,
        prepare_devices: Sequence[Mapping[str, Any]],
        unimplemented: bool,
    ) -> None:
        self.name = name
        self.binary = binary
        self.workdir = workdir
        self.kubeconfig = kubeconfig
        self.prepare_devices = [
            {k: v for k, v in d.items() if k != "share_id"} for d in prepare_devices
        ]
        self.silent = False
        self._unimplemented = unimplemented
        self._devices: list[Obj] | None = None
        self._stream_error: Obj | None = None
        self.process: DriverProcess | None = None
        self.supported_versions: list[str] = []
        self.endpoint = ""

    # -- what the runner reads ------------------------------------------------

    @property
    def dra_socket(self) -> str:
        """The endpoint the helper's GetInfo names (the plugin watcher registers it)."""
        return self.endpoint

    @property
    def calls(self) -> collections.Counter[str]:
        """``<method>/<version>`` -> calls served by this process (streams opened count)."""
        counts: collections.Counter[str] = collections.Counter()
        if self.process is None:
            return counts
        for event in self.process.events:
            if event.get("event") in ("call", "stream_open"):
                # "/v1.DRAResourceHealth/NodeWatchResources" -> "NodeWatchResources/v1"
                _, service, method = str(event.get("method", "")).split("/", 2)
                counts[f"{method}/{service.split('.')[0]}"] += 1
        return counts

    @property
    def unimplemented(self) -> bool:
        return self._unimplemented

    @unimplemented.setter
    def unimplemented(self, value: bool) -> None:
        self._unimplemented = value
        self._write()

    # -- the control file -------------------------------------------------------

    def _script(self) -> Obj:
        script: Obj = {
            "devices": list(self._devices or ()),
            "prepare_devices": self.prepare_devices,
        }
        if self.silent:
            script["silent"] = True
        if self._unimplemented:
            script["not_supported"] = True
        if self._stream_error is not None:
            script["stream_error"] = self._stream_error
        return script

    def _write(self) -> None:
        if self.process is not None:
            self.process.control(self._script())

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        """Start the process and read its GetInfo, as the plugin watcher would."""
        self.process = DriverProcess(
            self.binary,
            driver_name=self.name,
            registry_dir=self.workdir / "reg",
            plugin_data_dir=self.workdir / "plugin",
            control_file=self.workdir / "control.json",
            log_dir=self.workdir,
            kubeconfig=self.kubeconfig,
            extra_args=(f"--poll-interval-ms={POLL_MS}",),
        )
        await asyncio.to_thread(self.process.start, self._script())
        info = await asyncio.to_thread(_get_info, self.process.registration_socket)
        self.endpoint = info.endpoint
        self.supported_versions = list(info.supported_versions)

    async def stop(self) -> None:
        if self.process is not None:
            await asyncio.to_thread(self.process.stop)

    async def restart(self) -> None:
        """A new process on the same sockets (the old one's streams break)."""
        await self.stop()
        await self.start()

    # -- health ----------------------------------------------------------------

    async def set_health(self, *devices: Mapping[str, Any]) -> None:
        """Make ``devices`` the report: the driver sends it on every open stream."""
        self._devices = [control_device(d) for d in devices]
        self._write()

    def set_silent(self, value: bool = True) -> None:
        """Stop (or resume) sending; the streams stay open. On resume the driver sends
        its current report again (the FakeDriver does not)."""
        self.silent = value
        self._write()

    async def end_streams(self, code: str | None = None, message: str = "") -> None:
        """End every open health stream with a gRPC status code (never EOF: the driver
        cannot, and the scenario loader refuses it)."""
        if code is None or self.process is None:
            raise ValueError("the Go helper driver ends streams with a gRPC code only")
        closed = len(self.process.find("stream_closed", _health))
        open_now = len(self.process.find("stream_open", _health)) - closed
        if not (code.upper() == "UNIMPLEMENTED" and self._unimplemented):
            # While stream_error is set, every stream (new ones too) ends with it; it is
            # cleared once the open streams ended, before either side reconnects.
            self._stream_error = {"code": code.upper(), "message": message or "ended by the test"}
            self._write()
        deadline = time.monotonic() + 10.0
        while len(self.process.find("stream_closed", _health)) < closed + open_now:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.01)
        self._stream_error = None
        self._write()


def _health(event: Mapping[str, Any]) -> bool:
    return "NodeWatchResources" in str(event.get("method", ""))


def _get_info(registration_socket: Path) -> Any:
    from kubelet_dra._proto.pluginregistration.v1 import api_pb2 as reg_pb2
    from kubelet_dra._proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
    from tests.interop._grpc import unix_channel

    with unix_channel(registration_socket) as channel:
        return reg_grpc.RegistrationStub(channel).GetInfo(reg_pb2.InfoRequest(), timeout=10)


def namespaced(obj: Obj, namespace: str) -> Obj:
    """A copy of ``obj`` in ``namespace``."""
    out = copy.deepcopy(obj)
    out["metadata"]["namespace"] = namespace
    return out
