"""The sidecar's side of a conformance run: our pipeline writing pod status through the API.

On the newest two kubelet lines (:data:`LINES`) a run has a third participant
beside the twin and our node agent: the manager as ``kubelet-dra-health run``
builds it (the observer role, no status callback), against a
:class:`~kubelet_dra.testing.fakeapi.FakeApiServer` of its own. It learns
what the sidecar learns next to a kubelet:

- **pods** from the API (list and watch, ``spec.nodeName``): each scenario pod
  is created at setup, bound to the node, with no container statuses; when
  the twin has prepared it, its containers are listed (the kubelet starting
  them), and when it is unprepared its phase turns ``Succeeded`` first (a
  kubelet unprepares a pod's claims after its containers ended);
- **claims** by GET from the API, as the scenario allocates and reserves
  them;
- **the CDI device IDs** from the twin's own ``dra_manager_state``: the
  kubelet DRA manager's checkpoint in the twin's state directory, read
  through the library option ``Settings.kubelet_root_dir`` (the twin serves
  no PodResources API; on a node ``run`` asks the kubelet's socket);
- **health** from its own streams on the same driver sockets (a third
  ``NodeWatchResources`` client), after the same registration events as our
  node agent (the twin's watcher handler, so no registry directory).

At each sync point the runner reads every pod back from the stand-in and
compares its ``allocatedResourcesStatus`` with the twin's, kind ``sidecar``,
with exactly the status comparisons (``_compare.compare_status``). A
declaration of kind ``status`` covers the same comparison of the sidecar: both
are our pipeline, and what the kubelet does differently it does to both; a
difference only the sidecar's writer shows needs a declaration of its own.

The field is written in ``auto`` mode beside a kubelet (the checkpoint is
there) with no hold (``kubelet_field_grace`` 0): the twin writes into no API,
so nothing else writes or removes the field, and a hold would only delay it.
"""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import Mapping
from typing import Any

from kubelet_dra import manager as manager_mod
from kubelet_dra import settings as settings_mod
from kubelet_dra.plugin import getinfo
from kubelet_dra.status import claims
from kubelet_dra.status.podjson import Obj
from kubelet_dra.testing import fakeapi
from tests.conformance import _ours

LINES = ("1.37", "1.38")
"""The kubelet lines whose runs compare the sidecar's writes too (the newest two)."""


class SidecarSide(_ours.Registrations):
    """The sidecar's manager, its API stand-in, and the pods it writes."""

    def __init__(self, state_dir: pathlib.Path, *, node: str, kubelet_dir: pathlib.Path) -> None:
        self.settings = settings_mod.Settings(
            **_ours.run_settings(node, state_dir),
            plugins_registry=state_dir / "unused-registry",
            role=settings_mod.Role.OBSERVER,
            kubelet_root_dir=kubelet_dir,
            kubelet_checkpoint_interval=0.05,
            kubelet_field_grace=0.0,
            api_qps=1000.0,
            api_burst=1000,
        )
        # Started here, so that the manager holds a client from construction on: a
        # thread serving 127.0.0.1, stopped by stop() (the run's teardown).
        self.server = fakeapi.FakeApiServer().start()
        self.client = self.server.api_client()
        self.manager = manager_mod.DRAHealthManager(
            self.settings, api_client=self.client, watch_registry=False
        )
        self.endpoints: dict[str, getinfo.PluginInfo] = {}

    async def start(self) -> None:
        await self.manager.start()

    async def stop(self) -> None:
        try:
            await self.manager.close()
        finally:
            self.client.close()
            await asyncio.to_thread(self.server.stop)

    # -- the API's objects ---------------------------------------------------

    def admit(self, pods: Mapping[str, Obj]) -> dict[str, str]:
        """Create the pods, bound and not started; the UID the stand-in gave each, by the
        scenario's UID."""
        uids = {}
        for pod in pods.values():
            created = self.server.create_pod(_unstarted(pod))
            uids[str(pod["metadata"]["uid"])] = str(created["metadata"]["uid"])
        return uids

    def add_claims(self, objects: Mapping[str, Obj]) -> None:
        for obj in objects.values():
            self.server.create_claim(dict(obj))  # stored as a copy, without uid and version

    def started(self, pod: Obj) -> None:
        """The kubelet prepared the pod and started its containers: they are listed."""
        listed = {
            field: [{"name": cs["name"]} for cs in pod["status"].get(field) or ()]
            for field in (claims.CONTAINERS, claims.INIT_CONTAINERS)
        }

        def start(current: dict[str, Any]) -> dict[str, Any]:
            status = current.setdefault("status", {})
            status["phase"] = "Running"
            for field, statuses in listed.items():
                if statuses:
                    status[field] = statuses
            return current

        self.server.update_pod(pod["metadata"]["namespace"], pod["metadata"]["name"], start)

    def ended(self, pod: Obj) -> None:
        """The pod's containers ended (before the kubelet unprepares its claims)."""

        def end(current: dict[str, Any]) -> dict[str, Any]:
            current.setdefault("status", {})["phase"] = "Succeeded"
            return current

        self.server.update_pod(pod["metadata"]["namespace"], pod["metadata"]["name"], end)

    # -- what is compared ----------------------------------------------------

    def settled(self) -> bool:
        """Caught up: no lease overdue, every pod's newest version and its claims read,
        the kubelet's checkpoint read as it stands, no pod waiting for a write and no
        write on its way (a pod read back while its PATCH is in flight showed the
        entries missing once in CI, at load)."""
        if not _ours.deadlines_caught_up(self.manager):
            return False
        pods, writer, checkpoint = self.manager.pods, self.manager.writer, self.manager.checkpoint
        if pods is None or writer is None or checkpoint is None:
            return False
        # A round's pods leave ``pending`` before their writes land: both must be 0.
        if not pods.claims_synced or not checkpoint.caught_up:
            return False
        if writer.stats.pending or writer.stats.in_flight:
            return False
        # A claim read before the scenario created or allocated it counts as read
        # (``claims_synced``) while its next GET waits out a backoff: until that GET,
        # its pods have no devices and the sidecar writes none (generated-84 on 1.38,
        # once under load: pod-1 without entries at its first sync point).
        for key in pods.claims_fetching:
            if _allocated_in(self.server, key):
                return False
        for pod in self.server.list_pods():
            seen = pods.get(str(pod["metadata"]["uid"]))
            version = pod["metadata"]["resourceVersion"]
            if seen is None or seen["metadata"].get("resourceVersion") != version:
                return False
        return True

    def explain(self, pod: Obj) -> str:
        """What the sidecar's writer knows of ``pod`` and of the node, for a difference's
        report: a run that differs once under load must say why (generated-84 and
        generated-173 on 1.38 showed a pod without entries, nothing more)."""
        uid = self.server.get_pod(pod["metadata"]["namespace"], pod["metadata"]["name"])[
            "metadata"
        ]["uid"]
        writer, index = self.manager.writer, self.manager.index
        if writer is None or index is None:
            return "the sidecar's writer did not start"
        state = writer.state(str(uid))
        facts = [
            f"results {dict(writer.stats.results)}",
            f"API drops the field {writer.stats.gate_off}, "
            f"the message {writer.stats.message_gate_off}",
            f"kubelet removes {writer.kubelet.removes} ({writer.kubelet.removals} removals)",
            f"devices of the pod {len(index.devices_of_pod(str(uid)))}",
        ]
        if state is None:
            facts.append("the writer does not know the pod")
        else:
            written = None if state.written is None else state.written.rv
            facts.append(
                f"pod: written at rv {written}, kubelet owned {state.kubelet_owned}, "
                f"failures {state.failures}, due {state.due}, record {state.record is not None}, "
                f"rv {state.pod['metadata'].get('resourceVersion')}"
            )
        return "; ".join(facts)

    def status_of(self, pod: Obj) -> dict[str, Any]:
        """The pod's status as the stand-in holds it."""
        stored = self.server.get_pod(pod["metadata"]["namespace"], pod["metadata"]["name"])
        return dict(stored.get("status") or {})


def _allocated_in(server: fakeapi.FakeApiServer, key: claims.ClaimKey) -> bool:
    try:
        stored = server.get_claim(key.namespace, key.name)
    except fakeapi.ApiError:  # not there (yet): its pods wait for it, as on a node
        return False
    return claims.is_allocated(stored)


def _unstarted(pod: Obj) -> dict[str, Any]:
    """The pod as the scheduler bound it: no container is listed yet."""
    status = {"phase": "Pending"}
    claimed = pod["status"].get("resourceClaimStatuses")
    if claimed:
        status["resourceClaimStatuses"] = claimed
    return {**pod, "status": status}  # the stand-in gives it a UID of its own
