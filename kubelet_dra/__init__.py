"""kubelet-dra: the kubelet's DRA device-health pipeline (KEP-4680) in Python.

The public API is re-exported here; modules are flat and private to the
package unless named below. See ``docs/library.md``. The re-exports are
imported on first use (PEP 562), so a command that needs one module (the
``kubectl dra-health`` plugin) does not import gRPC, SQLite and the pipeline.
"""

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from kubelet_dra.claims import ClaimIndex, ClaimKey, PreparedDevice
    from kubelet_dra.clock import Clock, FakeClock, SystemClock
    from kubelet_dra.errors import (
        ApiError,
        ConfigError,
        KubeletDraError,
        PodGone,
        RegistrationError,
        ReportError,
        StoreError,
    )
    from kubelet_dra.healthinfo import HealthCache, truncate_message
    from kubelet_dra.kube import NodePods, StatusWriter
    from kubelet_dra.manager import DRAHealthManager, PodHealthUpdate, Sidecar, SyncRunner
    from kubelet_dra.models import DeviceHealth, DeviceKey, DeviceReport, HealthStatus
    from kubelet_dra.plugins import PluginManager
    from kubelet_dra.podstatus import Desired
    from kubelet_dra.registration import (
        EventKind,
        PluginEvent,
        PluginInfo,
        RegistryWatcher,
        make_plugin_info,
    )
    from kubelet_dra.settings import ContainerStatusMode, Role, Settings
    from kubelet_dra.store import HealthStore

_LAZY = {
    "ApiError": "kubelet_dra.errors",
    "ClaimIndex": "kubelet_dra.claims",
    "ClaimKey": "kubelet_dra.claims",
    "Clock": "kubelet_dra.clock",
    "ConfigError": "kubelet_dra.errors",
    "ContainerStatusMode": "kubelet_dra.settings",
    "DRAHealthManager": "kubelet_dra.manager",
    "Desired": "kubelet_dra.podstatus",
    "DeviceHealth": "kubelet_dra.models",
    "DeviceKey": "kubelet_dra.models",
    "DeviceReport": "kubelet_dra.models",
    "EventKind": "kubelet_dra.registration",
    "FakeClock": "kubelet_dra.clock",
    "HealthCache": "kubelet_dra.healthinfo",
    "HealthStatus": "kubelet_dra.models",
    "HealthStore": "kubelet_dra.store",
    "KubeletDraError": "kubelet_dra.errors",
    "NodePods": "kubelet_dra.kube",
    "PluginEvent": "kubelet_dra.registration",
    "PluginInfo": "kubelet_dra.registration",
    "PluginManager": "kubelet_dra.plugins",
    "PodGone": "kubelet_dra.errors",
    "PodHealthUpdate": "kubelet_dra.manager",
    "PreparedDevice": "kubelet_dra.claims",
    "RegistrationError": "kubelet_dra.errors",
    "RegistryWatcher": "kubelet_dra.registration",
    "ReportError": "kubelet_dra.errors",
    "Role": "kubelet_dra.settings",
    "Settings": "kubelet_dra.settings",
    "Sidecar": "kubelet_dra.manager",
    "StatusWriter": "kubelet_dra.kube",
    "StoreError": "kubelet_dra.errors",
    "SyncRunner": "kubelet_dra.manager",
    "SystemClock": "kubelet_dra.clock",
    "make_plugin_info": "kubelet_dra.registration",
    "truncate_message": "kubelet_dra.healthinfo",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kubelet_dra' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "ApiError",
    "ClaimIndex",
    "ClaimKey",
    "Clock",
    "ConfigError",
    "ContainerStatusMode",
    "DRAHealthManager",
    "Desired",
    "DeviceHealth",
    "DeviceKey",
    "DeviceReport",
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
    "ReportError",
    "Role",
    "Settings",
    "Sidecar",
    "StatusWriter",
    "StoreError",
    "SyncRunner",
    "SystemClock",
    "__version__",
    "make_plugin_info",
    "truncate_message",
]
