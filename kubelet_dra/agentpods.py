"""``AgentPods``: a node agent's pods and their desired device status, sent to its callback.

The node-agent counterpart of ``kube.NodePods`` plus ``kube.StatusWriter``: an agent that
owns pod status gives us its pods (:meth:`AgentPods.set_pod`) and receives each pod's desired
``allocatedResourcesStatus`` and condition (:class:`PodHealthUpdate`), coalesced like the
writer's: at most one callback per pod per ``write_window``, with its latest state. In the
kubelet the same data goes from the DRA manager's ``Updates()`` channel to the status
manager (``manager.go``); nothing is dropped here, where the kubelet drops updates when its
channel is full.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from kubelet_dra import clock as clock_mod
from kubelet_dra import models
from kubelet_dra import settings as settings_mod
from kubelet_dra.status import claims, podstatus

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PodHealthUpdate:
    """What a node agent's callback receives: one pod's desired device status.

    ``desired.containers`` maps (status field, container) to the
    ``allocatedResourcesStatus`` entries we manage (``None``: remove that
    entry); ``desired.condition`` is the pod condition or ``None``. Use
    ``kubelet_dra.merge_pod_status(current_status, desired, now=...)`` to apply it.
    """

    pod_uid: str
    desired: podstatus.Desired


StatusCallback = Callable[[PodHealthUpdate], Awaitable[None] | None]


class AgentPods:
    """The pods a node agent gave us; :meth:`run` delivers their desired status."""

    def __init__(
        self,
        *,
        index: claims.ClaimIndex,
        health: models.HealthOf,
        settings: settings_mod.Settings,
        clock: clock_mod.Clock,
        on_status: StatusCallback | None,
    ) -> None:
        self._index = index
        self._health = health
        self._settings = settings
        self._clock = clock
        self._on_status = on_status
        self._pods: dict[str, Mapping[str, Any]] = {}
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()

    @property
    def pending(self) -> int:
        """Pods waiting for a callback."""
        return len(self._dirty)

    @property
    def idle(self) -> bool:
        """No pod is waiting for a callback and no round is due (for tests and probes)."""
        return not self._dirty and not self._wake.is_set()

    def set_pod(self, pod: Mapping[str, Any]) -> None:
        """Add or replace a pod (a dict as the API shows it); its status is recomputed."""
        uid = str(pod["metadata"]["uid"])
        self._pods[uid] = pod
        self._index.set_pod(pod)
        self.mark_dirty([uid])

    def remove_pod(self, uid: str) -> None:
        """Forget a pod: no more callbacks for it."""
        self._pods.pop(uid, None)
        self._index.remove_pod(uid)

    def mark_dirty(self, uids: Iterable[str]) -> None:
        """Recompute these pods' desired status and send it (coalesced)."""
        self._dirty |= set(uids)
        self._wake.set()

    def desired(self, uid: str) -> podstatus.Desired | None:
        """The desired device status of a known pod, now."""
        pod = self._pods.get(uid)
        if pod is None:
            return None
        now = self._clock.now()
        return podstatus.desired_status(
            pod,
            index=self._index,
            health_of=lambda key: self._health(key, now),
            now=now,
            condition_type=self._settings.pod_condition_type,
        )

    async def run(self) -> None:
        """Deliver dirty pods' status to the callback, one window after the first change."""
        while True:
            await self._wake.wait()
            await self._clock.sleep(self._settings.write_window)
            self._wake.clear()
            dirty, self._dirty = self._dirty, set()
            for uid in sorted(dirty):
                await self._deliver(uid)

    async def _deliver(self, uid: str) -> None:
        desired = self.desired(uid)
        if desired is None or self._on_status is None:
            return
        try:
            result = self._on_status(PodHealthUpdate(uid, desired))
            if result is not None:
                await result
        except Exception:
            logger.exception("status callback failed for pod %s", uid)
