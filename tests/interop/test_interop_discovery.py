"""Interop: our discovery and health streams against the real kubeletplugin helpers and FakeDriver.

Each scenario runs once per driver *kind*: the Go driver on the 1.37 helper, FakeDriver set up
as that helper (DRA v1 + v1beta1, health v1 + v1alpha1), the Go driver on the 1.35 helper, and
FakeDriver set up as that one (health v1alpha1 only, no message field). The assertions are the
same for a helper and the FakeDriver imitating it, so any difference between the stand-in and
the real helper fails the FakeDriver's case (and is fixed there).

What runs is our own code: ``registration.RegistryWatcher`` (observer and owner roles) finds the
registration socket, calls GetInfo (and, as owner, NotifyRegistrationStatus), negotiates the
health service, and ``plugins.PluginManager`` streams health into a ``HealthCache``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from kubelet_dra import clock as clock_mod
from kubelet_dra import models
from kubelet_dra import settings as settings_mod
from kubelet_dra._proto.pluginregistration.v1 import api_pb2 as reg
from kubelet_dra._proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from kubelet_dra.plugin import plugins, registration
from kubelet_dra.state import healthinfo
from kubelet_dra.testing import FakeDriver, eventually
from tests.integration._driver_fixtures import PIPELINE, make_settings

from ._driver import DriverProcess, device

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]

DRIVER = "gpu.interop.example.com"
DriverFactory = Callable[..., DriverProcess]


@dataclasses.dataclass(frozen=True)
class Kind:
    """A driver implementation and the helper release it stands for."""

    go: str | None  # "current" / "v035": the Go driver; None: FakeDriver
    flavor: str  # "1.37" or "1.35"

    @property
    def fake_options(self) -> dict[str, Any]:
        if self.flavor == "1.37":
            return {"health_versions": ("v1", "v1alpha1"), "dra_versions": ("v1", "v1beta1")}
        return {
            "health_versions": ("v1alpha1",),
            "dra_versions": ("v1", "v1beta1"),
            "v1alpha1_message": False,
        }


KINDS = [
    pytest.param(Kind("current", "1.37"), id="helper1.37"),
    pytest.param(Kind(None, "1.37"), id="fake-as-1.37"),
    pytest.param(Kind("v035", "1.35"), id="helper1.35"),
    pytest.param(Kind(None, "1.35"), id="fake-as-1.35"),
]

#: What each helper release advertises, in order (pinned by test_driver_registration.py).
_DRA_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
SUPPORTED = {
    "1.37": (*_DRA_SERVICES, "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"),
    "1.35": (*_DRA_SERVICES, "v1alpha1.DRAResourceHealth"),
}
NEGOTIATED = {"1.37": "v1.DRAResourceHealth", "1.35": "v1alpha1.DRAResourceHealth"}


class Driver:
    """One driver of either implementation, driven the same way."""

    def __init__(self, kind: Kind, factory: DriverFactory, registry: Path, plugin_dir: Path):
        self.kind = kind
        self._factory, self._registry, self._plugin_dir = factory, registry, plugin_dir
        self.go: DriverProcess | None = None
        self.fake: FakeDriver | None = None

    async def start(self, devices: list[dict[str, Any]], **script: Any) -> None:
        if self.kind.go is not None:
            self.go = await asyncio.to_thread(
                self._factory,
                self.kind.go,
                script={"devices": devices, **script},
                driver_name=DRIVER,
                registry_dir=self._registry,
                plugin_data_dir=self._plugin_dir,
            )
            return
        self.fake = FakeDriver(
            DRIVER,
            registry=self._registry,
            plugin_dir=self._plugin_dir,
            unimplemented=bool(script.get("not_supported")),
            **self.kind.fake_options,
        )
        await self.fake.start()
        await self.fake.set_health(*devices)

    async def set_devices(self, devices: list[dict[str, Any]], *, silent: bool = False) -> None:
        if self.go is not None:
            self.go.control({"devices": devices, "silent": silent})
            return
        assert self.fake is not None
        self.fake.set_silent(False)
        await self.fake.set_health(*devices)
        self.fake.set_silent(silent)

    @property
    def registration_socket(self) -> Path:
        if self.go is not None:
            return self.go.registration_socket
        assert self.fake is not None
        return self.fake.registration_socket

    @property
    def dra_socket(self) -> Path:
        if self.go is not None:
            return self.go.dra_socket
        assert self.fake is not None
        return self.fake.dra_socket

    def notifications(self) -> list[tuple[bool, str]]:
        """NotifyRegistrationStatus calls received: (plugin_registered, error)."""
        if self.go is not None:
            out = []
            for call in self.go.calls("/NotifyRegistrationStatus"):
                # protojson: camelCase names, default values omitted.
                request = json.loads(call.get("request") or "{}")
                out.append((bool(request.get("pluginRegistered")), request.get("error", "")))
            return out
        assert self.fake is not None
        return list(self.fake.notifications)

    def health_streams(self) -> list[str]:
        """The health service of every NodeWatchResources call received, in order."""
        if self.go is not None:
            return [
                str(e["method"]).split("/")[1]
                for e in self.go.find("stream_open")
                if str(e.get("method", "")).endswith("/NodeWatchResources")
            ]
        assert self.fake is not None
        return [
            f"{version}.DRAResourceHealth"
            for version in ("v1", "v1alpha1")
            for _ in range(self.fake.calls[f"NodeWatchResources/{version}"])
        ]

    async def stop(self) -> None:
        if self.fake is not None:
            await self.fake.stop()
        if self.go is not None:
            await asyncio.to_thread(self.go.stop)


@dataclasses.dataclass
class Pipeline:
    """Our watcher + plugin manager + cache, recording every change notification."""

    watcher: registration.RegistryWatcher
    manager: plugins.PluginManager
    cache: healthinfo.HealthCache
    events: list[registration.PluginEvent]
    changes: list[tuple[float, list[models.DeviceKey]]]

    def health(self, name: str) -> tuple[str, str]:
        record = self.cache.get(models.DeviceKey(DRIVER, "pool-0", name), time.time())
        return record.visible(time.time())[0].value, record.visible(time.time())[1]


def settings_for(registry: Path, state: Path, **extra: Any) -> settings_mod.Settings:
    return make_settings(
        tuning=PIPELINE,
        plugins_registry=registry,
        state_dir=state,
        registration_backoff_initial=0.05,
        **extra,
    )


@contextlib.asynccontextmanager
async def pipeline(
    registry: Path, state: Path, role: settings_mod.Role = settings_mod.Role.OBSERVER
) -> AsyncIterator[Pipeline]:
    settings = settings_for(registry, state, role=role)
    clock = clock_mod.SystemClock()
    cache = healthinfo.HealthCache(default_lease=settings.health_timeout)
    changes: list[tuple[float, list[models.DeviceKey]]] = []
    events: list[registration.PluginEvent] = []

    async def on_change(keys: list[models.DeviceKey]) -> None:
        changes.append((time.time(), list(keys)))

    manager = plugins.PluginManager(cache, settings=settings, clock=clock, on_change=on_change)

    async def on_event(event: registration.PluginEvent) -> None:
        events.append(event)
        await manager.handle(event)

    watcher = registration.RegistryWatcher(
        registry, role=role, settings=settings, clock=clock, on_event=on_event
    )
    async with manager, watcher:
        yield Pipeline(watcher, manager, cache, events, changes)


@pytest.fixture
async def driver_for(
    interop_driver: DriverFactory, interop_socket_dir: Path
) -> AsyncIterator[Callable[[Kind], Driver]]:
    made: list[Driver] = []

    def make(kind: Kind) -> Driver:
        drv = Driver(
            kind, interop_driver, interop_socket_dir / "registry", interop_socket_dir / "plugin"
        )
        made.append(drv)
        return drv

    yield make
    for drv in made:
        await drv.stop()


def paths(socket_dir: Path) -> tuple[Path, Path]:
    return socket_dir / "registry", socket_dir / "state"


@pytest.mark.parametrize("kind", KINDS)
async def test_observer_registers_and_negotiates(
    driver_for: Callable[[Kind], Driver], interop_socket_dir: Path, kind: Kind
) -> None:
    """The observer finds the socket, validates GetInfo, picks v1 (1.37) or v1alpha1 (1.35),
    opens exactly that stream, and never calls NotifyRegistrationStatus."""
    drv = driver_for(kind)
    await drv.start([device("gpu-0")])
    registry, state = paths(interop_socket_dir)
    async with pipeline(registry, state) as pipe:
        await eventually(lambda: pipe.events, what="a registration", timeout=10)
        info = pipe.events[0].plugin
        assert pipe.events[0].kind is registration.EventKind.REGISTER
        assert (info.driver, info.endpoint, info.socket) == (
            DRIVER,
            str(drv.dra_socket),
            str(drv.registration_socket),
        )
        assert info.supported_versions == SUPPORTED[kind.flavor]
        assert info.dra_service == "v1.DRAPlugin"
        assert info.health_service == NEGOTIATED[kind.flavor]
        await eventually(
            lambda: pipe.health("gpu-0")[0] == "Healthy", what="first report", timeout=10
        )
        assert drv.health_streams() == [NEGOTIATED[kind.flavor]]
        status = pipe.manager.endpoints[str(drv.dra_socket)]
        assert status.service == NEGOTIATED[kind.flavor]
        assert status.state is plugins.StreamState.STREAMING
    assert drv.notifications() == []


@pytest.mark.parametrize("kind", KINDS)
async def test_owner_notifies_registration(
    driver_for: Callable[[Kind], Driver], interop_socket_dir: Path, kind: Kind
) -> None:
    """As owner we call NotifyRegistrationStatus(true) once; the driver accepts it."""
    drv = driver_for(kind)
    await drv.start([device("gpu-0")])
    registry, state = paths(interop_socket_dir)
    async with pipeline(registry, state, role=settings_mod.Role.OWNER) as pipe:
        await eventually(
            lambda: pipe.events and drv.notifications(), what="notification", timeout=10
        )
        assert pipe.events[0].plugin.health_service == NEGOTIATED[kind.flavor]
        assert not pipe.watcher.failures
    assert drv.notifications() == [(True, "")]
    if drv.go is not None:  # the helper's answer: no error
        assert "error" not in drv.go.calls("/NotifyRegistrationStatus")[0]


@pytest.mark.parametrize("kind", KINDS)
async def test_notify_registration_failure_answer(
    driver_for: Callable[[Kind], Driver], kind: Kind
) -> None:
    """What a driver answers a kubelet that refuses it: gRPC UNKNOWN with the kubelet's error."""
    drv = driver_for(kind)
    await drv.start([])
    async with grpc.aio.insecure_channel(f"unix:{drv.registration_socket}") as channel:
        stub = reg_grpc.RegistrationStub(channel)
        await stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True))
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await stub.NotifyRegistrationStatus(
                reg.RegistrationStatus(plugin_registered=False, error="kubelet said no")
            )
    assert failed.value.code() == grpc.StatusCode.UNKNOWN
    assert failed.value.details() == "failed registration process: kubelet said no"
    # The Go helper logs a call after it has answered it, on a pipe read by a thread: the
    # second call's event may still be in flight when the answer is here.
    await eventually(lambda: len(drv.notifications()) >= 2, what="both notifications", timeout=10)
    assert drv.notifications() == [(True, ""), (False, "kubelet said no")]


def expected_message(kind: Kind, message: str) -> str:
    # The 1.35 helper's v1alpha1 has no message field (added in 1.36).
    return message if kind.flavor == "1.37" else ""


@pytest.mark.parametrize("kind", KINDS)
async def test_health_changes_and_messages(
    driver_for: Callable[[Kind], Driver], interop_socket_dir: Path, kind: Kind
) -> None:
    """Reports land in the cache with health and message; a change on the open stream
    notifies exactly the changed device; an identical resend notifies nothing."""
    drv = driver_for(kind)
    await drv.start(
        [device("gpu-0", "HEALTHY", message="ok"), device("gpu-1", "UNHEALTHY", message="ECC")]
    )
    registry, state = paths(interop_socket_dir)
    async with pipeline(registry, state) as pipe:
        await eventually(
            lambda: pipe.health("gpu-1")[0] == "Unhealthy", what="first report", timeout=10
        )
        assert pipe.health("gpu-0") == ("Healthy", expected_message(kind, "ok"))
        assert pipe.health("gpu-1") == ("Unhealthy", expected_message(kind, "ECC"))
        before = len(pipe.changes)
        await drv.set_devices(
            [
                device("gpu-0", "UNHEALTHY", message="thermal"),
                device("gpu-1", "UNHEALTHY", message="ECC"),
            ]
        )
        await eventually(
            lambda: pipe.health("gpu-0")[0] == "Unhealthy", what="the change", timeout=10
        )
        assert pipe.health("gpu-0") == ("Unhealthy", expected_message(kind, "thermal"))
        changed = [k.device for _, keys in pipe.changes[before:] for k in keys]
        assert changed == ["gpu-0"]
        # Unknown from the driver is Unknown here, with its message.
        await drv.set_devices([device("gpu-1", "UNKNOWN", message="rebooting")])
        await eventually(lambda: pipe.health("gpu-1")[0] == "Unknown", what="Unknown", timeout=10)
        assert pipe.health("gpu-1") == ("Unknown", expected_message(kind, "rebooting"))
        # A device missing from a later report keeps its last state until its lease runs out.
        assert pipe.health("gpu-0")[0] == "Unhealthy"
        assert len(drv.health_streams()) == 1  # all on the same stream


@pytest.mark.parametrize("kind", KINDS)
async def test_per_device_timeout_expires_at_deadline(
    driver_for: Callable[[Kind], Driver], interop_socket_dir: Path, kind: Kind
) -> None:
    """A device's health_check_timeout_seconds is its lease: when the driver goes silent
    it turns Unknown at last report + timeout (not at the node default of 30 s), while a
    device with a longer timeout stays."""
    drv = driver_for(kind)
    await drv.start([device("gpu-0", "UNHEALTHY", timeout_seconds=2), device("gpu-1")])
    registry, state = paths(interop_socket_dir)
    async with pipeline(registry, state) as pipe:
        await eventually(
            lambda: pipe.health("gpu-0")[0] == "Unhealthy", what="first report", timeout=10
        )
        await drv.set_devices([], silent=True)
        key0 = models.DeviceKey(DRIVER, "pool-0", "gpu-0")
        deadline = pipe.cache.get(key0, time.time()).deadline
        assert pipe.cache.get(key0, time.time()).lease == 2.0
        # The deadline task turns it Unknown and notifies at the deadline, not later.
        await eventually(lambda: pipe.manager.lease_expiries >= 1, what="expiry", timeout=6)
        assert pipe.manager.lease_expiries == 1
        expired_at = pipe.changes[-1][0]
        assert pipe.changes[-1][1] == [key0]
        assert deadline <= expired_at <= deadline + 0.5
        assert pipe.health("gpu-0")[0] == "Unknown"
        assert pipe.health("gpu-1")[0] == "Healthy"  # default lease (30 s) still running
        assert str(drv.dra_socket) in pipe.manager.endpoints  # the stream is still open
        assert pipe.manager.endpoints[str(drv.dra_socket)].state is plugins.StreamState.STREAMING


@pytest.mark.parametrize("kind", KINDS)
async def test_not_supported_is_one_call(
    driver_for: Callable[[Kind], Driver], interop_socket_dir: Path, kind: Kind
) -> None:
    """A driver whose health hook says "not supported" answers UNIMPLEMENTED; we make
    exactly one call and do not retry while it stays registered."""
    drv = driver_for(kind)
    await drv.start([device("gpu-0")], not_supported=True)
    registry, state = paths(interop_socket_dir)
    async with pipeline(registry, state) as pipe:
        await eventually(
            lambda: str(drv.dra_socket) in pipe.manager.endpoints, what="registration", timeout=10
        )
        status = pipe.manager.endpoints[str(drv.dra_socket)]
        await eventually(
            lambda: status.state is plugins.StreamState.UNIMPLEMENTED, what="stop", timeout=10
        )
        assert "not supported" in status.last_error or status.last_error == ""
        # Ten times the retry cap (0.2 s) passes without a second call.
        quiet_until = time.monotonic() + 2.0
        while time.monotonic() < quiet_until:
            assert len(drv.health_streams()) == 1
            await asyncio.sleep(0.05)
        assert drv.health_streams() == [NEGOTIATED[kind.flavor]]
        assert pipe.health("gpu-0")[0] == "Unknown"  # nothing was ever reported


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param(Kind("current", "1.37"), id="helper1.37"),
        pytest.param(Kind(None, "1.37"), id="fake-as-1.37"),
    ],
)
async def test_health_service_off_registers_without_stream(
    driver_for: Callable[[Kind], Driver],
    interop_driver: DriverFactory,
    interop_socket_dir: Path,
    kind: Kind,
) -> None:
    """HealthService(false): registered for DRA, no health service negotiated, no stream."""
    registry, state = paths(interop_socket_dir)
    fake: FakeDriver | None = None
    if kind.go is not None:
        go = await asyncio.to_thread(
            interop_driver, "current", driver_name=DRIVER, registry_dir=registry,
            extra_args=["--disable-health"],
        )  # fmt: skip
        socket = go.dra_socket
    else:
        fake = FakeDriver(
            DRIVER, registry=registry, plugin_dir=interop_socket_dir / "plugin",
            health_versions=(), dra_versions=("v1", "v1beta1"),
        )  # fmt: skip
        await fake.start()
        socket = fake.dra_socket
    try:
        async with pipeline(registry, state) as pipe:
            await eventually(lambda: pipe.events, what="registration", timeout=10)
            info = pipe.events[0].plugin
            assert info.supported_versions == ("v1.DRAPlugin", "v1beta1.DRAPlugin")
            assert info.health_service is None
            assert [p.endpoint for p in pipe.manager.plugins] == [str(socket)]
            assert pipe.manager.endpoints == {}
    finally:
        if fake is not None:
            await fake.stop()
