"""Interop: what real kubeletplugin helpers advertise and accept on the registration socket,
and that their DRA node service answers NodePrepareResources, read with our generated code.

These pin the wire facts our discovery code relies on (reference doc section 3.1): the
exact GetInfo of the 1.37 helper (health v1 and v1alpha1) and of the 1.35 helper
(health v1alpha1 only), and NotifyRegistrationStatus semantics.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from kubelet_dra._proto.dra.v1 import api_pb2 as dra_v1
from kubelet_dra._proto.dra.v1 import api_pb2_grpc as dra_v1_grpc
from kubelet_dra._proto.dra.v1beta1 import api_pb2 as dra_v1beta1
from kubelet_dra._proto.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from kubelet_dra._proto.pluginregistration.v1 import api_pb2 as reg
from kubelet_dra._proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc

from ._driver import DriverProcess, device
from ._grpc import HealthStream, StreamEnded, unix_channel

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]

DriverFactory = Callable[..., DriverProcess]

#: Exactly what each helper build puts in PluginInfo.supported_versions, in order.
EXPECTED_SUPPORTED_VERSIONS = {
    "current": [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    ],
    "v035": ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"],
}


def get_info(socket: Path) -> reg.PluginInfo:
    with unix_channel(socket) as channel:
        info: reg.PluginInfo = reg_grpc.RegistrationStub(channel).GetInfo(
            reg.InfoRequest(), timeout=5
        )
        return info


@pytest.mark.parametrize("version", ["current", "v035"])
def test_get_info_exact(interop_driver: DriverFactory, version: str) -> None:
    drv = interop_driver(version, driver_name="gpu.interop.example.com")
    info = get_info(drv.registration_socket)
    assert info.type == "DRAPlugin"
    assert info.name == "gpu.interop.example.com"
    assert info.endpoint == str(drv.dra_socket)
    assert Path(info.endpoint).is_absolute()
    assert list(info.supported_versions) == EXPECTED_SUPPORTED_VERSIONS[version]
    assert drv.registration_socket.name == "gpu.interop.example.com-reg.sock"
    # The driver saw the call through its interceptor (events are what later tests use).
    assert drv.wait_for("call", lambda e: e["method"].endswith("/GetInfo"))


def test_get_info_health_service_off(interop_driver: DriverFactory) -> None:
    """HealthService(false) in the 1.37 helper: not advertised and not served."""
    drv = interop_driver("current", extra_args=["--disable-health"])
    info = get_info(drv.registration_socket)
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    for api in ("v1", "v1alpha1"):
        stream = HealthStream(drv.dra_socket, api)
        try:
            end = stream.wait_end()
        finally:
            stream.close()
        assert end.code == grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.parametrize("version", ["current", "v035"])
def test_notify_registration_status(interop_driver: DriverFactory, version: str) -> None:
    drv = interop_driver(version)
    with unix_channel(drv.registration_socket) as channel:
        stub = reg_grpc.RegistrationStub(channel)
        stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True), timeout=5)
        with pytest.raises(grpc.RpcError) as failed:
            stub.NotifyRegistrationStatus(
                reg.RegistrationStatus(plugin_registered=False, error="kubelet said no"),
                timeout=5,
            )
    # The helper turns a rejected registration into a plain error (gRPC UNKNOWN).
    assert failed.value.code() == grpc.StatusCode.UNKNOWN
    assert "kubelet said no" in (failed.value.details() or "")

    # The driver reports each call on stdout, read by another thread: wait for both.
    def notified(e: dict[str, object]) -> bool:
        return str(e.get("method", "")).endswith("/NotifyRegistrationStatus")

    assert len(drv.wait_for("call", notified, count=2)) == 2


@pytest.mark.parametrize("version", ["current", "v035"])
@pytest.mark.parametrize("node_api", ["v1", "v1beta1"])
def test_prepare_unprepare_without_apiserver(
    interop_driver: DriverFactory, version: str, node_api: str
) -> None:
    """NodePrepareResources works without an API server (claims come from the fake client)
    and returns the scripted devices; these are what our claim cache would store."""
    drv = interop_driver(
        version,
        script={
            "devices": [device("gpu-0"), device("gpu-1", pool="pool-1")],
            "prepare_devices": [
                {
                    "requests": ["gpu"],
                    "pool": "pool-0",
                    "device": "gpu-0",
                    "cdi_device_ids": ["interop.example.com/gpu=gpu-0"],
                }
            ],
        },
    )
    pb, stubs = (dra_v1, dra_v1_grpc) if node_api == "v1" else (dra_v1beta1, dra_v1beta1_grpc)
    claim = pb.Claim(namespace="ns", uid="uid-1", name="claim-1")
    with unix_channel(drv.dra_socket) as channel:
        stub = stubs.DRAPluginStub(channel)
        prepared = stub.NodePrepareResources(
            pb.NodePrepareResourcesRequest(claims=[claim]), timeout=10
        )
        unprepared = stub.NodeUnprepareResources(
            pb.NodeUnprepareResourcesRequest(claims=[claim]), timeout=10
        )
    result = prepared.claims["uid-1"]
    assert result.error == ""
    assert [
        (d.pool_name, d.device_name, list(d.cdi_device_ids), list(d.request_names))
        for d in result.devices
    ] == [("pool-0", "gpu-0", ["interop.example.com/gpu=gpu-0"], ["gpu"])]
    assert unprepared.claims["uid-1"].error == ""


def test_prepare_error_is_per_claim(interop_driver: DriverFactory) -> None:
    drv = interop_driver("current", script={"devices": [], "prepare_error": "no such GPU"})
    with unix_channel(drv.dra_socket) as channel:
        prepared = dra_v1_grpc.DRAPluginStub(channel).NodePrepareResources(
            dra_v1.NodePrepareResourcesRequest(
                claims=[dra_v1.Claim(namespace="ns", uid="uid-2", name="c")]
            ),
            timeout=10,
        )
    assert "no such GPU" in prepared.claims["uid-2"].error


def test_old_helper_does_not_serve_health_v1(interop_driver: DriverFactory) -> None:
    drv = interop_driver("v035", script={"devices": [device("gpu-0")]})
    stream = HealthStream(drv.dra_socket, "v1")
    try:
        with pytest.raises(StreamEnded) as ended:
            stream.next(timeout=5)
    finally:
        stream.close()
    assert ended.value.code == grpc.StatusCode.UNIMPLEMENTED
