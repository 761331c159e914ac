"""Kubelet v1.38 registration validation: driver names and endpoints.

``validateDriverName`` (``ValidateCSIDriverName``) and ``validateEndpoint`` in
``pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go``. Every verdict below was
also checked against Go (``net/url.Parse``, ``strings.ToLower`` and
apimachinery's ``IsDNS1123Subdomain``); see docs/library.md.
"""

from __future__ import annotations

import pytest

from kubelet_dra import errors
from kubelet_dra._proto.pluginregistration.v1 import api_pb2 as reg_pb2
from kubelet_dra.plugin import getinfo, validation

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
        validation.validate_driver_name(name)
        return
    with pytest.raises(errors.RegistrationError, match=refusal) as caught:
        validation.validate_driver_name(name)
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
        validation.validate_endpoint(endpoint)
        return
    with pytest.raises(errors.RegistrationError, match=refusal) as caught:
        validation.validate_endpoint(endpoint)
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
        assert getinfo.plugin_info_from_proto(answer, "/reg/x.sock").endpoint == endpoint
        return
    with pytest.raises(errors.RegistrationError) as caught:
        getinfo.plugin_info_from_proto(answer, "/reg/x.sock")
    assert caught.value.reason == reason


def test_an_empty_endpoint_is_the_socket_and_the_socket_is_validated() -> None:
    answer = reg_pb2.PluginInfo(type="DRAPlugin", name="g.io", supported_versions=["v1.DRAPlugin"])
    with pytest.raises(errors.RegistrationError, match="longer than 108 bytes"):
        getinfo.plugin_info_from_proto(answer, "/" + "r" * 120)


def test_static_plugins_are_validated_too() -> None:
    with pytest.raises(errors.RegistrationError, match="must be an absolute path"):
        getinfo.make_plugin_info("gpu.example.com", "dra.sock", ["v1.DRAPlugin"])


# The port of Go's net/url.Parse (validation._go_url_parse) on its own, beyond the
# "unix:" + absolute path that validate_endpoint hands it: the scheme rules of Go's
# getScheme, relative and opaque URLs, authority, query and fragment splitting, and
# the %-decoding of unescape. Each row is what Go's url.Parse gives for the input
# (read from net/url/url.go, Go 1.26: parse, getScheme, unescape, setFragment), in
# the fields the port keeps; None where Go returns an error.
def url(
    path: bytes = b"",
    *,
    host: bytes = b"",
    query: bytes = b"",
    fragment: bytes = b"",
    opaque: bytes = b"",
) -> tuple[bytes, bytes, bytes, bytes, bytes]:
    return host, query, fragment, path, opaque


GO_URL_PARSE = [
    # what validate_endpoint passes
    (b"unix:/run/dra.sock", url(b"/run/dra.sock")),
    (b"unix:/a%2fb", url(b"/a/b")),  # decoded, also an escaped "/"
    (b"unix:///x", url(b"/x")),  # an empty authority
    (b"unix://u@h/p", url(b"/p", host=b"h")),  # userinfo is not the host
    (b"unix://a@b@h/p", url(b"/p", host=b"h")),  # the last "@" ends the userinfo
    (b"unix://h", url(b"", host=b"h")),
    (b"unix:/p?q#f", url(b"/p", query=b"q", fragment=b"f")),
    (b"unix:/p?", url(b"/p")),  # ForceQuery: RawQuery stays empty
    (b"unix:/p?a?", url(b"/p", query=b"a?")),  # two "?": cut at the first
    (b"unix:/p??", url(b"/p", query=b"?")),
    (b"unix:/p#a%20b", url(b"/p", fragment=b"a b")),  # the fragment is decoded too
    (b"unix:/p#", url(b"/p")),
    (b"unix:/p#%zz", None),  # a bad escape in the fragment
    (b"unix:/p#a#b", url(b"/p", fragment=b"a#b")),  # cut at the first "#"
    # a scheme, then no "/": rootless, so opaque (not decoded)
    (b"unix:x/y", url(opaque=b"x/y")),
    (b"unix:x%zz", url(opaque=b"x%zz")),
    (b"mailto:a@b?x=1", url(opaque=b"a@b", query=b"x=1")),
    (b"unix:?q", url(query=b"q")),
    (b"unix:", url()),
    # getScheme: a letter, then letters, digits, "+", "-", "."; ":" ends it
    (b"a+b.c-d9:x", url(opaque=b"x")),
    (b"A1:x", url(opaque=b"x")),
    (b"Z:x", url(opaque=b"x")),
    (b":foo", None),  # "missing protocol scheme"
    (b"1a:b", None),  # no scheme, and a colon in the first segment
    (b"+x:y", None),
    (b"-x:y", None),
    (b".x:y", None),
    (b"a_b:c", None),  # "_" ends any scheme
    (b"\xc3\xa9:x", None),  # only ASCII letters: no scheme
    (b"\xaa:x", None),  # a byte that is a letter as Latin-1 is no scheme letter either
    # no scheme: a relative reference
    (b"x", url(b"x")),
    (b"ab", url(b"ab")),
    (b"a1", url(b"a1")),
    (b"a%41", url(b"aA")),
    (b"a/b:c", url(b"a/b:c")),  # a colon after the first segment is fine
    (b"/x:y", url(b"/x:y")),  # so is one in a rooted path
    (b"?q", url(query=b"q")),
    (b"", url()),
    (b"//host/path", url(b"/path", host=b"host")),  # an authority without a scheme
    (b"//h", url(host=b"h")),
    (b"///x", url(b"///x")),  # but "///" starts a path
    # control characters anywhere: an error; space, DEL's neighbours and high bytes are not
    (b"unix:/a\x00b", None),
    (b"unix:/a\x1fb", None),
    (b"unix:/a\x7fb", None),
    (b"unix:/a\x7fb#", None),
    # Go cuts the fragment off first and looks for control characters only before it
    (b"unix:/a#\x01", url(b"/a", fragment=b"\x01")),
    (b"unix:/a b", url(b"/a b")),
    (b"unix:/a~b", url(b"/a~b")),
    (b"unix:/a\x80b", url(b"/a\x80b")),
]


@pytest.mark.parametrize(("raw", "expected"), GO_URL_PARSE, ids=[repr(r) for r, _ in GO_URL_PARSE])
def test_go_url_parse(raw: bytes, expected: tuple[bytes, ...] | None) -> None:
    parsed = validation._go_url_parse(raw)
    if expected is None:
        assert parsed is None
        return
    assert parsed is not None
    assert (parsed.host, parsed.raw_query, parsed.fragment, parsed.path, parsed.opaque) == expected


GO_UNESCAPE = [
    (b"", b""),
    (b"abc", b"abc"),
    (b"%41", b"A"),  # at the very end
    (b"a%41b", b"aAb"),
    (b"%41%42", b"AB"),
    (b"%2f", b"/"),
    (b"%2F", b"/"),
    (b"%e9", b"\xe9"),  # a lone byte, not UTF-8: kept as the byte
    (b"%C3%a9", b"\xc3\xa9"),
    (b"%00", b"\x00"),
    (b"%ff%FF", b"\xff\xff"),
    (b"%09%af%AF", b"\x09\xaf\xaf"),
    (b"+", b"+"),  # paths keep "+" (only queries turn it into a space)
    (b"%2B", b"+"),
    (b"%25", b"%"),
    (b"%2541", b"%41"),  # decoded once
    (b"%", None),
    (b"%4", None),
    (b"a%4", None),
    (b"%4g", None),
    (b"%g4", None),
    (b"%G0", None),
    (b"%-1", None),
    (b"% 1", None),
    (b"%41%", None),
    (b"%%41", None),
]


@pytest.mark.parametrize(("text", "expected"), GO_UNESCAPE, ids=[repr(t) for t, _ in GO_UNESCAPE])
def test_go_unescape(text: bytes, expected: bytes | None) -> None:
    assert validation._go_unescape(text) == expected


def test_a_refusal_shows_an_undecodable_name_escaped() -> None:
    # os.scandir gives undecodable bytes as lone surrogates: the message (a log line and
    # the plugin's NotifyRegistrationStatus error, a protobuf string) must stay UTF-8.
    for call, value, shown in [
        (validation.validate_driver_name, "gpu\udcff", "gpu\\udcff"),
        (validation.validate_driver_name, "\udcff" * 64, "\\udcff" * 64),
        (validation.validate_endpoint, "run/\udcff.sock", "run/\\udcff.sock"),
        (validation.validate_endpoint, "/" + "\udcff" * 40, "/" + "\\udcff" * 40),
        (validation.validate_endpoint, "/x?\udcff", "/x?\\udcff"),
    ]:
        with pytest.raises(errors.RegistrationError) as caught:
            call(value)
        message = str(caught.value)
        message.encode("utf-8")
        assert repr(shown) in message, message


@pytest.mark.parametrize(
    ("name", "refusal"),
    [
        ("a" * 62 + "\udcff", "longer than 63 bytes"),  # a lone surrogate counts 3 bytes
        ("a" * 60 + "\udcff", "RFC 1123 subdomain"),
        ("g.io", OK),
        ("0", OK),
        ("a-b", OK),
        ("a.b-c.d", OK),
        ("a" * 63 + "." + "b", "longer than 63 bytes"),
        ("A", OK),
        ("\u212a", OK),
        ("\u0130", OK),
        ("a\u0130b\u212a", OK),
        ("\u0131", "RFC 1123 subdomain"),  # dotless i: lower case already, not ASCII
        ("\u00c4", "RFC 1123 subdomain"),
        ("a-", "RFC 1123 subdomain"),
        (".a", "RFC 1123 subdomain"),
        ("a b", "RFC 1123 subdomain"),
    ],
)
def test_driver_name_edges(name: str, refusal: str | None) -> None:
    test_driver_name(name, refusal)


def test_driver_name_refusals_say_why() -> None:
    with pytest.raises(errors.RegistrationError) as caught:
        validation.validate_driver_name("Bad_Name")
    assert str(caught.value) == (
        "invalid DRA driver name 'Bad_Name': a lowercase RFC 1123 subdomain must consist of "
        "lower case alphanumeric characters, '-' or '.', and must start and end with an "
        "alphanumeric character (checked after lower-casing)"
    )
    with pytest.raises(errors.RegistrationError) as caught:
        validation.validate_driver_name("a" * 64)
    assert str(caught.value) == f"invalid DRA driver name {'a' * 64!r}: longer than 63 bytes"
    with pytest.raises(errors.RegistrationError) as caught:
        validation.validate_driver_name("")
    assert str(caught.value) == "invalid DRA driver name: empty"


def test_endpoint_refusals_say_why() -> None:
    long = "/" + "x" * 107
    cases = {
        "": "empty DRA plugin endpoint",
        "x.sock": "DRA plugin endpoint 'x.sock' must be an absolute path",
        long: f"DRA plugin endpoint {long!r} must not be longer than 108 bytes",
        "/x?y": "DRA plugin endpoint '/x?y' must be a plain path",
    }
    for endpoint, message in cases.items():
        with pytest.raises(errors.RegistrationError) as caught:
            validation.validate_endpoint(endpoint)
        assert str(caught.value) == message
        assert caught.value.reason == "endpoint"
