"""The Kubernetes side: the node's pods and their claims in, pod status and Events out.

The only package of the library that talks to the API (outside it only ``kubectl/`` and
``testing/`` import ``kubernetes``; an import-linter contract checks it). Kubelet
counterparts: the pod manager's view of the node's pods, the status manager with
``PatchPodStatus``, and the event recorder. ``api`` makes the calls on plain JSON,
``asyncpatch`` sends the status PATCH on the event loop, ``pods`` (:class:`NodePods`) lists
and watches the node's pods and GETs their claims, ``writer`` (:class:`StatusWriter`) turns
dirty pods into patches with ``patchplan``, ``podstate``, ``calls`` and ``gates``, and
``events`` records Events; ``taintrules`` serves the taint bridge and the kubectl plugin.
"""

from __future__ import annotations

from kubelet_dra.kube.api import Api, ApiClient, CallError, load_client
from kubelet_dra.kube.calls import TokenBucket
from kubelet_dra.kube.events import EventRecorder
from kubelet_dra.kube.pods import NodePods
from kubelet_dra.kube.writer import StatusWriter, WriterStats

__all__ = [
    "Api",
    "ApiClient",
    "CallError",
    "EventRecorder",
    "NodePods",
    "StatusWriter",
    "TokenBucket",
    "WriterStats",
    "load_client",
]
