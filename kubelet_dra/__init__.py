"""kubelet-dra: the kubelet's DRA device-health pipeline (KEP-4680) in Python.

The public surface is exactly two namespaces, listed in ``docs/library.md``: ``kubelet_dra``
(the names in :data:`__all__`: the manager, its configuration, the values it hands out, the
one status helper an agent needs, the stages for wiring your own pipeline, clocks and
errors) and ``kubelet_dra.testing`` (the test kit). Every module is an implementation
detail, including those without a leading underscore: import from the two namespaces. The
command line is public through its flags, environment variables and exit codes. The
re-exports are imported on first use (PEP 562), so a command that needs one module (the
``kubectl dra-health`` plugin) does not import gRPC, SQLite and the pipeline.
"""

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:
    from kubelet_dra.agentpods import PodHealthUpdate
    from kubelet_dra.clock import Clock, FakeClock, SystemClock
    from kubelet_dra.errors import (
        ApiError,
        ConfigError,
        KubeletDraError,
        PodGone,
        RegistrationError,
        StoreError,
    )
    from kubelet_dra.kube import NodePods, StatusWriter
    from kubelet_dra.manager import DRAHealthManager
    from kubelet_dra.models import DeviceHealth, DeviceKey, DeviceReport, HealthStatus
    from kubelet_dra.plugin.getinfo import PluginInfo, make_plugin_info
    from kubelet_dra.plugin.plugins import PluginManager
    from kubelet_dra.plugin.registration import EventKind, PluginEvent, RegistryWatcher
    from kubelet_dra.settings import ContainerStatusMode, Role, Settings
    from kubelet_dra.sidecar import Sidecar
    from kubelet_dra.state.healthinfo import HealthCache, truncate_message
    from kubelet_dra.state.store import HealthStore
    from kubelet_dra.status.claims import ClaimIndex, ClaimKey, Delta, PreparedDevice
    from kubelet_dra.status.podstatus import Desired, DeviceState
    from kubelet_dra.status.podstatus import merge as merge_pod_status
    from kubelet_dra.syncrunner import SyncRunner

# name -> (module, attribute): the re-exports, imported on first use.
_LAZY: dict[str, tuple[str, str]] = {
    "ApiError": ("kubelet_dra.errors", "ApiError"),
    "ClaimIndex": ("kubelet_dra.status.claims", "ClaimIndex"),
    "ClaimKey": ("kubelet_dra.status.claims", "ClaimKey"),
    "Clock": ("kubelet_dra.clock", "Clock"),
    "ConfigError": ("kubelet_dra.errors", "ConfigError"),
    "ContainerStatusMode": ("kubelet_dra.settings", "ContainerStatusMode"),
    "DRAHealthManager": ("kubelet_dra.manager", "DRAHealthManager"),
    "Delta": ("kubelet_dra.status.claims", "Delta"),
    "Desired": ("kubelet_dra.status.podstatus", "Desired"),
    "DeviceHealth": ("kubelet_dra.models", "DeviceHealth"),
    "DeviceKey": ("kubelet_dra.models", "DeviceKey"),
    "DeviceReport": ("kubelet_dra.models", "DeviceReport"),
    "DeviceState": ("kubelet_dra.status.podstatus", "DeviceState"),
    "EventKind": ("kubelet_dra.plugin.registration", "EventKind"),
    "FakeClock": ("kubelet_dra.clock", "FakeClock"),
    "HealthCache": ("kubelet_dra.state.healthinfo", "HealthCache"),
    "HealthStatus": ("kubelet_dra.models", "HealthStatus"),
    "HealthStore": ("kubelet_dra.state.store", "HealthStore"),
    "KubeletDraError": ("kubelet_dra.errors", "KubeletDraError"),
    "NodePods": ("kubelet_dra.kube", "NodePods"),
    "PluginEvent": ("kubelet_dra.plugin.registration", "PluginEvent"),
    "PluginInfo": ("kubelet_dra.plugin.getinfo", "PluginInfo"),
    "PluginManager": ("kubelet_dra.plugin.plugins", "PluginManager"),
    "PodGone": ("kubelet_dra.errors", "PodGone"),
    "PodHealthUpdate": ("kubelet_dra.agentpods", "PodHealthUpdate"),
    "PreparedDevice": ("kubelet_dra.status.claims", "PreparedDevice"),
    "RegistrationError": ("kubelet_dra.errors", "RegistrationError"),
    "RegistryWatcher": ("kubelet_dra.plugin.registration", "RegistryWatcher"),
    "Role": ("kubelet_dra.settings", "Role"),
    "Settings": ("kubelet_dra.settings", "Settings"),
    "Sidecar": ("kubelet_dra.sidecar", "Sidecar"),
    "StatusWriter": ("kubelet_dra.kube", "StatusWriter"),
    "StoreError": ("kubelet_dra.errors", "StoreError"),
    "SyncRunner": ("kubelet_dra.syncrunner", "SyncRunner"),
    "SystemClock": ("kubelet_dra.clock", "SystemClock"),
    "make_plugin_info": ("kubelet_dra.plugin.getinfo", "make_plugin_info"),
    "merge_pod_status": ("kubelet_dra.status.podstatus", "merge"),
    "truncate_message": ("kubelet_dra.state.healthinfo", "truncate_message"),
}

__all__ = [
    "ApiError",
    "ClaimIndex",
    "ClaimKey",
    "Clock",
    "ConfigError",
    "ContainerStatusMode",
    "DRAHealthManager",
    "Delta",
    "Desired",
    "DeviceHealth",
    "DeviceKey",
    "DeviceReport",
    "DeviceState",
    "EventKind",
    "FakeClock",
    "HealthCache",
    "HealthStatus",
    "HealthStore",
    "KubeletDraError",
    "NodePods",
    "PluginEvent",
    "PluginInfo",
    "PluginManager",
    "PodGone",
    "PodHealthUpdate",
    "PreparedDevice",
    "RegistrationError",
    "RegistryWatcher",
    "Role",
    "Settings",
    "Sidecar",
    "StatusWriter",
    "StoreError",
    "SyncRunner",
    "SystemClock",
    "__version__",
    "make_plugin_info",
    "merge_pod_status",
    "truncate_message",
]


def __getattr__(name: str) -> object:
    if name in _LAZY:
        module, attribute = _LAZY[name]
        value = getattr(importlib.import_module(module), attribute)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
