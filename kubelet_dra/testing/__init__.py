"""The public test kit: a real DRA driver and an API-server stand-in.

Public names (:data:`__all__`; the modules behind them are private): :class:`FakeDriver` and
:class:`FakeDriverClient` (a scriptable driver over real gRPC, in process or as a
subprocess), :class:`FakePodResources` (the kubelet's PodResources API), :class:`FakeApiServer`
with :func:`make_pod` and :func:`make_claim`, :func:`eventually`, :func:`pod_device_health`,
:func:`socket_dir`, :func:`make_settings` and :class:`PodStore`. The pytest plugin gives them as
``kdra_*`` fixtures; ``docs/drivers.md`` says what each is for. The names are imported on
first use (PEP 562): pytest loads the plugin, and with it this package, in every run where the
package is installed, and a run that uses none of the kit must not pay for gRPC.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubelet_dra.testing._eventually import eventually, eventually_sync
    from kubelet_dra.testing._kit import PodStore, make_settings, socket_dir
    from kubelet_dra.testing._podhealth import (
        DeviceHealthEntry,
        PodDeviceHealth,
        pod_device_health,
    )
    from kubelet_dra.testing.fakeapi import (
        Container,
        FakeApiServer,
        PodClaim,
        make_claim,
        make_pod,
    )
    from kubelet_dra.testing.fakedriver import FakeDriver
    from kubelet_dra.testing.fakedriver_control import FakeDriverClient
    from kubelet_dra.testing.fakepodresources import FakePodResources, PodResourcesDevice

# name -> module: the public names, imported on first use.
_LAZY: dict[str, str] = {
    "Container": "kubelet_dra.testing.fakeapi",
    "DeviceHealthEntry": "kubelet_dra.testing._podhealth",
    "FakeApiServer": "kubelet_dra.testing.fakeapi",
    "FakeDriver": "kubelet_dra.testing.fakedriver",
    "FakeDriverClient": "kubelet_dra.testing.fakedriver_control",
    "FakePodResources": "kubelet_dra.testing.fakepodresources",
    "PodClaim": "kubelet_dra.testing.fakeapi",
    "PodDeviceHealth": "kubelet_dra.testing._podhealth",
    "PodResourcesDevice": "kubelet_dra.testing.fakepodresources",
    "PodStore": "kubelet_dra.testing._kit",
    "eventually": "kubelet_dra.testing._eventually",
    "eventually_sync": "kubelet_dra.testing._eventually",
    "make_claim": "kubelet_dra.testing.fakeapi",
    "make_pod": "kubelet_dra.testing.fakeapi",
    "make_settings": "kubelet_dra.testing._kit",
    "pod_device_health": "kubelet_dra.testing._podhealth",
    "socket_dir": "kubelet_dra.testing._kit",
}

__all__ = [
    "Container",
    "DeviceHealthEntry",
    "FakeApiServer",
    "FakeDriver",
    "FakeDriverClient",
    "FakePodResources",
    "PodClaim",
    "PodDeviceHealth",
    "PodResourcesDevice",
    "PodStore",
    "eventually",
    "eventually_sync",
    "make_claim",
    "make_pod",
    "make_settings",
    "pod_device_health",
    "socket_dir",
]


def __getattr__(name: str) -> object:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
