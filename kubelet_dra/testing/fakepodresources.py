"""``FakePodResources``: the kubelet's PodResources API (v1) on a unix socket, scripted.

Serves ``List`` and ``Get`` of ``v1.PodResourcesLister`` over real gRPC the way the
kubelet's ``pkg/kubelet/apis/podresources/server_v1.go`` does, with the claims of each
container answered as ``GetDynamicResources`` in ``pkg/kubelet/cm/container_manager_linux.go``
builds them. A test sets pods and claims and chooses what kind of kubelet it is
(:class:`FakePodResources` lists the choices); :meth:`FakePodResources.restart` removes the
socket and serves a new one, as a kubelet restart does.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import os
import pathlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import grpc

from kubelet_dra._proto.podresources.v1 import api_pb2 as pb
from kubelet_dra._proto.podresources.v1 import api_pb2_grpc as pb_grpc


@dataclasses.dataclass(frozen=True)
class PodResourcesDevice:
    """One prepared device of a claim, with the CDI device IDs its driver returned."""

    driver: str
    pool: str
    device: str
    cdi_ids: tuple[str, ...] = ()
    share_id: str | None = None


@dataclasses.dataclass
class _Pod:
    containers: dict[str, tuple[str, ...]]  # container -> claim names it uses
    terminal: bool = False


class FakePodResources:
    """A scripted kubelet PodResources server. Use as ``async with FakePodResources(path)``.

    - ``dynamic_resources=False``: a kubelet whose ``KubeletPodResourcesDynamicResources``
      gate is off (containers answer no dynamic resources);
    - ``unimplemented=True``: no PodResources service at all (``UNIMPLEMENTED``);
    - a pod set ``terminal=True`` drops out of ``List`` (the kubelet's
      ``KubeletPodResourcesListUseActivePods``) but ``Get`` still answers it.
    """

    def __init__(
        self,
        socket: pathlib.Path,
        *,
        dynamic_resources: bool = True,
        unimplemented: bool = False,
    ) -> None:
        self.socket = socket
        self.dynamic_resources = dynamic_resources
        self.unimplemented = unimplemented
        self.calls: collections.Counter[str] = collections.Counter()
        """Method name (``List``, ``Get``) -> calls answered since construction."""
        self._pods: dict[tuple[str, str], _Pod] = {}
        self._claims: dict[tuple[str, str], tuple[PodResourcesDevice, ...]] = {}
        self._server: grpc.aio.Server | None = None
        self._changed = asyncio.Condition()

    # -- lifecycle ---------------------------------------------------------

    async def __aenter__(self) -> FakePodResources:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Serve on :attr:`socket` (a stale file there is replaced)."""
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        _unlink(self.socket)
        server = grpc.aio.server()
        if not self.unimplemented:
            pb_grpc.add_PodResourcesListerServicer_to_server(_Lister(self), server)
        server.add_insecure_port(f"unix:{self.socket}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        """Stop serving and remove the socket."""
        server, self._server = self._server, None
        if server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.stop(grace=None), timeout=5.0)
        _unlink(self.socket)

    async def restart(self) -> None:
        """A kubelet restart: the socket goes away and a new one is served."""
        await self.stop()
        await self.start()

    # -- what the kubelet knows ---------------------------------------------

    def set_claim(self, namespace: str, name: str, devices: Iterable[PodResourcesDevice]) -> None:
        """A claim the kubelet prepared, with its devices in the driver's answer order."""
        self._claims[(namespace, name)] = tuple(devices)

    def set_pod(
        self,
        namespace: str,
        name: str,
        containers: Mapping[str, Sequence[str]],
        *,
        terminal: bool = False,
    ) -> None:
        """A pod the kubelet runs: container name -> the claim names it uses."""
        self._pods[(namespace, name)] = _Pod(
            {c: tuple(refs) for c, refs in containers.items()}, terminal
        )

    def remove_pod(self, namespace: str, name: str) -> None:
        self._pods.pop((namespace, name), None)

    async def wait_for_calls(self, method: str, count: int = 1, *, timeout: float = 5.0) -> None:
        """Until ``method`` was answered ``count`` times in all."""
        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(lambda: self.calls[method] >= count), timeout
            )

    # -- answers -------------------------------------------------------------

    def pod_resources(self, namespace: str, name: str) -> pb.PodResources | None:
        """The pod as the kubelet's server answers it, or None if it does not know it."""
        pod = self._pods.get((namespace, name))
        if pod is None:
            return None
        containers = [
            pb.ContainerResources(name=container, dynamic_resources=self._dynamic(namespace, refs))
            for container, refs in pod.containers.items()
        ]
        return pb.PodResources(name=name, namespace=namespace, containers=containers)

    def _dynamic(self, namespace: str, refs: Sequence[str]) -> list[pb.DynamicResource]:
        if not self.dynamic_resources:
            return []
        found = []
        for ref in refs:
            devices = self._claims.get((namespace, ref))
            if devices is None:
                return []  # the kubelet answers nothing for a container with an unknown claim
            found.append(
                pb.DynamicResource(
                    claim_name=ref, claim_namespace=namespace, claim_resources=_resources(devices)
                )
            )
        return found

    def listed(self) -> list[pb.PodResources]:
        """What ``List`` answers: every pod not terminal."""
        out = []
        for (namespace, name), pod in self._pods.items():
            answer = self.pod_resources(namespace, name)
            if answer is not None and not pod.terminal:
                out.append(answer)
        return out

    async def _count(self, method: str) -> None:
        async with self._changed:
            self.calls[method] += 1
            self._changed.notify_all()


def _resources(devices: Sequence[PodResourcesDevice]) -> list[pb.ClaimResource]:
    # One growing CDI list per driver, as the kubelet builds it (see the module doc).
    by_driver: dict[str, list[PodResourcesDevice]] = {}
    for device in devices:
        by_driver.setdefault(device.driver, []).append(device)
    out = []
    for driver, group in by_driver.items():
        ids: list[str] = []
        for device in group:
            ids.extend(device.cdi_ids)
            out.append(
                pb.ClaimResource(
                    cdi_devices=[pb.CDIDevice(name=i) for i in ids],
                    driver_name=driver,
                    pool_name=device.pool,
                    device_name=device.device,
                    share_id=device.share_id,
                )
            )
    return out


class _Lister(pb_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, fake: FakePodResources) -> None:
        self._fake = fake

    async def List(self, request: Any, context: Any) -> Any:  # noqa: N802
        await self._fake._count("List")
        return pb.ListPodResourcesResponse(pod_resources=self._fake.listed())

    async def Get(self, request: Any, context: Any) -> Any:  # noqa: N802
        await self._fake._count("Get")
        pod = self._fake.pod_resources(request.pod_namespace, request.pod_name)
        if pod is None:
            # The kubelet returns a plain error here, which gRPC sends as UNKNOWN.
            await context.abort(
                grpc.StatusCode.UNKNOWN,
                f"pod {request.pod_name} in namespace {request.pod_namespace} not found",
            )
        return pb.GetPodResourcesResponse(pod_resources=pod)


def _unlink(path: os.PathLike[str]) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
