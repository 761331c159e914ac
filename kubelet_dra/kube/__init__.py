"""The Kubernetes side: the node's pods and their claims in, pod status and Events out.

The only package of the library that talks to the API: outside it only
``kubectl/`` (the plugin, on this package's calls) and ``testing/`` import
``kubernetes`` (an import-linter contract, ``tox -e lint``, checks it).
Its modules: ``api`` (the calls, on plain JSON: the one error translation,
call wrapper and paging helper), ``taintrules`` (DeviceTaintRules and their
version discovery, for the taint bridge and the kubectl plugin), ``asyncpatch`` (the status
PATCH's HTTP/1.1 client on the event loop), ``pods`` (:class:`NodePods`),
``writer`` (:class:`StatusWriter`) with its parts ``patchplan`` (the JSON
patch, planned purely), ``podstate`` (per-pod state, one object per pod),
``calls`` (rate limit and retries), ``gates`` (what the server keeps of our
writes) and ``events`` (the event recorder).
Kubelet counterparts: the pod manager's view of the node's pods, the status
manager with ``pkg/util/pod`` ``PatchPodStatus``, and the event recorder.

:class:`NodePods` lists and watches the pods with ``spec.nodeName=<node>``
(field selector; 410 Gone relists) and feeds them to the claim index and the
status writer. For each claim those pods reference it GETs that one
ResourceClaim, retrying while it is missing or not allocated yet. There is no
cluster-wide claim list or watch: the API load of a node grows with its own
pods only. No per-claim watch is needed either: a claim reserved for a pod
that runs on this node cannot change its allocation until the pod is gone,
and a pod that references a new claim arrives through the pod watch.

:class:`StatusWriter` (``kube.writer``) turns dirty pods into status
patches. Lease deadlines become dirty pods through ``plugins.PluginManager``'s
deadline task, like every other health change. Wiring, as the manager does it::

    api = kube.Api(kube.load_client(settings.kubeconfig))
    writer = kube.StatusWriter(api=api, node_name=node, index=index,
                               health=cache.get, config=settings, clock=clock)
    pods = kube.NodePods(api=api, node_name=node, index=index, writer=writer,
                         clock=clock)
    # every health change (reports, stream ends, lease deadlines) arrives as
    # on_change(changed) -> writer.mark_dirty(index.pods_for_devices(changed))
    # tasks: writer.run(), pods.run()
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
