"""Status PATCHes on the event loop: a small keep-alive HTTP/1.1 client over asyncio streams.

Part of ``kube``. Kubelet counterpart: client-go's HTTP transport, which the
kubelet's status manager sends its patches through without leaving its
goroutine. Here every other request still goes through the official client
in a worker thread (``kube.api``); the pod status PATCH alone, the request on
the report -> PATCH path, is sent from the event loop (issue 15: the hop into
a worker thread, ``param_serialize``'s body walk and urllib3 cost more than
the server's own work on the stand-in, and a thread fights the gRPC poller
for the GIL).

Everything that decides *how* to reach the server is taken from the official
client's ``Configuration``: the host URL (a path prefix included), TLS (CA
file or data, client certificate and key, ``verify_ssl``, ``assert_hostname``,
``tls_server_name``), and the request headers with authentication from
``ApiClient.param_serialize`` (default headers, ``User-Agent``, the bearer
token and its refresh hook). Those headers are computed in a worker thread
(a refresh hook may run an exec plugin or read a token file) and reused for
:data:`AUTH_TTL` seconds; a 401 fetches them again and retries once. A
proxy, or socket options the client was told to use, make
:meth:`Transport.from_client` return ``None``: the caller keeps the urllib3
path, which knows them.

The wire protocol is the part of HTTP/1.1 an API server answers a PATCH
with: a ``Content-Length`` or chunked body, keep-alive unless ``Connection:
close``, interim 1xx answers skipped. ``Accept-Encoding`` is not sent, so
bodies come unencoded. A response is an :class:`Answer`; turning a status
into an error is the caller's (``kube.api``), so both paths raise the same
``CallError``/``PodGone``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import ssl
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

AUTH_TTL = 10.0
"""Seconds the request headers (with the bearer token) are reused before being asked for
again; a refreshed token is picked up at most this late, and a 401 at once."""
MAX_HEADER_BYTES = 64 * 1024
MAX_IDLE = 8
"""Idle connections kept (the writer sends at most ``write_concurrency`` at once)."""


class TransportError(Exception):
    """The connection failed, timed out or answered something that is not HTTP/1.1."""


@dataclasses.dataclass(frozen=True, slots=True)
class Answer:
    """One HTTP response: status, reason, headers (lower-case names) and body."""

    status: int
    reason: str
    headers: Mapping[str, str]
    body: bytes


@dataclasses.dataclass(slots=True)
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def usable(self) -> bool:
        return not (self.reader.at_eof() or self.writer.is_closing())

    def close(self) -> None:
        self.writer.close()


class _Closed(TransportError):
    """The server closed the connection before answering (an idle keep-alive connection)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Endpoint:
    """Where to connect and how: from the client's ``Configuration``."""

    host: str
    port: int
    ssl: ssl.SSLContext | None
    server_hostname: str | None
    prefix: str  # the host URL's path ("" or "/k8s/clusters/x"), before each resource path


class Transport:
    """PATCH (or any request with a JSON body) on pooled keep-alive connections.

    Use from one event loop; :meth:`aclose` closes the idle connections (a
    later request opens new ones).
    """

    def __init__(
        self,
        endpoint: Endpoint,
        headers: Callable[[str, str, str], dict[str, str]],
        *,
        timeout: tuple[float, float],
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._endpoint = endpoint
        self._make_headers = headers
        self._connect_timeout, self._read_timeout = timeout
        self._idle: list[_Conn] = []
        self._auth: dict[str, tuple[float, dict[str, str]]] = {}  # by content type
        self._now = clock or (lambda: asyncio.get_running_loop().time())
        netloc = endpoint.host if ":" not in endpoint.host else f"[{endpoint.host}]"
        default = 443 if endpoint.ssl is not None else 80
        self._host_header = netloc if endpoint.port == default else f"{netloc}:{endpoint.port}"

    @classmethod
    def from_client(cls, client: Any, *, timeout: tuple[float, float]) -> Transport | None:
        """A transport for the official ``ApiClient``'s server, or ``None`` when it
        needs what only urllib3 does here (a proxy, custom socket options)."""
        endpoint = endpoint_of(client.configuration)
        if endpoint is None:
            return None

        def headers(method: str, path: str, content_type: str) -> dict[str, str]:
            _, _, found, _, _ = client.param_serialize(
                method=method, resource_path=path,
                header_params={"Accept": "application/json", "Content-Type": content_type},
                auth_settings=["BearerToken"],
            )  # fmt: skip
            return {str(k): str(v) for k, v in found.items()}

        return cls(endpoint, headers, timeout=timeout)

    async def request(
        self, method: str, path: str, query: str, body: bytes, content_type: str
    ) -> Answer:
        """Send one request with ``body``; the answer, whatever its status.

        Raises :class:`TransportError` when no answer came (refused, reset,
        timed out, not HTTP).
        """
        headers = await self._headers(method, path, content_type, fresh=False)
        answer = await self._send(method, path, query, body, headers)
        if answer.status == 401:
            # The token may have been rotated since we asked: ask again, once.
            headers = await self._headers(method, path, content_type, fresh=True)
            answer = await self._send(method, path, query, body, headers)
        return answer

    async def aclose(self) -> None:
        """Close the idle connections."""
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        for conn in idle:
            with contextlib.suppress(OSError, ssl.SSLError):
                await conn.writer.wait_closed()

    # -- internals -------------------------------------------------------------

    async def _headers(
        self, method: str, path: str, content_type: str, *, fresh: bool
    ) -> dict[str, str]:
        now = self._now()
        cached = self._auth.get(content_type)
        if fresh or cached is None or now - cached[0] > AUTH_TTL:
            # In a thread: the client's refresh hook may read a file or run a program.
            headers = await asyncio.to_thread(self._make_headers, method, path, content_type)
            cached = self._auth[content_type] = (now, headers)
        return cached[1]

    async def _send(
        self, method: str, path: str, query: str, body: bytes, headers: Mapping[str, str]
    ) -> Answer:
        target = self._endpoint.prefix + path + (f"?{query}" if query else "")
        head = [f"{method} {target} HTTP/1.1", f"Host: {self._host_header}"]
        head += [f"{k}: {v}" for k, v in headers.items() if k.lower() not in _OURS]
        head += [f"Content-Length: {len(body)}", "", ""]
        data = "\r\n".join(head).encode("latin-1") + body
        conn, reused = await self._take()
        try:
            try:
                answer = await self._exchange(conn, data)
            except _Closed:
                if not reused:
                    raise
                # An idle connection the server had closed (or reset): one fresh
                # attempt, as client-go makes. Nothing was answered; a patch the
                # server did apply would fail its own `test` operations the
                # second time (a 422 the writer handles), never apply twice.
                conn.close()
                conn = await self._connect()
                answer = await self._exchange(conn, data)
        except BaseException:
            conn.close()
            raise
        if answer.headers.get("connection", "").lower() == "close" or len(self._idle) >= MAX_IDLE:
            conn.close()
        else:
            self._idle.append(conn)
        return answer

    async def _take(self) -> tuple[_Conn, bool]:
        while self._idle:
            conn = self._idle.pop()
            if conn.usable():
                return conn, True
            conn.close()
        return await self._connect(), False

    async def _connect(self) -> _Conn:
        ep = self._endpoint
        try:
            async with asyncio.timeout(self._connect_timeout):
                reader, writer = await asyncio.open_connection(
                    ep.host, ep.port, ssl=ep.ssl, server_hostname=ep.server_hostname,
                    limit=MAX_HEADER_BYTES,
                )  # fmt: skip
        except TimeoutError as exc:
            raise TransportError(f"connecting to {ep.host}:{ep.port} timed out") from exc
        except (OSError, ssl.SSLError) as exc:
            raise TransportError(f"cannot connect to {ep.host}:{ep.port}: {exc}") from exc
        sock = writer.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _Conn(reader, writer)

    async def _exchange(self, conn: _Conn, data: bytes) -> Answer:
        try:
            async with asyncio.timeout(self._read_timeout):
                conn.writer.write(data)
                await conn.writer.drain()
                return await _read_answer(conn.reader)
        except TimeoutError as exc:
            raise TransportError(f"no answer within {self._read_timeout:g} s") from exc
        except (ConnectionResetError, BrokenPipeError) as exc:
            raise _Closed(f"connection lost ({exc})") from exc
        except (OSError, ssl.SSLError, asyncio.LimitOverrunError, ValueError) as exc:
            raise TransportError(f"connection lost ({exc})") from exc


_OURS = frozenset({"host", "content-length", "transfer-encoding", "connection"})


async def _read_answer(reader: asyncio.StreamReader) -> Answer:
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                raise _Closed("the server closed the connection") from None
            raise TransportError("the server closed the connection mid-answer") from exc
        status, reason, headers = _parse_head(head)
        if not 100 <= status < 200:
            break  # 1xx: an interim answer, the real one follows
    if status in (204, 304):
        return Answer(status, reason, headers, b"")
    try:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = await _read_chunked(reader)
        elif "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        else:
            body = await reader.read()  # until the server closes
            headers = {**headers, "connection": "close"}
    except asyncio.IncompleteReadError as exc:
        raise TransportError("the server closed the connection mid-answer") from exc
    return Answer(status, reason, headers, body)


def _parse_head(head: bytes) -> tuple[int, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise TransportError(f"not an HTTP/1.1 answer: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise TransportError(f"bad header line: {line[:80]!r}")
        key = name.strip().lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return int(code), reason, headers


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        line = await reader.readuntil(b"\r\n")
        size = int(line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            # Trailers (none expected) end with an empty line.
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)  # the chunk's CRLF


def endpoint_of(config: Any) -> Endpoint | None:
    """Where and how to connect, from a ``kubernetes.client.Configuration``; ``None``
    when a proxy applies or socket options are set (the urllib3 path handles those)."""
    from kubernetes.client.rest import should_bypass_proxies

    url = urllib.parse.urlsplit(str(config.host))
    if url.scheme not in ("http", "https") or not url.hostname:
        return None
    if config.proxy and not should_bypass_proxies(config.host, config.no_proxy or ""):
        return None
    if config.socket_options is not None:
        return None
    context = _ssl_context(config) if url.scheme == "https" else None
    server_hostname = (config.tls_server_name or url.hostname) if context is not None else None
    port = url.port or (443 if url.scheme == "https" else 80)
    return Endpoint(url.hostname, port, context, server_hostname, url.path.rstrip("/"))


def _ssl_context(config: Any) -> ssl.SSLContext:
    """TLS as the client's urllib3 pool does it (``kubernetes.client.rest``)."""
    context = ssl.create_default_context(cafile=config.ssl_ca_cert or None)
    data = config.ca_cert_data
    if data:
        context.load_verify_locations(cadata=data.decode() if isinstance(data, bytes) else data)
    if not config.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif config.assert_hostname is False:
        context.check_hostname = False
    if config.cert_file:
        context.load_cert_chain(config.cert_file, config.key_file or None)
    context.set_alpn_protocols(["http/1.1"])
    return context
