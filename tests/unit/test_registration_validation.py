"""Kubelet v1.38 registration validation: driver names and endpoints.

``validateDriverName`` (``ValidateCSIDriverName``) and ``validateEndpoint`` in
``pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go``. Every verdict below was
also checked against Go (``net/url.Parse``, ``strings.ToLower`` and
apimachinery's ``IsDNS1123Subdomain``); see docs/library.md.
"""

from __future__ import annotations

import pytest

from kubelet_dra import errors, registration
from kubelet_dra._proto.pluginregistration.v1 import api_pb2 as reg_pb2

OK = None


@pytest.mark.parametrize(
    ("name", "refusal"),
    [
        ("gpu.example.com", OK),
        ("a" * 63, OK),
        ("a" * 64, "longer than 63 bytes"),
        ("é" * 32, "longer than 63 bytes"),  # 64 bytes, 32 characters: bytes count
        ("", "empty"),
        ("GPU.Example.COM", OK),  # checked after lower-casing, so upper case passes
        ("\u0130ntel.com", OK),  # Go lower-cases U+0130 to "i" (Python to "i" + U+0307)
        ("\u212aube.io", OK),  # Kelvin sign: "k" in Go and Python
        ("gpu_example.com", "RFC 1123 subdomain"),
        ("gpü.example.com", "RFC 1123 subdomain"),
        ("-gpu.example.com", "RFC 1123 subdomain"),
        ("gpu.example.com.", "RFC 1123 subdomain"),
        ("gpu..example.com", "RFC 1123 subdomain"),
        ("gpu.example.com\n", "RFC 1123 subdomain"),  # Go's $ is end of text only
        ("gpu/example", "RFC 1123 subdomain"),
    ],
    ids=[
        "plain",
        "63-bytes",
        "too-long",
        "too-long-in-bytes",
        "empty",
        "uppercase-accepted",
        "dotted-capital-i",
        "kelvin-sign",
        "underscore",
        "non-ascii",
        "leading-dash",
        "trailing-dot",
        "empty-label",
        "trailing-newline",
        "slash",
    ],
)
def test_driver_name(name: str, refusal: str | None) -> None:
    if refusal is OK:
        registration.validate_driver_name(name)
        return
    with pytest.raises(errors.RegistrationError, match=refusal) as caught:
        registration.validate_driver_name(name)
    assert caught.value.reason == "driver_name"


@pytest.mark.parametrize(
    ("endpoint", "refusal"),
    [
        ("/var/lib/kubelet/plugins/gpu.example.com/dra.sock", OK),
        ("/" + "x" * 106, OK),  # 107 bytes
        ("/" + "x" * 107, "must not be longer than 108 bytes"),  # 108 bytes
        ("/" + "é" * 54, "must not be longer than 108 bytes"),  # 109 bytes, 55 characters
        ("", "empty DRA plugin endpoint"),
        ("run/dra.sock", "must be an absolute path"),
        ("./dra.sock", "must be an absolute path"),
        ("/plugins/%2e%2e/run/evil.sock", "must be a plain path"),  # would dial ".."
        ("/plugins/%41.sock", "must be a plain path"),  # any valid escape decodes
        ("/plugins/100%.sock", "must be a plain path"),  # a bad escape: Go's error
        ("/x?q", "must be a plain path"),
        ("/x?", "must be a plain path"),  # ForceQuery: the path lacks the "?"
        ("/x#frag", "must be a plain path"),
        ("/x#", "must be a plain path"),  # empty fragment: the path lacks the "#"
        ("//host/x", "must be a plain path"),
        ("///x", "must be a plain path"),  # empty authority: the path is "/x"
        ("//user@/x", "must be a plain path"),
        ("/x\x00y", "must be a plain path"),  # control character
        ("/x\x7f", "must be a plain path"),
        ("/a b/c+d:e@f[g].sock", OK),  # nothing here is decoded
        ("/plugins/gpü/dra.sock", OK),
    ],
    ids=[
        "plain",
        "107-bytes",
        "108-bytes",
        "108-plus-bytes-multibyte",
        "empty",
        "relative",
        "dot-relative",
        "percent-encoded-dotdot",
        "percent-escape",
        "bad-percent",
        "query",
        "empty-query",
        "fragment",
        "empty-fragment",
        "host",
        "empty-authority",
        "userinfo",
        "nul",
        "del",
        "odd-but-plain",
        "non-ascii",
    ],
)
def test_endpoint(endpoint: str, refusal: str | None) -> None:
    if refusal is OK:
        registration.validate_endpoint(endpoint)
        return
    with pytest.raises(errors.RegistrationError, match=refusal) as caught:
        registration.validate_endpoint(endpoint)
    assert caught.value.reason == "endpoint"


@pytest.mark.parametrize(
    ("name", "endpoint", "versions", "reason"),
    [
        ("Bad_Name", "relative", [], "driver_name"),  # the name is checked first
        ("gpu.example.com", "relative", [], "endpoint"),  # then the endpoint
        ("gpu.example.com", "/a.sock", [], "supported_versions"),  # then the services
        ("gpu.example.com", "/a.sock", ["v1.DRAPlugin"], None),
    ],
    ids=["name-first", "endpoint-second", "services-last", "valid"],
)
def test_get_info_is_validated_in_the_kubelets_order(
    name: str, endpoint: str, versions: list[str], reason: str | None
) -> None:
    answer = reg_pb2.PluginInfo(
        type="DRAPlugin", name=name, endpoint=endpoint, supported_versions=versions
    )
    if reason is None:
        assert registration.plugin_info_from_proto(answer, "/reg/x.sock").endpoint == endpoint
        return
    with pytest.raises(errors.RegistrationError) as caught:
        registration.plugin_info_from_proto(answer, "/reg/x.sock")
    assert caught.value.reason == reason


def test_an_empty_endpoint_is_the_socket_and_the_socket_is_validated() -> None:
    answer = reg_pb2.PluginInfo(type="DRAPlugin", name="g.io", supported_versions=["v1.DRAPlugin"])
    with pytest.raises(errors.RegistrationError, match="longer than 108 bytes"):
        registration.plugin_info_from_proto(answer, "/" + "r" * 120)


def test_static_plugins_are_validated_too() -> None:
    with pytest.raises(errors.RegistrationError, match="must be an absolute path"):
        registration.make_plugin_info("gpu.example.com", "dra.sock", ["v1.DRAPlugin"])
