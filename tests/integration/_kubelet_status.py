"""A test-side kubelet status manager that reconciles pod status through the API.

Models what a real kubelet v1.37.2 does to a pod's status, measured beside the sidecar
(issue 19) and read in ``pkg/kubelet/status/status_manager.go`` and ``pkg/util/pod/pod.go``:

- at each reconcile it reads the pod and computes its own ``containerStatuses``, the whole
  list (``+listType=atomic``). With its ``ResourceHealthStatus`` gate off the list carries no
  ``allocatedResourcesStatus``; with the gate on, its own entries (``entries``, CDI-style IDs);
- ``mergePodStatus`` keeps every condition that is not the kubelet's (ours among them), and
  ``isPodStatusByKubeletEqual`` ignores conditions: a pod whose container statuses already
  match is not written;
- otherwise it sends ``PatchPodStatus``: a strategic merge patch with the UID and the whole
  list (a two-way merge patch of an atomic list is the new list), through the official client.
  ``flip_ready`` also changes its own ``Ready`` condition each time, so the patch carries
  ``conditions`` merged by type, as a real kubelet's does when readiness changes.

It writes nothing itself outside the API: every effect reaches the sidecar through the
server (its answer, the watch), as the real kubelet's does.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections.abc import AsyncIterator, Callable

import kubernetes

from kubelet_dra.status.podjson import MutableObj as Obj
from kubelet_dra.testing import FakeApiServer

Entries = Callable[[Obj, str], list[Obj] | None]
"""The kubelet's own entries for one container of a pod (gate on), or ``None``: none."""


class KubeletStatusManager:
    """One node's status manager: :meth:`reconcile` is one ``syncPod``."""

    def __init__(
        self,
        server: FakeApiServer,
        *,
        entries: Entries | None = None,
        flip_ready: bool = False,
        touch: bool = False,
        keep_field: bool = False,
        node: str = "node-1",
    ) -> None:
        """``entries`` ``None``: the gate is off (no field). ``touch``: a field of its own
        (``restartCount``) changes at each reconcile. ``keep_field``: not a kubelet but
        another writer of container statuses that sends the field back as it found it."""
        self.server = server
        self.entries = entries
        self.flip_ready = flip_ready
        self.touch = touch
        self.keep_field = keep_field
        self.node = node
        self.writes = 0
        self.patches: list[Obj] = []
        self._client = server.api_client()
        self._core = kubernetes.client.CoreV1Api(self._client)

    def close(self) -> None:
        self._client.close()

    def reconcile(self, namespace: str, name: str) -> bool:
        """One reconcile of one pod; whether it wrote."""
        pod = self._read(namespace, name)
        old = pod.get("status") or {}
        new = self._merge_pod_status(pod, old)
        if not self.touch and not self.flip_ready and _equal_by_kubelet(old, new):
            return False
        patch = _two_way_patch(pod["metadata"]["uid"], old, new)
        self._core.patch_namespaced_pod_status(name, namespace, patch, _preload_content=False)
        self.patches.append(patch)
        self.writes += 1
        return True

    def reconcile_all(self, namespace: str = "default") -> int:
        """One ``syncBatch`` over this node's pods in ``namespace``; the writes it made."""
        return sum(
            self.reconcile(namespace, p["metadata"]["name"])
            for p in self.server.list_pods(namespace)
            if (p.get("spec") or {}).get("nodeName") == self.node
        )

    @contextlib.asynccontextmanager
    async def running(self, period: float) -> AsyncIterator[KubeletStatusManager]:
        """Reconcile every pod every ``period`` seconds (real time) while the block runs."""

        async def loop() -> None:
            while True:
                await asyncio.sleep(period)
                await asyncio.to_thread(self.reconcile_all)

        task = asyncio.create_task(loop())
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self.close()

    # -- internals -------------------------------------------------------------------

    def _read(self, namespace: str, name: str) -> Obj:
        answer = self._core.read_namespaced_pod(name, namespace, _preload_content=False)
        pod: Obj = json.loads(answer.data)  # type: ignore[attr-defined]  # a raw response
        return pod

    def _merge_pod_status(self, pod: Obj, old: Obj) -> Obj:
        """The kubelet's status for ``pod``, merged as ``mergePodStatus`` merges it."""
        new = copy.deepcopy(old)
        statuses = []
        for cs in copy.deepcopy(old.get("containerStatuses") or []):
            if not self.keep_field:
                cs.pop("allocatedResourcesStatus", None)
            own = self.entries(pod, cs["name"]) if self.entries is not None else None
            if own:
                cs["allocatedResourcesStatus"] = own
            if self.touch:
                cs["restartCount"] = int(cs.get("restartCount") or 0) + 1
            statuses.append(cs)
        new["containerStatuses"] = statuses
        conditions = []
        for cond in copy.deepcopy(old.get("conditions") or []):
            if cond.get("type") == "Ready" and self.flip_ready:
                cond["status"] = "False" if cond.get("status") == "True" else "True"
            conditions.append(cond)  # foreign conditions kept, in place
        new["conditions"] = conditions
        return new


def _equal_by_kubelet(old: Obj, new: Obj) -> bool:
    """``isPodStatusByKubeletEqual``: everything but conditions (and claim statuses)."""
    ignore = {"conditions", "resourceClaimStatuses"}
    return {k: v for k, v in old.items() if k not in ignore} == {
        k: v for k, v in new.items() if k not in ignore
    }


def _two_way_patch(uid: str, old: Obj, new: Obj) -> Obj:
    """What ``CreateTwoWayMergePatch`` gives for these two statuses (the parts we change)."""
    status: Obj = {}
    if old.get("containerStatuses") != new.get("containerStatuses"):
        status["containerStatuses"] = new["containerStatuses"]  # atomic: the whole list
    changed = [c for c in new.get("conditions") or [] if c not in (old.get("conditions") or [])]
    if changed:
        status["$setElementOrder/conditions"] = [
            {"type": c["type"]} for c in new.get("conditions") or []
        ]
        status["conditions"] = changed  # merged by type: other conditions stay
    return {"metadata": {"uid": uid}, "status": status}
