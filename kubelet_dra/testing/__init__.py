"""The public test kit: a real DRA driver and an API-server stand-in.

Public names (:data:`__all__`; the modules behind them are private):

- :class:`FakeDriver`: registration socket, DRA service and a scriptable
  health service (v1, v1alpha1, both, none, or UNIMPLEMENTED) over real gRPC
  on unix sockets; also runnable as ``kubelet-dra-health fake-driver``;
- :class:`FakePodResources` (:class:`PodResourcesDevice`): the kubelet's PodResources
  API (``List``, ``Get``) over real gRPC on a unix socket, answering claims as the
  kubelet does, with or without dynamic resources, or ``UNIMPLEMENTED``;
- :class:`FakeDriverClient`: scripts such a subprocess through its JSON-lines
  control socket;
- :class:`FakeApiServer`: a real HTTP server the official ``kubernetes``
  client talks to, with the API's patch semantics, resourceVersion conflicts,
  watches and fault injection; :func:`make_pod` and :func:`make_claim` build
  the objects it serves (:class:`PodClaim` and :class:`Container` shape a pod's
  claims and containers);
- :func:`eventually` (and :func:`eventually_sync` without an event loop):
  wait for a condition on real time; a timeout says what was waited for and
  what was seen last;
- :func:`pod_device_health` (:class:`PodDeviceHealth`, :class:`DeviceHealthEntry`):
  read a pod's ``allocatedResourcesStatus`` and device condition;
- :func:`socket_dir`, :func:`make_settings` and :class:`PodStore`: a short socket
  directory, ``Settings`` rooted in it, a node agent's pods for the manager's callback.

The pytest plugin (``kubelet_dra.testing.pytest_plugin``, loaded through the
``pytest11`` entry point ``kubelet_dra``) gives all of it as ``kdra_*`` fixtures.
Our own integration tests, the demo and the benchmarks use exactly these, so
other projects can test their node agents and kubelets with them too.

The names are imported on first use (PEP 562, as in ``kubelet_dra``): pytest loads
the plugin module, and with it this package, in every run where the package is
installed, and a run that uses no fixture of the kit must not pay for gRPC and the
kubernetes client.
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
