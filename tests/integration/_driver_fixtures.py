"""Helpers of the discovery, stream, fake-driver and watch tests, and the one settings
builder of the suite (the fixtures are in ``tests/conftest.py`` and ``conftest.py``)."""

from __future__ import annotations

import pathlib
import random
from collections.abc import Mapping
from typing import Any

from kubelet_dra import models, settings
from kubelet_dra.plugin import getinfo, plugins, registration
from kubelet_dra.testing import FakeApiServer

NODE = "node-1"

# Presets of ``make_settings``. Fake-clock stream tests count the stream backoff (1 s,
# doubling to 8 s), so STREAMS keeps it long; real-time pipelines want everything short.
STREAMS: Mapping[str, object] = {
    "registry_poll_interval": 0.02,
    "get_info_timeout": 0.3,
    "registration_backoff_initial": 0.5,
    "registration_backoff_max": 4.0,
    "stream_backoff_initial": 1.0,
    "stream_backoff_max": 8.0,
    "stream_backoff_reset_after": 60.0,
}
PIPELINE: Mapping[str, object] = {
    "registry_poll_interval": 0.05,
    "write_window": 0.01,
    "store_flush_interval": 0.05,
    "stream_backoff_initial": 0.05,
    "stream_backoff_max": 0.2,
}
WRITER: Mapping[str, object] = {
    "node_name": NODE,
    "write_window": 0.02,
    "api_qps": 1000.0,
    "api_burst": 1000,
    "event_interval": 0.0,
}


def make_settings(
    *,
    tuning: Mapping[str, object] = STREAMS,
    sockdir: pathlib.Path | None = None,
    api: FakeApiServer | None = None,
    **overrides: object,
) -> settings.Settings:
    """The tests' one settings builder: a preset, then the registry and state directory
    under ``sockdir`` and the node name and a kubeconfig for ``api``, then ``overrides``."""
    values: dict[str, Any] = dict(tuning)
    if sockdir is not None:
        values |= {
            "plugins_registry": sockdir / "reg",
            "state_dir": sockdir / "state",
            "kubelet_root_dir": sockdir / "kubelet",  # no kubelet checkpoint unless written
            # No kubelet answers there unless a test serves a FakePodResources.
            "pod_resources_socket": sockdir / "kubelet" / "pod-resources" / "kubelet.sock",
        }
    if api is not None:
        assert sockdir is not None, "the kubeconfig is written under sockdir"
        values |= {"node_name": NODE, "kubeconfig": api.write_kubeconfig(sockdir / "kubeconfig")}
    values.update(overrides)
    return settings.Settings(**values)


def rss_mb() -> float:
    """This process's resident memory, in MB (Linux)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


class Changes:
    """An ``on_change`` callback that records every call."""

    def __init__(self) -> None:
        self.calls: list[list[models.DeviceKey]] = []

    async def __call__(self, changed: list[models.DeviceKey]) -> None:
        self.calls.append(list(changed))

    @property
    def keys(self) -> set[models.DeviceKey]:
        return {key for call in self.calls for key in call}


class Events:
    """An ``on_event`` callback that records registration events."""

    def __init__(self) -> None:
        self.events: list[registration.PluginEvent] = []

    async def __call__(self, event: registration.PluginEvent) -> None:
        self.events.append(event)

    def kinds(self, driver: str | None = None) -> list[str]:
        return [str(e.kind) for e in self.events if driver is None or e.plugin.driver == driver]


class NoJitter(random.Random):
    """An rng whose jitter is zero, so backoff delays are exact."""

    def uniform(self, a: float, b: float) -> float:
        return (a + b) / 2


def device(
    pool: str, name: str, health: str | int = "Healthy", **extra: object
) -> dict[str, object]:
    """A device entry for ``FakeDriver.set_health``; ``health`` may be a raw enum value."""
    return {"pool": pool, "device": name, "health": health, **extra}


def plugin_of(driver: object) -> getinfo.PluginInfo:
    """The registration a watcher would produce for a ``FakeDriver``."""
    from kubelet_dra.testing import fakedriver

    assert isinstance(driver, fakedriver.FakeDriver)
    return getinfo.make_plugin_info(
        driver.name,
        str(driver.dra_socket),
        driver.supported_versions,
        socket=str(driver.registration_socket),
    )


async def register(manager: plugins.PluginManager, driver: object) -> getinfo.PluginInfo:
    info = plugin_of(driver)
    await manager.handle(registration.PluginEvent(registration.EventKind.REGISTER, info))
    return info


async def deregister(manager: plugins.PluginManager, info: getinfo.PluginInfo) -> None:
    await manager.handle(registration.PluginEvent(registration.EventKind.DEREGISTER, info))
