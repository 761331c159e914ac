"""What the API server and the kubelet keep of our writes, learned from pods.

Part of ``kube``. No kubelet counterpart: the kubelet is built with the API server's
feature gates known; a sidecar talks to whatever server it finds, next to a kubelet whose
gates it cannot read. :class:`ServerGates` is the server's side (``ResourceHealthStatus``,
``ResourceHealthStatusMessage``, init-container entries); :class:`KubeletGate` the
kubelet's, which removes or rewrites the field we write.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from kubelet_dra import settings
from kubelet_dra.kube import api as kube_api
from kubelet_dra.kube import events as kube_events
from kubelet_dra.kube import patchplan, podstate
from kubelet_dra.status import claims, podjson, podstatus
from kubelet_dra.status.podjson import Obj

logger = logging.getLogger(__name__)

KUBELET_REMOVES_REASON = "KubeletRemovesResourceHealth"
"""The Node Event's reason: a contract, checks outside this repository look for it."""


class ServerGates:
    """The gates and refusals seen so far; each is detected once and stays.

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


class KubeletGate:
    """Whether the node's kubelet removes the field we write; found once, for the node.

    A kubelet whose own ``ResourceHealthStatus`` gate is off removes the field at its next
    status reconcile (its status manager patches the whole atomic ``containerStatuses`` list,
    ``pkg/kubelet/status/status_manager.go`` and ``pkg/util/pod/pod.go``). The gate is the
    kubelet's, so the finding holds for the whole node. It is said once: a log line, the
    ``kubelet_removes_field`` gauge, a ``/readyz`` note and a Node Event with reason
    :data:`KUBELET_REMOVES_REASON`. With ``--container-status on`` a kubelet rewriting the field
    with entries of its own is counted too (``field_rewrites``) and said once in the log.
    """

    def __init__(
        self,
        *,
        node: str,
        events: kube_events.EventRecorder,
        mode: settings.ContainerStatusMode,
        condition_type: str,
    ) -> None:
        self.node = node
        self.removes = False  # the kubelet's ResourceHealthStatus gate is off
        self.removals = 0  # removals seen, every pod, every mode
        self.rewrites = 0  # ``on``: rewrites by the kubelet of what we wrote, every pod
        self._events = events
        self._mode = mode
        self._condition = condition_type

    def removed(self, pod: Obj) -> None:
        """The kubelet removed the field we wrote in ``pod``: count it, say it once."""
        self.removals += 1
        if self.removes:
            return
        self.removes = True
        where = f"{podjson.namespace(pod)}/{podjson.name(pod)}"
        logger.warning("%s (first seen on pod %s). %s", self.summary(), where, self._action())
        self._events.record(
            kube_events.node_ref(self.node), KUBELET_REMOVES_REASON,
            self.note(), kind="Warning",
        )  # fmt: skip

    def rewrote(self, pod: Obj) -> None:
        """``on``: the kubelet rewrote the field we wrote in ``pod``: count it, say it once."""
        self.rewrites += 1
        if self.rewrites > 1:
            return
        logger.warning(
            "The kubelet on node %s rewrites containerStatuses[].allocatedResourcesStatus that "
            "the sidecar writes, with entries of its own (first seen on pod %s/%s; devices "
            "sharing their first CDI ID get one entry). --container-status on: rewriting the "
            "field at most once per pod per %g minutes; use --container-status auto to leave "
            "the field to the kubelet",
            self.node, podjson.namespace(pod), podjson.name(pod),
            podstate.REMOVAL_BACKOFF_MAX / 60,
        )  # fmt: skip

    def summary(self) -> str:
        """What happened, in one sentence (the log line, the Event, ``/readyz``)."""
        return (
            f"The kubelet on node {self.node} removes containerStatuses[].allocatedResourcesStatus "
            "that the sidecar writes: its ResourceHealthStatus feature gate is off"
        )

    def note(self) -> str:
        """The ``/readyz`` note: what happened and what the sidecar does about it."""
        return f"{self.summary()}. {self._action()}"

    def _action(self) -> str:
        where = (
            f"device health stays in the pod condition {self._condition} and in Events"
            if self._condition
            else "device health stays in Events (the pod condition is disabled)"
        )
        if self._mode is settings.ContainerStatusMode.ON:
            return (
                "--container-status on: rewriting the field at most once per pod per "
                f"{podstate.REMOVAL_BACKOFF_MAX / 60:g} minutes; {where}. Turn the kubelet's "
                "ResourceHealthStatus gate on to keep the field, or use --container-status auto "
                "to stop rewriting it"
            )
        return (
            f"Not writing that field on this node any more; {where}. Turn the kubelet's "
            "ResourceHealthStatus gate on to get the field (the kubelet then writes it), "
            "or set --container-status off to say so"
        )
