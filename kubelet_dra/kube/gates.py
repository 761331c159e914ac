"""What the API server keeps of our writes, learned from its answers.

Part of ``kube``. No kubelet counterpart: the kubelet is built with the API
server's feature gates known; a sidecar talks to whatever server it finds.

- ``ResourceHealthStatus`` off: the server drops
  ``allocatedResourcesStatus`` from the containers we sent it for. Logged
  once, one Event on the node, and the field is not sent any more (only the
  condition and events remain).
- ``ResourceHealthStatusMessage`` off: the server drops the ``message`` of
  each resource; we stop sending messages.
- Health entries of init containers (sidecars) refused with a 422 whose
  ``test`` operations all held: validation there is not verified upstream, so
  we stop sending them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from kubelet_dra import claims, podjson, podstatus
from kubelet_dra.kube import api as kube_api
from kubelet_dra.kube import events as kube_events
from kubelet_dra.kube import patchplan
from kubelet_dra.podjson import Obj

logger = logging.getLogger(__name__)


class ServerGates:
    """The gates and refusals seen so far; each is detected once and stays."""

    def __init__(self, *, node: str, events: kube_events.EventRecorder) -> None:
        self.node = node
        self.health_dropped = False  # ResourceHealthStatus off
        self.message_dropped = False  # ResourceHealthStatusMessage off
        self.sidecars_refused = False
        self.detected = 0  # times the health gate was found off (once at most)
        self._events = events

    def check_answer(self, plan: patchplan.Plan, answer: Obj) -> None:
        """Compare what a write sent with what the server answered it kept."""
        got = podjson.status(answer)
        for write in plan.containers:
            echoed = podstatus.container_entries(got, write.field, write.name)
            if write.entries and not echoed:
                self._health_gate_off()
                return
            if _has_message(write.entries) and not _has_message(echoed):
                self._message_gate_off()

    def refused_sidecars(self, exc: kube_api.CallError, plan: patchplan.Plan) -> bool:
        """Whether a 422 refused our init container entries (send again without them)."""
        if exc.status != 422 or claims.INIT_CONTAINERS not in plan.fields or self.sidecars_refused:
            return False
        logger.warning("API server refuses device health on init containers; skipping them")
        self.sidecars_refused = True
        return True

    def _health_gate_off(self) -> None:
        if self.health_dropped:
            return
        self.health_dropped = True
        self.detected += 1
        logger.error(
            "The API server drops containerStatuses[].allocatedResourcesStatus: its "
            "ResourceHealthStatus feature gate is off. Writing only the pod condition from now on."
        )
        self._events.record(
            kube_events.node_ref(self.node), "ResourceHealthStatusDisabled",
            "The API server drops allocatedResourcesStatus (feature gate ResourceHealthStatus "
            "off); only the device-health condition is written", kind="Warning",
        )  # fmt: skip

    def _message_gate_off(self) -> None:
        if not self.message_dropped:
            self.message_dropped = True
            logger.warning(
                "The API server drops allocatedResourcesStatus messages "
                "(feature gate ResourceHealthStatusMessage off); sending health without them"
            )


def _has_message(entries: Iterable[Obj] | None) -> bool:
    return any(r.get("message") for e in entries or () for r in e.get("resources") or ())
