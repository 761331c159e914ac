"""Fuzz target: driver-name and endpoint validation of plugin registration.

Mirrors the kubelet's ``validateDriverName`` and ``validateEndpoint``
(``pkg/kubelet/cm/dra/plugin/registration.go``, v1.38) as
``kubelet_dra.plugin.registration`` implements them, checked against a second,
independent statement of the same rules:

- a driver name is accepted iff it is 1 to 63 bytes and, lower-cased as Go
  lower-cases it, dot-separated labels of ``[a-z0-9-]`` that start and end
  with a letter or digit (at most 253 characters);
- an endpoint is accepted iff it is absolute, under 108 bytes, does not start
  with ``//`` and holds no control character, ``?``, ``#`` or ``%`` (Go's
  ``url.Parse`` of ``unix:<endpoint>`` must give back the same path);
- a refusal is ``RegistrationError`` with a known ``reason``, nothing else;
  a ``GetInfo`` answer (``PluginInfo`` protobuf) that validates keeps its
  name and endpoint (an empty endpoint becomes the socket).

Input: ``driver \\0 endpoint`` (undecodable bytes kept as surrogates, as
``os.listdir`` gives file names); a leading ``\\xff`` makes the rest a
serialized ``PluginInfo`` instead.
"""

from __future__ import annotations

import re

from tests.fuzz import _harness

with _harness.instrumented(__name__ == "__main__"):
    from google.protobuf import message

    from kubelet_dra import errors
    from kubelet_dra._proto.pluginregistration.v1 import api_pb2 as reg_pb2
    from kubelet_dra.plugin import getinfo, validation

_REASONS = {"driver_name", "endpoint", "plugin_type", "supported_versions"}
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?")
_SOCKET = "/var/lib/kubelet/plugins_registry/fuzz.sock"


def _lower(name: str) -> str:
    # Go's strings.ToLower, as far as it can yield ASCII: two non-ASCII
    # letters lower-case to ASCII ones (Kelvin sign, dotted capital I).
    special = {"\u212a": "k", "\u0130": "i"}
    return "".join(special.get(c, c.lower() if c < "\x80" else c) for c in name)


def _driver_ok(name: str) -> bool:
    size = len(name.encode("utf-8", "surrogatepass"))
    lowered = _lower(name)
    return (
        0 < size <= validation.DRIVER_NAME_MAX_BYTES
        and len(lowered) <= 253
        and all(_LABEL.fullmatch(label) for label in lowered.split("."))
    )


def _endpoint_ok(endpoint: str) -> bool:
    raw = endpoint.encode("utf-8", "surrogatepass")
    return (
        raw.startswith(b"/")
        and not raw.startswith(b"//")
        and len(raw) < validation.UNIX_PATH_MAX
        and not any(b < 0x20 or b == 0x7F or b in b"?#%" for b in raw)
    )


def _verdict(check: object, value: str) -> bool:
    try:
        check(value)  # type: ignore[operator]
    except errors.RegistrationError as exc:
        assert exc.reason in _REASONS, exc.reason
        assert str(exc), "a refusal says why"
        return False
    return True


def _names(data: bytes) -> None:
    head, _, tail = data.partition(b"\0")
    driver = head.decode("utf-8", "surrogateescape")
    endpoint = tail.decode("utf-8", "surrogateescape")
    accepted = _verdict(validation.validate_driver_name, driver)
    assert accepted == _driver_ok(driver), (driver, accepted)
    accepted = _verdict(validation.validate_endpoint, endpoint)
    assert accepted == _endpoint_ok(endpoint), (endpoint, accepted)


def _get_info(data: bytes) -> None:
    try:
        info = reg_pb2.PluginInfo.FromString(data)
    except message.DecodeError:
        return
    try:
        plugin = getinfo.plugin_info_from_proto(info, _SOCKET)
    except errors.RegistrationError as exc:
        assert exc.reason in _REASONS, exc.reason
        return
    assert plugin.driver == info.name and _driver_ok(info.name), info
    assert plugin.endpoint == (info.endpoint or _SOCKET), info
    assert plugin.dra_service in getinfo.DRA_SERVICES, info
    assert plugin.health_service in (None, *getinfo.HEALTH_SERVICES), info


def test_one(data: bytes) -> None:
    if data.startswith(b"\xff"):
        _get_info(data[1:])
    else:
        _names(data)


if __name__ == "__main__":
    _harness.main(test_one, __file__)
