"""Version negotiation and GetInfo validation (upstream TestPickHealthService and friends)."""

from __future__ import annotations

import re

import pytest

from kubelet_dra import errors
from kubelet_dra._proto.pluginregistration.v1 import api_pb2 as reg_pb2
from kubelet_dra.plugin import getinfo

DRA = "v1.DRAPlugin"


@pytest.mark.parametrize(
    ("versions", "expected"),
    [
        (["v1beta1.DRAPlugin"], None),
        (None, None),
        (["v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"], "v1alpha1.DRAResourceHealth"),
        (["v1beta1.DRAPlugin", "v1.DRAResourceHealth"], "v1.DRAResourceHealth"),
        (
            ["v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth", "v1.DRAResourceHealth"],
            "v1.DRAResourceHealth",
        ),
        (["v1.DRAPlugin", "v1beta1.DRAResourceHealth"], None),  # never released
    ],
    ids=["no-health", "nil", "v1alpha1-only", "v1-only", "both-prefers-v1", "v1beta1-health"],
)
def test_pick_health_service(versions: list[str] | None, expected: str | None) -> None:
    assert getinfo.pick_health_service(versions) == expected


@pytest.mark.parametrize(
    ("versions", "expected"),
    [
        (["v1.DRAPlugin", "v1beta1.DRAPlugin"], "v1.DRAPlugin"),
        (["v1beta1.DRAPlugin", "v1.DRAPlugin"], "v1beta1.DRAPlugin"),  # the plugin's order
        (["v1alpha1.DRAResourceHealth", "v1beta1.DRAPlugin"], "v1beta1.DRAPlugin"),
    ],
    ids=["v1-first", "plugin-order-decides", "health-ignored"],
)
def test_dra_service_is_the_plugins_first_supported(versions: list[str], expected: str) -> None:
    assert getinfo.validate_supported_services(versions) == expected


@pytest.mark.parametrize(
    ("versions", "message"),
    [
        ([], "empty list of supported gRPC services (aka supported versions)"),
        (["v1alpha4.Node", "v1.DRAResourceHealth"], "none of the supported gRPC services"),
    ],
    ids=["empty", "no-dra-service"],
)
def test_invalid_version_lists_are_refused(versions: list[str], message: str) -> None:
    with pytest.raises(errors.RegistrationError, match=re.escape(message)):
        getinfo.validate_supported_services(versions)


def test_get_info_answer_with_empty_endpoint_uses_the_registration_socket() -> None:
    answer = reg_pb2.PluginInfo(
        type="DRAPlugin", name="gpu.example.com", supported_versions=["v1.DRAPlugin"]
    )
    info = getinfo.plugin_info_from_proto(answer, "/reg/gpu-reg.sock")
    assert info == getinfo.PluginInfo(
        driver="gpu.example.com",
        endpoint="/reg/gpu-reg.sock",
        socket="/reg/gpu-reg.sock",
        supported_versions=("v1.DRAPlugin",),
        dra_service="v1.DRAPlugin",
        health_service=None,
    )


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (
            reg_pb2.PluginInfo(type="CSIPlugin", name="x", supported_versions=["v1.DRAPlugin"]),
            "type",
        ),
        (
            reg_pb2.PluginInfo(type="DRAPlugin", name="", supported_versions=["v1.DRAPlugin"]),
            "name",
        ),
    ],
    ids=["other-type", "empty-name"],
)
def test_get_info_answers_that_are_refused(answer: reg_pb2.PluginInfo, message: str) -> None:
    with pytest.raises(errors.RegistrationError, match=message):
        getinfo.plugin_info_from_proto(answer, "/reg/x.sock")
