"""kubelet-dra: the kubelet's DRA device-health pipeline (KEP-4680) in Python.

The public API is re-exported here; modules are flat and private to the
package unless named below. See ``docs/library.md``.
"""

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
from kubelet_dra.models import DeviceHealth, DeviceKey, DeviceReport, HealthStatus
from kubelet_dra.settings import ContainerStatusMode, Role, Settings
from kubelet_dra.store import HealthStore

__version__ = "0.1.0"

__all__ = [
    "ApiError",
    "Clock",
    "ConfigError",
    "ContainerStatusMode",
    "DeviceHealth",
    "DeviceKey",
    "DeviceReport",
    "FakeClock",
    "HealthCache",
    "HealthStatus",
    "HealthStore",
    "KubeletDraError",
    "PodGone",
    "RegistrationError",
    "ReportError",
    "Role",
    "Settings",
    "StoreError",
    "SystemClock",
    "__version__",
    "truncate_message",
]
