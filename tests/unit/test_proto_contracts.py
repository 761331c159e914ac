"""The wire contracts: full method paths and field numbers, byte for byte.

Real drivers and kubelets only talk to us if package, service, method and
field names and numbers match upstream exactly (reference sections 1-3).
"""

from __future__ import annotations

import filecmp
import pathlib
import subprocess
import sys
from types import ModuleType

import pytest
from google.protobuf import descriptor

from kubelet_dra._proto.dra.v1 import api_pb2 as dra_v1
from kubelet_dra._proto.dra.v1beta1 import api_pb2 as dra_v1beta1
from kubelet_dra._proto.dra_health.v1 import api_pb2 as health_v1
from kubelet_dra._proto.dra_health.v1alpha1 import api_pb2 as health_v1alpha1
from kubelet_dra._proto.pluginregistration.v1 import api_pb2 as reg
from kubelet_dra._proto.podresources.v1 import api_pb2 as podres

ROOT = pathlib.Path(__file__).resolve().parents[2]


def method_paths(module: ModuleType) -> set[str]:
    file_desc: descriptor.FileDescriptor = module.DESCRIPTOR
    return {
        f"/{service.full_name}/{method.name}"
        for service in file_desc.services_by_name.values()
        for method in service.methods
    }


@pytest.mark.parametrize(
    ("module", "paths"),
    [
        (
            reg,
            {
                "/pluginregistration.Registration/GetInfo",
                "/pluginregistration.Registration/NotifyRegistrationStatus",
            },
        ),
        (
            dra_v1,
            {
                "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
                "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
            },
        ),
        (
            dra_v1beta1,
            {
                "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
                "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
            },
        ),
        (health_v1, {"/v1.DRAResourceHealth/NodeWatchResources"}),
        (health_v1alpha1, {"/v1alpha1.DRAResourceHealth/NodeWatchResources"}),
        (
            podres,
            {
                "/v1.PodResourcesLister/List",
                "/v1.PodResourcesLister/GetAllocatableResources",
                "/v1.PodResourcesLister/Get",
            },
        ),
    ],
    ids=["pluginregistration", "dra-v1", "dra-v1beta1", "health-v1", "health-v1alpha1", "podres"],
)
def test_full_method_paths_match_upstream(module: ModuleType, paths: set[str]) -> None:
    assert method_paths(module) == paths


@pytest.mark.parametrize("module", [health_v1, health_v1alpha1], ids=["v1", "v1alpha1"])
def test_health_stream_is_server_streaming(module: ModuleType) -> None:
    service = module.DESCRIPTOR.services_by_name["DRAResourceHealth"]
    method = service.methods_by_name["NodeWatchResources"]
    assert method.server_streaming and not method.client_streaming


def fields(message: descriptor.Descriptor) -> dict[str, tuple[int, int, str]]:
    return {
        f.name: (
            f.number,
            f.type,
            f.message_type.name if f.message_type else (f.enum_type.name if f.enum_type else ""),
        )
        for f in message.fields
    }


D = descriptor.FieldDescriptor
HEALTH_FIELDS = {
    "DeviceHealth": {
        "device": (1, D.TYPE_MESSAGE, "DeviceIdentifier"),
        "health": (2, D.TYPE_ENUM, "HealthStatus"),
        "last_updated_time": (3, D.TYPE_INT64, ""),
        "health_check_timeout_seconds": (4, D.TYPE_INT64, ""),
        "message": (5, D.TYPE_STRING, ""),
    },
    "DeviceIdentifier": {
        "pool_name": (1, D.TYPE_STRING, ""),
        "device_name": (2, D.TYPE_STRING, ""),
    },
    "NodeWatchResourcesResponse": {"devices": (1, D.TYPE_MESSAGE, "DeviceHealth")},
    "NodeWatchResourcesRequest": {},
}


@pytest.mark.parametrize("module", [health_v1, health_v1alpha1], ids=["v1", "v1alpha1"])
@pytest.mark.parametrize("message", sorted(HEALTH_FIELDS))
def test_health_field_numbers(module: ModuleType, message: str) -> None:
    desc = module.DESCRIPTOR.message_types_by_name[message]
    assert fields(desc) == HEALTH_FIELDS[message]


@pytest.mark.parametrize("module", [health_v1, health_v1alpha1], ids=["v1", "v1alpha1"])
def test_health_enum_numbers(module: ModuleType) -> None:
    enum = module.DESCRIPTOR.enum_types_by_name["HealthStatus"]
    assert {v.name: v.number for v in enum.values} == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}


REGISTRATION_FIELDS = {
    "PluginInfo": {
        "type": (1, D.TYPE_STRING, ""),
        "name": (2, D.TYPE_STRING, ""),
        "endpoint": (3, D.TYPE_STRING, ""),
        "supported_versions": (4, D.TYPE_STRING, ""),
    },
    "RegistrationStatus": {
        "plugin_registered": (1, D.TYPE_BOOL, ""),
        "error": (2, D.TYPE_STRING, ""),
    },
    "RegistrationStatusResponse": {},
    "InfoRequest": {},
}


@pytest.mark.parametrize("message", sorted(REGISTRATION_FIELDS))
def test_registration_field_numbers(message: str) -> None:
    assert fields(reg.DESCRIPTOR.message_types_by_name[message]) == REGISTRATION_FIELDS[message]
    assert reg.DESCRIPTOR.package == "pluginregistration"


def test_supported_versions_is_repeated() -> None:
    field = reg.DESCRIPTOR.message_types_by_name["PluginInfo"].fields_by_name["supported_versions"]
    assert field.is_repeated


DRA_FIELDS = {
    "Device": {
        "request_names": (1, D.TYPE_STRING, ""),
        "pool_name": (2, D.TYPE_STRING, ""),
        "device_name": (3, D.TYPE_STRING, ""),
        "cdi_device_ids": (4, D.TYPE_STRING, ""),
    },
    "Claim": {
        "namespace": (1, D.TYPE_STRING, ""),
        "uid": (2, D.TYPE_STRING, ""),
        "name": (3, D.TYPE_STRING, ""),
    },
    "NodePrepareResourcesRequest": {"claims": (1, D.TYPE_MESSAGE, "Claim")},
    "NodePrepareResourcesResponse": {"claims": (1, D.TYPE_MESSAGE, "ClaimsEntry")},
    "NodePrepareResourceResponse": {
        "devices": (1, D.TYPE_MESSAGE, "Device"),
        "error": (2, D.TYPE_STRING, ""),
    },
    "NodeUnprepareResourcesRequest": {"claims": (1, D.TYPE_MESSAGE, "Claim")},
    "NodeUnprepareResourcesResponse": {"claims": (1, D.TYPE_MESSAGE, "ClaimsEntry")},
    "NodeUnprepareResourceResponse": {"error": (1, D.TYPE_STRING, "")},
}


@pytest.mark.parametrize(
    ("module", "package"),
    [
        (dra_v1, "k8s.io.kubelet.pkg.apis.dra.v1"),
        (dra_v1beta1, "k8s.io.kubelet.pkg.apis.dra.v1beta1"),
    ],
    ids=["v1", "v1beta1"],
)
@pytest.mark.parametrize("message", sorted(DRA_FIELDS))
def test_dra_field_numbers(module: ModuleType, package: str, message: str) -> None:
    file_desc = module.DESCRIPTOR
    assert file_desc.package == package
    got = fields(file_desc.message_types_by_name[message])
    if message == "Device" and module is dra_v1:
        assert got.pop("share_id") == (5, D.TYPE_STRING, "")
        share = file_desc.message_types_by_name["Device"].fields_by_name["share_id"]
        assert share.has_presence  # proto3 `optional`
    assert got == DRA_FIELDS[message]


PODRES_FIELDS = {
    "ListPodResourcesResponse": {"pod_resources": (1, D.TYPE_MESSAGE, "PodResources")},
    "PodResources": {
        "name": (1, D.TYPE_STRING, ""),
        "namespace": (2, D.TYPE_STRING, ""),
        "containers": (3, D.TYPE_MESSAGE, "ContainerResources"),
        "cpu_ids": (4, D.TYPE_INT64, ""),
        "memory": (5, D.TYPE_MESSAGE, "ContainerMemory"),
    },
    "ContainerResources": {
        "name": (1, D.TYPE_STRING, ""),
        "devices": (2, D.TYPE_MESSAGE, "ContainerDevices"),
        "cpu_ids": (3, D.TYPE_INT64, ""),
        "memory": (4, D.TYPE_MESSAGE, "ContainerMemory"),
        "dynamic_resources": (5, D.TYPE_MESSAGE, "DynamicResource"),
    },
    "DynamicResource": {
        "claim_name": (2, D.TYPE_STRING, ""),
        "claim_namespace": (3, D.TYPE_STRING, ""),
        "claim_resources": (4, D.TYPE_MESSAGE, "ClaimResource"),
    },
    "ClaimResource": {
        "cdi_devices": (1, D.TYPE_MESSAGE, "CDIDevice"),
        "driver_name": (2, D.TYPE_STRING, ""),
        "pool_name": (3, D.TYPE_STRING, ""),
        "device_name": (4, D.TYPE_STRING, ""),
        "share_id": (5, D.TYPE_STRING, ""),
    },
    "CDIDevice": {"name": (1, D.TYPE_STRING, "")},
    "GetPodResourcesRequest": {
        "pod_name": (1, D.TYPE_STRING, ""),
        "pod_namespace": (2, D.TYPE_STRING, ""),
    },
    "GetPodResourcesResponse": {"pod_resources": (1, D.TYPE_MESSAGE, "PodResources")},
}


@pytest.mark.parametrize("message", sorted(PODRES_FIELDS))
def test_podresources_field_numbers(message: str) -> None:
    """The fields the sidecar reads, as k8s.io/kubelet v0.37.2 numbers them."""
    assert podres.DESCRIPTOR.package == "v1"
    assert fields(podres.DESCRIPTOR.message_types_by_name[message]) == PODRES_FIELDS[message]
    share = podres.DESCRIPTOR.message_types_by_name["ClaimResource"].fields_by_name["share_id"]
    assert share.has_presence  # proto3 `optional`


def test_descriptor_file_names_do_not_collide() -> None:
    modules = (reg, dra_v1, dra_v1beta1, health_v1, health_v1alpha1, podres)
    names = [m.DESCRIPTOR.name for m in modules]
    assert len(set(names)) == len(names)


def test_committed_generated_code_is_current(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("grpc_tools")
    subprocess.run(
        [sys.executable, str(ROOT / "proto" / "generate.py"), "--out", str(tmp_path)],
        check=True,
    )
    fresh = tmp_path / "kubelet_dra" / "_proto"
    committed = ROOT / "kubelet_dra" / "_proto"
    generated = sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file())
    assert generated, "generator produced nothing"
    stale = [
        str(rel)
        for rel in generated
        if not (committed / rel).exists() or not filecmp.cmp(fresh / rel, committed / rel, False)
    ]
    assert stale == [], "run `tox -e protos` and commit the result"
