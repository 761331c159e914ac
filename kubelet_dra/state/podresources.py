"""Device names from the kubelet's PodResources API: ``List``, ``Get``, reconnect, fall back.

The client side of the kubelet's ``pkg/kubelet/apis/podresources/server_v1.go`` (``List``
and ``Get`` on ``<root dir>/pod-resources/kubelet.sock``) and of ``GetDynamicResources`` in
``pkg/kubelet/cm/container_manager_linux.go``, which answers, per container, each claim with
every device of it and the CDI device IDs its driver returned at prepare. The kubelet names
a device in ``allocatedResourcesStatus`` by the first of those IDs, so this is where the
sidecar learns the kubelet's names without reading its files. :class:`PodResourcesClient`
says what the kubelet does that shapes it.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import logging
import pathlib
import random
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

import grpc

from kubelet_dra import clock as clock_mod
from kubelet_dra import settings as settings_mod
from kubelet_dra._proto.podresources.v1 import api_pb2 as pb
from kubelet_dra._proto.podresources.v1 import api_pb2_grpc as pb_grpc
from kubelet_dra.plugin import streams
from kubelet_dra.status import claims

logger = logging.getLogger(__name__)

FALLBACK_UNIMPLEMENTED = "unimplemented"
FALLBACK_NO_DYNAMIC_RESOURCES = "no_dynamic_resources"
FALLBACK_REASONS = (FALLBACK_UNIMPLEMENTED, FALLBACK_NO_DYNAMIC_RESOURCES)
"""Why names fall back to ``<driver>/<pool>/<device>`` (the ``reason`` label)."""

CALL_TIMEOUT = 10.0
"""Seconds one ``List`` or ``Get`` may take (the kubelet answers from memory)."""

PodName = tuple[str, str]
"""A pod as the PodResources API names it: (namespace, name)."""
Apply = Callable[[claims.ClaimKey, claims.ClaimNames], None]
_T = TypeVar("_T")


class State(enum.StrEnum):
    CONNECTING = "connecting"
    READY = "ready"
    BACKOFF = "backoff"
    STOPPED = "stopped"


# -- the kubelet's answers (pure) ---------------------------------------------------


def claim_names(
    pod: pb.PodResources,
) -> dict[claims.ClaimKey, dict[claims.NameKey, tuple[str, ...]]]:
    """Every claim of one pod's answer, each device with its own CDI device IDs."""
    found: dict[claims.ClaimKey, dict[claims.NameKey, tuple[str, ...]]] = {}
    for container in pod.containers:
        for resource in container.dynamic_resources:
            key = claims.ClaimKey(resource.claim_namespace or pod.namespace, resource.claim_name)
            if resource.claim_name and resource.claim_resources:
                found.setdefault(key, {}).update(_devices(resource.claim_resources))
    return found


def _devices(resources: Iterable[pb.ClaimResource]) -> dict[claims.NameKey, tuple[str, ...]]:
    names: dict[claims.NameKey, tuple[str, ...]] = {}
    driver, before = "", tuple[str, ...]()
    for resource in resources:
        ids = tuple(cdi.name for cdi in resource.cdi_devices)
        own = ids
        # The kubelet's list for this driver so far comes first (see the module doc).
        if resource.driver_name == driver and before and ids[: len(before)] == before:
            own = ids[len(before) :]
        driver, before = resource.driver_name, ids
        share = resource.share_id if resource.HasField("share_id") else None
        key = claims.NameKey(resource.driver_name, resource.pool_name, resource.device_name, share)
        names[key] = own
    return names


# -- the client ---------------------------------------------------------------------


class PodResourcesClient:
    """Learns the kubelet's CDI device IDs of the node's claims and hands them to ``apply``.

    :meth:`run` is the loop (a task of the manager); :meth:`pod_seen` asks for a pod
    the API side indexed; the attributes are plain state for metrics and ``/readyz``.

    What the kubelet does that shapes this module:

    - ``List`` answers every pod it knows, or only active ones where
      ``KubeletPodResourcesListUseActivePods`` is on: a terminal pod drops out. Names
      learned for a claim are kept (:meth:`ClaimIndex.set_claim_names` keeps them
      until no pod references the claim), never taken back because a pod left the list.
    - ``Get`` answers one pod by namespace and name, or an error for a pod it does not
      know; a container whose claim is not prepared yet answers no dynamic resources.
      So a pod is asked for on its API events until an answer names its claims.
    - Within one claim, ``GetDynamicResources`` appends each device's CDI IDs to one
      list per driver, so the n-th device of a driver reports the IDs of the devices
      before it first (every line from 1.34 to 1.38.0-beta.0). :func:`claim_names`
      takes a device's own IDs as what follows the previous device's list.
    - A kubelet restart removes and re-creates the socket: the channel leaves
      ``READY``, and the client connects again with the health streams' backoff
      (``plugin.streams.Backoff``, on the injected clock), then lists again. A
      channel that goes idle (gRPC's idle timeout) leaves ``READY`` too: one more
      ``List``, no harm.
    - A kubelet without ``KubeletPodResourcesDynamicResources`` (1.34 or 1.35 with it
      turned off) answers containers without ``dynamic_resources``; a server without
      the service answers ``UNIMPLEMENTED``. Names then stay ``<driver>/<pool>/<device>``
      and :attr:`PodResourcesClient.fallback` says why (``/readyz``, a metric), once.
    """

    def __init__(
        self,
        socket: pathlib.Path,
        *,
        apply: Apply,
        settings: settings_mod.Settings,
        clock: clock_mod.Clock,
        rng: random.Random | None = None,
    ) -> None:
        self.socket = socket
        self._apply = apply
        self._settings = settings
        self._clock = clock
        self._backoff = streams.Backoff(
            initial=settings.stream_backoff_initial,
            cap=settings.stream_backoff_max,
            rng=rng or random.Random(),
        )
        self.state = State.CONNECTING
        self.present = False
        """The kubelet answered on the socket at least once (a kubelet is beside us)."""
        self.fallback: str | None = None
        """Why names are ``<driver>/<pool>/<device>`` now (:data:`FALLBACK_REASONS`), or None."""
        self.reconnects = 0
        self.calls: collections.Counter[tuple[str, str]] = collections.Counter()
        """(method, gRPC code name) -> calls."""
        self.last_error = ""
        self._named: set[PodName] = set()
        self._running: set[PodName] = set()  # Running per the API, with claims: prepared
        self._wanted: dict[PodName, None] = {}
        self._wake = asyncio.Event()
        self._logged: set[str] = set()

    # -- what the API side tells us ----------------------------------------------------

    def pod_seen(self, namespace: str, name: str, *, has_claims: bool, running: bool) -> None:
        """A pod of the node (an API event): ask the kubelet for it until its claims are named."""
        pod = (namespace, name)
        if running and has_claims:
            self._running.add(pod)
        else:
            self._running.discard(pod)
        if has_claims and pod not in self._named and pod not in self._wanted:
            self._wanted[pod] = None
            self._wake.set()

    def pod_gone(self, namespace: str, name: str) -> None:
        """A pod deleted from the API: nothing more to ask (its names go with its claims)."""
        pod = (namespace, name)
        self._named.discard(pod)
        self._running.discard(pod)
        self._wanted.pop(pod, None)

    def note(self) -> str | None:
        """The ``/readyz`` detail while names fall back, else None."""
        if self.fallback == FALLBACK_UNIMPLEMENTED:
            return (
                f"the kubelet's PodResources API at {self.socket} answers UNIMPLEMENTED; "
                "devices are named <driver>/<pool>/<device>, which need not be the kubelet's names"
            )
        if self.fallback == FALLBACK_NO_DYNAMIC_RESOURCES:
            return (
                f"the kubelet's PodResources API at {self.socket} lists no dynamic resources for "
                "running pods with claims (its KubeletPodResourcesDynamicResources gate is off); "
                "devices are named <driver>/<pool>/<device>"
            )
        return None

    # -- the loop ----------------------------------------------------------------------

    async def run(self) -> None:
        """Connect, list, answer :meth:`pod_seen`; after a break, back off and list again."""
        try:
            while True:
                healthy, unimplemented = await self._attempt()
                self.state = State.BACKOFF
                if healthy >= self._settings.stream_backoff_reset_after:
                    self._backoff.reset()
                delay = self._backoff.next()
                if unimplemented:
                    delay = self._settings.stream_backoff_max  # nothing changes until a restart
                await self._clock.sleep(delay)
                self.reconnects += 1
        finally:
            self.state = State.STOPPED

    async def _attempt(self) -> tuple[float, bool]:
        """One connection: (seconds it was ready, whether to wait the longest delay next)."""
        self.state = State.CONNECTING
        ready_at: float | None = None
        options = [("grpc.max_receive_message_length", self._settings.max_message_bytes)]
        try:
            async with grpc.aio.insecure_channel(f"unix:{self.socket}", options=options) as ch:
                stub = pb_grpc.PodResourcesListerStub(ch)
                await self._list(stub)
                ready_at = self._clock.now()
                self.state = State.READY
                await self._serve(ch, stub)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                self.present = True
                self._fall_back(FALLBACK_UNIMPLEMENTED)
                return 0.0, True
            self._failed(exc)
        except Exception:
            # A bug here must not end naming for good: logged, then retried at the cap.
            logger.exception("the PodResources client crashed; restarting it")
            return 0.0, True
        return (0.0 if ready_at is None else self._clock.now() - ready_at), False

    async def _list(self, stub: pb_grpc.PodResourcesListerStub) -> None:
        answer = await self._call(
            "List", stub.List(pb.ListPodResourcesRequest(), timeout=CALL_TIMEOUT)
        )
        self.present = True
        for pod in answer.pod_resources:
            self._learn(pod)

    async def _serve(self, channel: grpc.aio.Channel, stub: pb_grpc.PodResourcesListerStub) -> None:
        """Answer wanted pods with ``Get`` until the channel leaves ``READY`` (a restart)."""
        broken = asyncio.ensure_future(_left_ready(channel))
        try:
            while not broken.done():
                if not self._wanted:
                    self._wake.clear()
                    waker = asyncio.ensure_future(self._wake.wait())
                    await asyncio.wait({broken, waker}, return_when=asyncio.FIRST_COMPLETED)
                    waker.cancel()
                    continue
                pod = next(iter(self._wanted))
                await self._get(stub, pod)
        finally:
            broken.cancel()

    async def _get(self, stub: pb_grpc.PodResourcesListerStub, pod: PodName) -> None:
        request = pb.GetPodResourcesRequest(pod_namespace=pod[0], pod_name=pod[1])
        try:
            answer = await self._call("Get", stub.Get(request, timeout=CALL_TIMEOUT))
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                raise  # the kubelet went away: the pod stays wanted for the next connection
            # A pod the kubelet does not know yet (its error has no code of its own):
            # asked again at the pod's next API event.
            self._wanted.pop(pod, None)
            return
        self._wanted.pop(pod, None)
        self._learn(answer.pod_resources)

    async def _call(self, method: str, call: Awaitable[_T]) -> _T:
        try:
            answer = await call
        except grpc.aio.AioRpcError as exc:
            self.calls[(method, exc.code().name)] += 1
            raise
        self.calls[(method, "OK")] += 1
        return answer

    def _learn(self, pod: pb.PodResources) -> None:
        found = claim_names(pod)
        name = (pod.namespace, pod.name)
        if not found:
            if name in self._running:
                self._fall_back(FALLBACK_NO_DYNAMIC_RESOURCES)
            return
        self._named.add(name)
        self._wanted.pop(name, None)  # named by a List: no Get for it any more
        if self.fallback is not None:
            logger.info("the kubelet's PodResources API names devices again")
            self.fallback = None
        for key, names in found.items():
            self._apply(key, names)

    def _fall_back(self, reason: str) -> None:
        if self.fallback == reason:
            return
        self.fallback = reason
        if reason not in self._logged:
            self._logged.add(reason)
            logger.warning("%s", self.note())

    def _failed(self, exc: grpc.aio.AioRpcError) -> None:
        self.last_error = f"{exc.code().name}: {exc.details()}"
        if exc.code().name not in self._logged:
            self._logged.add(exc.code().name)
            logger.warning(
                "the kubelet's PodResources API at %s: %s; retrying", self.socket, self.last_error
            )


async def _left_ready(channel: grpc.aio.Channel) -> None:
    """Return once the channel is no longer ``READY``: the kubelet's socket went away."""
    state = channel.get_state(try_to_connect=False)
    while state is grpc.ChannelConnectivity.READY:
        await channel.wait_for_state_change(state)
        state = channel.get_state(try_to_connect=False)
