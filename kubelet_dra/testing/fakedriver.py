"""A real DRA driver for tests: registration, DRA stubs and a scriptable health service.

The kubelet-side counterpart of the kubeletplugin helper
(``k8s.io/dynamic-resource-allocation/kubeletplugin``) and of the e2e test driver's health
control: it serves real gRPC (``grpc.aio``) on unix sockets so node agents, kubelets and
this package can be tested end to end. :class:`FakeDriver` runs it in process; as a
subprocess (``kubelet-dra-health fake-driver``) it is scripted over a JSON-lines control
socket that :class:`FakeDriverClient` speaks. ``FakeDriver``'s docstring has both.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import pathlib
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

import grpc

from kubelet_dra import clock, models
from kubelet_dra._proto.dra.v1 import api_pb2 as dra_v1_pb2
from kubelet_dra._proto.dra.v1 import api_pb2_grpc as dra_v1_grpc
from kubelet_dra._proto.dra.v1beta1 import api_pb2 as dra_v1beta1_pb2
from kubelet_dra._proto.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from kubelet_dra._proto.dra_health.v1 import api_pb2 as health_v1_pb2
from kubelet_dra._proto.dra_health.v1 import api_pb2_grpc as health_v1_grpc
from kubelet_dra._proto.dra_health.v1alpha1 import api_pb2 as health_v1alpha1_pb2
from kubelet_dra._proto.dra_health.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from kubelet_dra._proto.pluginregistration.v1 import api_pb2 as reg_pb2
from kubelet_dra._proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc

logger = logging.getLogger(__name__)

_HEALTH_PB = {"v1": health_v1_pb2, "v1alpha1": health_v1alpha1_pb2}
_HEALTH_ADD = {
    "v1": health_v1_grpc.add_DRAResourceHealthServicer_to_server,
    "v1alpha1": health_v1alpha1_grpc.add_DRAResourceHealthServicer_to_server,
}
_DRA = {
    "v1": (dra_v1_pb2, dra_v1_grpc.add_DRAPluginServicer_to_server),
    "v1beta1": (dra_v1beta1_pb2, dra_v1beta1_grpc.add_DRAPluginServicer_to_server),
}
_HEALTH_NAMES = {"HEALTHY": 1, "UNHEALTHY": 2, "UNKNOWN": 0}
NOT_SUPPORTED = "device health reporting is not supported by this driver"
"""The helper's message when a driver returns ``ErrHealthNotSupported``."""

Device = Mapping[str, Any] | models.DeviceReport


def _normalise(device: Device) -> dict[str, Any]:
    if isinstance(device, models.DeviceReport):
        return {
            "pool": device.pool,
            "device": device.device,
            "health": _HEALTH_NAMES[device.health.upper()],
            "message": device.message,
            "timeout_seconds": device.timeout_seconds,
            "last_updated": device.driver_time,
        }
    health = device.get("health", "Healthy")
    return {
        "pool": str(device.get("pool", "")),
        "device": str(device.get("device", "")),
        "health": health if isinstance(health, int) else _HEALTH_NAMES[str(health).upper()],
        "message": str(device.get("message", "")),
        "timeout_seconds": int(device.get("timeout_seconds", 0)),
        "last_updated": int(device.get("last_updated", 0)),
    }


def _response(version: str, devices: Sequence[Mapping[str, Any]], *, message: bool = True) -> Any:
    pb = _HEALTH_PB[version]
    now = int(time.time())
    return pb.NodeWatchResourcesResponse(
        devices=[
            pb.DeviceHealth(
                device=pb.DeviceIdentifier(pool_name=d["pool"], device_name=d["device"]),
                health=d["health"],
                last_updated_time=d["last_updated"] or now,
                health_check_timeout_seconds=d["timeout_seconds"],
                message=d["message"] if message else "",
            )
            for d in devices
        ]
    )


_End = tuple[grpc.StatusCode | None, str]  # queued to end a stream: OK (EOF) or a status


class FakeDriver:
    """A scriptable DRA driver serving real gRPC on unix sockets (see the module doc).

    ``supported_versions`` overrides what ``GetInfo`` advertises (to test
    invalid lists); ``empty_endpoint`` answers ``endpoint=""`` and serves every
    service on the registration socket; ``plugin_type`` changes the type;
    ``advertised_endpoint`` is sent as ``endpoint`` instead of the real one
    (to test endpoint validation).
    ``calls`` counts calls per method: ``GetInfo``, ``NotifyRegistrationStatus``,
    ``NodeWatchResources/v1``, ``NodeWatchResources/v1alpha1``,
    ``NodePrepareResources/v1`` ... ``notifications`` lists the
    ``(plugin_registered, error)`` pairs received; like the helper, a
    ``plugin_registered=false`` notification is answered with gRPC ``UNKNOWN``
    ("failed registration process: <error>"). ``v1alpha1_message=False``
    leaves ``message`` out of v1alpha1 reports, as helpers up to 1.35 do (their
    v1alpha1 has no message field); the 1.37 helper sends it on both versions.

    Sockets: the registration socket is ``<registry>/<driver>-reg.sock``; the DRA
    socket is ``<plugin_dir>/dra.sock`` (default ``<registry>/../plugins/<driver>``),
    serving ``DRAPlugin`` (v1 and/or v1beta1) and the health service in the chosen
    versions (``v1``, ``v1alpha1``, both or none, or answering ``UNIMPLEMENTED``).

    In process::

        async with FakeDriver(name="gpu.example.com", registry=reg_dir) as drv:
            await drv.set_health({"pool": "p", "device": "gpu-0", "health": "Healthy"})
            await drv.wait_for_streams(1)
            drv.calls["NodeWatchResources/v1"]

    As a subprocess (``kubelet-dra-health fake-driver`` or
    ``python -m kubelet_dra.testing.fakedriver``): the driver prints one JSON line
    ``{"event": "ready", ...}`` on stdout, then serves a JSON-lines control socket
    (``--control PATH``, default ``<registry>/../<driver>-control.sock``). Each
    request is one line ``{"op": NAME, ...arguments}`` and gets one answer line
    ``{"ok": true, ...}`` or ``{"ok": false, "error": ...}``; :class:`FakeDriverClient`
    speaks it. Operations mirror the methods: ``set_health`` (``devices``,
    ``resend``), ``push`` (``times``), ``silent`` (``value``), ``end_streams``
    (``code``, ``message``), ``restart``, ``calls``, ``status``, ``stop``.

    Devices are mappings in the interop driver's control-file format: ``pool``,
    ``device``, ``health`` (``"Healthy"``/``"Unhealthy"``/``"Unknown"`` or a raw enum
    number, which may be invalid on purpose), ``message``, ``timeout_seconds``,
    ``last_updated`` (Unix seconds; 0 = now). ``models.DeviceReport`` values work too.
    """

    def __init__(
        self,
        name: str = "gpu.example.com",
        *,
        registry: str | os.PathLike[str],
        plugin_dir: str | os.PathLike[str] | None = None,
        health_versions: Iterable[str] = ("v1",),
        dra_versions: Iterable[str] = ("v1",),
        unimplemented: bool = False,
        supported_versions: Sequence[str] | None = None,
        plugin_type: str = "DRAPlugin",
        empty_endpoint: bool = False,
        v1alpha1_message: bool = True,
        advertised_endpoint: str | None = None,
    ) -> None:
        self.name = name
        self.registry = pathlib.Path(registry)
        self.plugin_dir = pathlib.Path(
            plugin_dir if plugin_dir is not None else self.registry.parent / "plugins" / name
        )
        self.health_versions = tuple(health_versions)
        self.dra_versions = tuple(dra_versions)
        self.unimplemented = unimplemented
        self.plugin_type = plugin_type
        self.empty_endpoint = empty_endpoint
        self.advertised_endpoint = advertised_endpoint
        self.v1alpha1_message = v1alpha1_message
        self._advertised = supported_versions
        self.calls: collections.Counter[str] = collections.Counter()
        self.notifications: list[tuple[bool, str]] = []
        self.silent = False
        self.prepare_devices: list[dict[str, Any]] | None = None
        #: ``"<namespace>/<claim name>"`` -> the devices ``NodePrepareResources`` returns
        #: for that claim: a real driver prepares what the claim's allocation names, and
        #: the kubelet then maps health to a pod through those devices only. Claims not
        #: named here get ``prepare_devices`` (or every reported device).
        self.prepare_claims: dict[str, list[dict[str, Any]]] = {}
        self._devices: list[dict[str, Any]] | None = None
        self._streams: set[asyncio.Queue[list[dict[str, Any]] | _End]] = set()
        self._servers: list[grpc.aio.Server] = []
        self._resend_task: asyncio.Task[None] | None = None
        self._changed = asyncio.Condition()

    @property
    def registration_socket(self) -> pathlib.Path:
        return self.registry / f"{self.name}-reg.sock"

    @property
    def dra_socket(self) -> pathlib.Path:
        return self.registration_socket if self.empty_endpoint else self.plugin_dir / "dra.sock"

    @property
    def supported_versions(self) -> list[str]:
        if self._advertised is not None:
            return list(self._advertised)
        dra = [f"{v}.DRAPlugin" for v in ("v1", "v1beta1") if v in self.dra_versions]
        health = [f"{v}.DRAResourceHealth" for v in ("v1", "v1alpha1") if v in self.health_versions]
        return dra + health

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    # -- lifecycle ---------------------------------------------------------

    async def __aenter__(self) -> FakeDriver:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Serve the DRA socket first, then the registration socket, like the helper."""
        self.registry.mkdir(parents=True, exist_ok=True)
        if not self.empty_endpoint:
            self.plugin_dir.mkdir(parents=True, exist_ok=True)
            await self._serve(self.dra_socket, self._add_dra_services)
        await self._serve(self.registration_socket, self._add_registration_services)

    async def stop(self) -> None:
        """Stop serving (open streams are cancelled) and remove the sockets."""
        resend, self._resend_task = self._resend_task, None
        await clock.cancel_and_wait(resend)
        for server in reversed(self._servers):
            # Bounded, so a test's teardown can never hang on gRPC's shutdown.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.stop(grace=None), timeout=5.0)
        self._servers.clear()
        self._streams.clear()
        for path in (self.registration_socket, self.dra_socket):
            unlink(path)

    async def restart(self) -> None:
        """Stop, remove the sockets and serve again (new inodes, like a new pod)."""
        resend = self._resend_period
        await self.stop()
        await self.start()
        if resend is not None:
            self._start_resend(resend)

    async def _serve(self, path: pathlib.Path, add: Any) -> None:
        unlink(path)
        server = grpc.aio.server()
        add(server)
        server.add_insecure_port(f"unix:{path}")
        await server.start()
        self._servers.append(server)

    def _add_registration_services(self, server: grpc.aio.Server) -> None:
        reg_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        if self.empty_endpoint:
            self._add_dra_services(server)

    def _add_dra_services(self, server: grpc.aio.Server) -> None:
        for version in self.dra_versions:
            pb, add = _DRA[version]
            add(_DRAPlugin(self, version, pb), server)
        for version in self.health_versions:
            _HEALTH_ADD[version](_Health(self, version), server)

    # -- health control ----------------------------------------------------

    _resend_period: float | None = None

    async def set_health(self, *devices: Device, resend: float | None = None) -> None:
        """Make ``devices`` the current report and send it on every open stream.

        New streams get the current report first. ``resend`` (seconds, real
        time) re-sends it periodically as a heartbeat; ``None`` stops resending.
        """
        self._devices = [_normalise(d) for d in devices]
        self._start_resend(resend)
        await self.push()

    async def push(self, times: int = 1) -> None:
        """Send the current report ``times`` times on every open stream (floods)."""
        if self._devices is None or self.silent:
            return
        for _ in range(times):
            for queue in self._streams:
                queue.put_nowait(self._devices)
        await asyncio.sleep(0)

    def set_silent(self, value: bool = True) -> None:
        """Stop (or resume) sending while keeping the streams open."""
        self.silent = value

    async def end_streams(
        self, code: grpc.StatusCode | str | None = None, message: str = ""
    ) -> None:
        """End every open stream: cleanly (EOF) or with a gRPC status code."""
        if isinstance(code, str):
            code = grpc.StatusCode[code.upper()]
        for queue in self._streams:
            queue.put_nowait((code, message or "ended by the test"))
        await asyncio.sleep(0)

    def _start_resend(self, period: float | None) -> None:
        if self._resend_task is not None:
            self._resend_task.cancel()
            self._resend_task = None
        self._resend_period = period
        if period is not None:
            self._resend_task = asyncio.create_task(self._resend(period))

    async def _resend(self, period: float) -> None:
        while True:
            await asyncio.sleep(period)
            await self.push()

    # -- waiting -----------------------------------------------------------

    async def wait_for_calls(self, method: str, count: int = 1, *, timeout: float = 5.0) -> None:
        """Wait until ``calls[method] >= count``."""
        await self._wait(lambda: self.calls[method] >= count, timeout, f"{count} {method}")

    async def wait_for_streams(self, count: int = 1, *, timeout: float = 5.0) -> None:
        """Wait until at least ``count`` health streams are open."""
        await self._wait(lambda: self.open_streams >= count, timeout, f"{count} streams")

    async def _wait(self, ready: Any, timeout: float, what: str) -> None:
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(ready), timeout)
            except TimeoutError:
                raise TimeoutError(f"{self.name}: waited {timeout}s for {what}") from None

    async def _touch(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _count(self, method: str) -> None:
        self.calls[method] += 1
        await self._touch()

    # -- streams -----------------------------------------------------------

    async def watch(self, version: str, context: Any) -> AsyncIterator[Any]:
        await self._count(f"NodeWatchResources/{version}")
        if self.unimplemented:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, NOT_SUPPORTED)
        queue: asyncio.Queue[list[dict[str, Any]] | _End] = asyncio.Queue()
        if self._devices is not None and not self.silent:
            queue.put_nowait(self._devices)
        self._streams.add(queue)
        await self._touch()
        try:
            async for item in _drain(queue):
                if isinstance(item, tuple):
                    code, message = item
                    if code is not None and code is not grpc.StatusCode.OK:
                        await context.abort(code, message)
                    return
                yield _response(
                    version, item, message=version != "v1alpha1" or self.v1alpha1_message
                )
        finally:
            self._streams.discard(queue)


def unlink(path: str | os.PathLike[str]) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


async def _drain(queue: asyncio.Queue[Any]) -> AsyncIterator[Any]:
    while True:
        yield await queue.get()


class _Registration(reg_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, driver: FakeDriver) -> None:
        self._driver = driver

    async def GetInfo(self, request: Any, context: Any) -> Any:  # noqa: N802
        drv = self._driver
        await drv._count("GetInfo")
        return reg_pb2.PluginInfo(
            type=drv.plugin_type,
            name=drv.name,
            endpoint=(
                drv.advertised_endpoint
                if drv.advertised_endpoint is not None
                else ""
                if drv.empty_endpoint
                else str(drv.dra_socket)
            ),
            supported_versions=drv.supported_versions,
        )

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:  # noqa: N802
        await self._driver._count("NotifyRegistrationStatus")
        self._driver.notifications.append((request.plugin_registered, request.error))
        if not request.plugin_registered:
            # kubeletplugin's registrationServer returns a plain Go error (gRPC UNKNOWN).
            await context.abort(
                grpc.StatusCode.UNKNOWN, f"failed registration process: {request.error}"
            )
        return reg_pb2.RegistrationStatusResponse()


class _Health:
    def __init__(self, driver: FakeDriver, version: str) -> None:
        self._driver, self._version = driver, version

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:  # noqa: N802
        # grpc.aio needs an async generator function to treat this as a stream.
        async for response in self._driver.watch(self._version, context):
            yield response


class _DRAPlugin:
    """``NodePrepareResources`` returns a claim's ``prepare_claims`` entry, else
    ``prepare_devices``, else one device per health entry."""

    def __init__(self, driver: FakeDriver, version: str, pb: Any) -> None:
        self._driver, self._version, self._pb = driver, version, pb

    def _devices(self, claim: Any) -> list[Any]:
        drv, pb = self._driver, self._pb
        chosen = drv.prepare_claims.get(f"{claim.namespace}/{claim.name}")
        if chosen is None:
            chosen = drv.prepare_devices if drv.prepare_devices is not None else drv._devices
        return [
            pb.Device(
                request_names=d.get("requests", []),
                pool_name=d["pool"],
                device_name=d["device"],
                cdi_device_ids=d.get("cdi_device_ids", []),
            )
            for d in chosen or []
        ]

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        await self._driver._count(f"NodePrepareResources/{self._version}")
        pb = self._pb
        return pb.NodePrepareResourcesResponse(
            claims={
                c.uid: pb.NodePrepareResourceResponse(devices=self._devices(c))
                for c in request.claims
            }
        )

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        await self._driver._count(f"NodeUnprepareResources/{self._version}")
        pb = self._pb
        return pb.NodeUnprepareResourcesResponse(
            claims={c.uid: pb.NodeUnprepareResourceResponse() for c in request.claims}
        )
