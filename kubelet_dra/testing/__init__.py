"""The public test kit: a real DRA driver and an API-server stand-in.

Public names (:data:`__all__`; the modules behind them are private):

- :class:`FakeDriver`: registration socket, DRA service and a scriptable
  health service (v1, v1alpha1, both, none, or UNIMPLEMENTED) over real gRPC
  on unix sockets; also runnable as ``kubelet-dra-health fake-driver``;
- :class:`FakeDriverClient`: scripts such a subprocess through its JSON-lines
  control socket;
- :class:`FakeApiServer`: a real HTTP server the official ``kubernetes``
  client talks to, with the API's patch semantics, resourceVersion conflicts,
  watches and fault injection; :func:`make_pod` and :func:`make_claim` build
  the objects it serves;
- :func:`eventually` (and :func:`eventually_sync` without an event loop):
  wait for a condition on real time; a timeout says what was waited for and
  what was seen last.

Our own integration tests, the demo and the benchmarks use exactly these, so
other projects can test their node agents and kubelets with them too.
"""

from kubelet_dra.testing._eventually import eventually, eventually_sync
from kubelet_dra.testing.fakeapi import FakeApiServer, make_claim, make_pod
from kubelet_dra.testing.fakedriver import FakeDriver
from kubelet_dra.testing.fakedriver_control import FakeDriverClient

__all__ = [
    "FakeApiServer",
    "FakeDriver",
    "FakeDriverClient",
    "eventually",
    "eventually_sync",
    "make_claim",
    "make_pod",
]
