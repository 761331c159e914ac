"""Registration validation: the driver name and the endpoint, as kubelet v1.38 checks them.

Counterpart of ``validateDriverName`` and ``validateEndpoint`` in
``pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go`` (v1.38), with the part of Go's
``net/url.Parse`` (Go 1.26/1.27) the endpoint check depends on, ported so that an
endpoint is "plain" exactly when the kubelet finds it plain. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import re

from kubelet_dra import errors

DRIVER_NAME_MAX_BYTES = 63
"""``ValidateCSIDriverName``'s limit."""
UNIX_PATH_MAX = 108
"""``sun_path`` on Linux: an endpoint must be shorter (kubelet ``unixPathMax``)."""
_DNS1123_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*")
_DNS1123_SUBDOMAIN_MAX = 253
# Go's strings.ToLower maps rune by rune (simple case mapping); only these two
# non-ASCII runes become ASCII, every other non-ASCII rune stays non-ASCII
# (so fails the subdomain pattern whatever it maps to). Python's str.lower()
# differs for U+0130 ("i" plus a combining dot).
_GO_LOWER_TO_ASCII = {"\u0130": "i", "\u212a": "k"}


def validate_driver_name(driver: str) -> None:
    """Kubelet v1.38's ``validateDriverName`` (``ValidateCSIDriverName``).

    Non-empty, at most 63 bytes, and a DNS-1123 subdomain once lower-cased
    (so ``GPU.Example.com`` is accepted, ``gpu_example`` is not).
    """
    if not driver:
        raise errors.RegistrationError("invalid DRA driver name: empty", reason="driver_name")
    if len(driver.encode("utf-8", "surrogatepass")) > DRIVER_NAME_MAX_BYTES:
        raise errors.RegistrationError(
            f"invalid DRA driver name {printable(driver)!r}: "
            f"longer than {DRIVER_NAME_MAX_BYTES} bytes",
            reason="driver_name",
        )
    lowered = _go_lower(driver)
    if len(lowered) > _DNS1123_SUBDOMAIN_MAX or not _DNS1123_SUBDOMAIN.fullmatch(lowered):
        raise errors.RegistrationError(
            f"invalid DRA driver name {printable(driver)!r}: a lowercase RFC 1123 subdomain "
            "must consist of lower case alphanumeric characters, '-' or '.', and must start "
            "and end with an alphanumeric character (checked after lower-casing)",
            reason="driver_name",
        )


def _go_lower(text: str) -> str:
    return "".join(_GO_LOWER_TO_ASCII.get(c) or (c.lower() if c.isascii() else c) for c in text)


def validate_endpoint(endpoint: str) -> None:
    """Kubelet v1.38's ``validateEndpoint``: an absolute, plain path under 108 bytes.

    "Plain" is decided as the kubelet decides it, by Go's ``url.Parse`` of
    ``unix:<endpoint>`` (:func:`_go_url_parse`): no host, query or fragment,
    and the parsed path equal to the endpoint. So a ``%`` escape (``%2e%2e``
    would be dialled as ``..``), ``?``, ``#``, a leading ``//`` and control
    characters are refused.
    """
    if not endpoint:
        raise errors.RegistrationError("empty DRA plugin endpoint", reason="endpoint")
    shown = printable(endpoint)
    if not endpoint.startswith("/"):  # filepath.IsAbs on Linux
        raise errors.RegistrationError(
            f"DRA plugin endpoint {shown!r} must be an absolute path", reason="endpoint"
        )
    raw = endpoint.encode("utf-8", "surrogatepass")
    if len(raw) >= UNIX_PATH_MAX:
        raise errors.RegistrationError(
            f"DRA plugin endpoint {shown!r} must not be longer than {UNIX_PATH_MAX} bytes",
            reason="endpoint",
        )
    parsed = _go_url_parse(b"unix:" + raw)
    plain = parsed is not None and not (parsed.host or parsed.raw_query or parsed.fragment)
    if not plain or (parsed is not None and (parsed.path or parsed.opaque) != raw):
        raise errors.RegistrationError(
            f"DRA plugin endpoint {shown!r} must be a plain path", reason="endpoint"
        )


@dataclasses.dataclass(frozen=True, slots=True)
class _GoURL:
    host: bytes
    raw_query: bytes
    fragment: bytes
    path: bytes
    opaque: bytes


def _go_url_parse(raw: bytes) -> _GoURL | None:
    """Go's ``net/url.Parse`` (Go 1.26/1.27), reduced to the fields the endpoint check reads.

    ``None`` where Go returns an error. Works on bytes, as Go does, so a
    ``%ff`` decodes to a byte that is not UTF-8 and simply compares unequal.
    The one simplification: the authority of ``//host/...`` is split off but
    not validated as Go's ``parseHost`` would. It does not change the
    verdict: with an authority, Go either fails, or finds a host, or leaves a
    path shorter than the input, and each of those refuses the endpoint.
    """
    head, _, frag = raw.partition(b"#")
    url = _go_parse(head)
    if url is None or not frag:
        return url
    fragment = _go_unescape(frag)
    if fragment is None:
        return None
    return dataclasses.replace(url, fragment=fragment)


def _go_parse(raw: bytes) -> _GoURL | None:
    if any(b < 0x20 or b == 0x7F for b in raw):
        return None  # "net/url: invalid control character in URL"
    scheme, rest = _go_scheme(raw)
    if rest is None:
        return None  # "missing protocol scheme"
    if rest.endswith(b"?") and rest.count(b"?") == 1:
        rest, query = rest[:-1], b""  # ForceQuery, RawQuery stays empty
    else:
        rest, _, query = rest.partition(b"?")
    if not rest.startswith(b"/"):
        if scheme:
            return _GoURL(b"", query, b"", b"", rest)  # rootless: opaque
        if b":" in rest.partition(b"/")[0]:
            return None  # "first path segment in URL cannot contain colon"
    host = b""
    if (scheme or not rest.startswith(b"///")) and rest.startswith(b"//"):
        authority, slash, tail = rest[2:].partition(b"/")
        rest = slash + tail
        host = authority.rpartition(b"@")[2]
    path = _go_unescape(rest)
    if path is None:
        return None
    return _GoURL(host, query, b"", path, b"")


def _go_scheme(raw: bytes) -> tuple[bytes, bytes | None]:
    # Go's getScheme: letters, then letters, digits, "+", "-" or "."; a ":"
    # ends it (at position 0 it is an error); anything else means no scheme.
    for i, b in enumerate(raw):
        if chr(b).isascii() and chr(b).isalpha():
            continue
        if chr(b) in "0123456789+-.":
            if i == 0:
                return b"", raw
            continue
        if b == ord(":"):
            return (b"", None) if i == 0 else (raw[:i].lower(), raw[i + 1 :])
        return b"", raw
    return b"", raw


def _go_unescape(text: bytes) -> bytes | None:
    # Go's unescape for paths and fragments: every "%" must start a valid
    # "%XX" (else an error); "+" stays "+".
    out = bytearray()
    i = 0
    while i < len(text):
        if text[i] == ord("%"):
            pair = text[i + 1 : i + 3]
            if len(pair) < 2 or not all(chr(c) in "0123456789abcdefABCDEF" for c in pair):
                return None
            out.append(int(pair, 16))
            i += 3
        else:
            out.append(text[i])
            i += 1
    return bytes(out)


def printable(path: str) -> str:
    return path.encode("utf-8", "backslashreplace").decode("utf-8")
