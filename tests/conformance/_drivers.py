"""The driver both sides talk to: a FakeDriver that answers prepare per claim.

One :class:`ScenarioDriver` per driver endpoint. The twin (the kubelet's
manager) and our library dial the *same* socket: they receive the same health
reports on their streams and the same ``NodePrepareResources`` answers, so
the inputs of both sides are identical by construction.

The stock FakeDriver returns one device list for every claim; a scenario gives
each claim its own devices (request names, CDI IDs, share IDs), so the DRA
service is replaced here by one that answers by claim UID. The health service
is the FakeDriver's own. A scenario driver with ``implementation: go-helper`` is
served by the interop tests' Go driver instead (``_godriver``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import grpc

from kubelet_dra._proto.dra.v1 import api_pb2 as dra_v1_pb2
from kubelet_dra._proto.dra.v1 import api_pb2_grpc as dra_v1_grpc
from kubelet_dra._proto.dra.v1beta1 import api_pb2 as dra_v1beta1_pb2
from kubelet_dra._proto.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from kubelet_dra.testing import fakedriver

_DRA = {
    "v1": (dra_v1_pb2, dra_v1_grpc.add_DRAPluginServicer_to_server),
    "v1beta1": (dra_v1beta1_pb2, dra_v1beta1_grpc.add_DRAPluginServicer_to_server),
}


class ScenarioDriver(fakedriver.FakeDriver):
    """A FakeDriver whose NodePrepareResources answers per claim UID."""

    def __init__(
        self,
        name: str,
        *,
        registry: str | os.PathLike[str],
        plugin_dir: str | os.PathLike[str],
        answers: Mapping[str, Sequence[Mapping[str, Any]]],
        health_versions: Iterable[str],
        dra_versions: Iterable[str],
        unimplemented: bool,
        supported_versions: Sequence[str] | None,
        prepare_errors: int = 0,
    ) -> None:
        super().__init__(
            name,
            registry=registry,
            plugin_dir=plugin_dir,
            health_versions=health_versions,
            dra_versions=dra_versions,
            unimplemented=unimplemented,
            supported_versions=supported_versions,
        )
        self.answers = {k: list(v) for k, v in answers.items()}
        self.prepared: list[str] = []
        self.prepare_errors = prepare_errors
        """NodePrepareResources calls still to fail (a prepare that another driver of the
        kubelet's batch outlives)."""

    def _add_dra_services(self, server: grpc.aio.Server) -> None:
        for version in self.dra_versions:
            pb, add = _DRA[version]
            add(_PerClaim(self, version, pb), server)
        for version in self.health_versions:
            fakedriver._HEALTH_ADD[version](fakedriver._Health(self, version), server)


class _PerClaim:
    def __init__(self, driver: ScenarioDriver, version: str, pb: Any) -> None:
        self._driver, self._version, self._pb = driver, version, pb

    def _device(self, d: Mapping[str, Any]) -> Any:
        kwargs: dict[str, Any] = {
            "request_names": d.get("requests", []),
            "pool_name": d["pool"],
            "device_name": d["device"],
            "cdi_device_ids": d.get("cdi_device_ids", []),
        }
        if d.get("share_id") is not None and self._version == "v1":
            kwargs["share_id"] = d["share_id"]
        return self._pb.Device(**kwargs)

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        await self._driver._count(f"NodePrepareResources/{self._version}")
        pb = self._pb
        out = {}
        failing = self._driver.prepare_errors > 0
        self._driver.prepare_errors -= failing
        for claim in request.claims:
            if failing:
                out[claim.uid] = pb.NodePrepareResourceResponse(
                    error=f"claim {claim.namespace}/{claim.name}: the device is busy (scripted)"
                )
                continue
            self._driver.prepared.append(claim.uid)
            devices = self._driver.answers.get(claim.uid)
            if devices is None:
                out[claim.uid] = pb.NodePrepareResourceResponse(
                    error=f"claim {claim.namespace}/{claim.name} is not allocated to this driver"
                )
            else:
                out[claim.uid] = pb.NodePrepareResourceResponse(
                    devices=[self._device(d) for d in devices]
                )
        return pb.NodePrepareResourcesResponse(claims=out)

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        await self._driver._count(f"NodeUnprepareResources/{self._version}")
        pb = self._pb
        return pb.NodeUnprepareResourcesResponse(
            claims={c.uid: pb.NodeUnprepareResourceResponse() for c in request.claims}
        )


async def prepare(
    endpoint: str, version: str, claims: Sequence[tuple[str, str, str]]
) -> dict[str, tuple[list[Any], str]]:
    """Call NodePrepareResources as the kubelet does: claim UID -> (devices, error)."""
    pb, _ = _DRA[version]
    stub_cls = dra_v1_grpc.DRAPluginStub if version == "v1" else dra_v1beta1_grpc.DRAPluginStub
    async with grpc.aio.insecure_channel(f"unix:{endpoint}") as channel:
        request = pb.NodePrepareResourcesRequest(
            claims=[pb.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims]
        )
        response = await stub_cls(channel).NodePrepareResources(request, timeout=10)
    return {uid: (list(r.devices), r.error) for uid, r in response.claims.items()}
