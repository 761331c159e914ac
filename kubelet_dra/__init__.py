"""kubelet-dra: the kubelet's DRA device-health pipeline (KEP-4680) in Python.

The public API is re-exported here; modules are flat and private to the
package unless named below. See ``docs/library.md``.
"""

__version__ = "0.1.0"

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
from kubelet_dra.manager import DRAHealthManager, PodHealthUpdate
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
from kubelet_dra.sidecar import Sidecar
from kubelet_dra.store import HealthStore
from kubelet_dra.syncrunner import SyncRunner

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
