"""Status PATCHes on the event loop: a keep-alive HTTP/1.1 client, h11 over asyncio streams.

Part of ``kube``. Kubelet counterpart: client-go's HTTP transport, which the kubelet's
status manager sends its patches through without leaving its goroutine. Every other
request still goes through the official client in a worker thread (``kube.api``); the pod
status PATCH alone, the request on the report -> PATCH path, is sent from the event loop:
the hop into a worker thread and urllib3 cost more than the server's own work, and a thread
fights the gRPC poller for the GIL. :class:`Transport` says how it reaches the server.
Decision record: ``docs/decisions/0002-async-status-patch.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import socket
import ssl
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

import h11

from kubelet_dra import errors

AUTH_TTL = 10.0
"""Seconds the request headers (with the bearer token) are reused before being asked for
again; a refreshed token is picked up at most this late, and a 401 at once."""
MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 8 * 1024 * 1024
"""The largest answer body read: a pod (what a status PATCH answers) is at most about 1.5 MiB
in etcd, so a bigger body is a server or proxy gone wrong, not a pod to keep in memory."""
_READ_SIZE = 64 * 1024
_TLS_READ = 16 * 1024  # a TLS record's largest plaintext
MAX_IDLE = 8
"""Idle connections kept (the writer sends at most ``write_concurrency`` at once)."""
IDLE_TIMEOUT = 90.0
"""Seconds an idle connection is kept before it is closed: client-go's (its transport takes
``IdleConnTimeout`` from Go's ``http.DefaultTransport``, 90 s). Each TLS connection holds
OpenSSL's state, about 54 KB of RSS (293 KB on asyncio's SSL transport, which this module left);
without a timeout a burst of concurrent writes (a 429 window, a relist) left up to
:data:`MAX_IDLE` of them open for the process's life (``docs/memory.md``). The most
recently used connection is taken first, so the extra ones age out while a steady trickle
of writes keeps one warm."""


class TransportError(Exception):
    """The connection failed, timed out or answered something that is not HTTP/1.1."""


@dataclasses.dataclass(frozen=True, slots=True)
class Answer:
    """One HTTP response: status, reason, headers (lower-case names) and body."""

    status: int
    reason: str
    headers: Mapping[str, str]
    body: bytes


class _Tls:
    """TLS on two memory BIOs (``ssl.SSLObject``) over a plain TCP connection.

    Not asyncio's SSL transport (``open_connection(ssl=...)``): its protocol
    (``asyncio.sslproto.SSLProtocol``) allocates a 256 KiB read buffer per
    connection and keeps it for the connection's life, so a pool of 8 idle
    connections held 2 MiB (docs/memory.md), and a
    connection that failed kept it in a reference cycle until a full garbage
    collection. Here a connection keeps OpenSSL's state and what arrived and
    was not read yet; a read takes at most one TLS record's plaintext
    (:data:`_TLS_READ`); :meth:`close` lets OpenSSL's state go at once.
    """

    __slots__ = ("_state",)

    def __init__(self, context: ssl.SSLContext, server_hostname: str | None) -> None:
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = context.wrap_bio(
            incoming, outgoing, server_side=False, server_hostname=server_hostname
        )
        # OpenSSL's state and the bytes received and to send: None once closed.
        self._state: tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO] | None = (
            tls,
            incoming,
            outgoing,
        )

    @property
    def _live(self) -> tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO]:
        if self._state is None:
            raise ConnectionResetError("the TLS connection was closed")
        return self._state

    # The coroutines keep no TLS object in a local across a wait: a connection that fails
    # leaves its frames in a reference cycle, and what they hold waits for the collector.

    async def handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Handshake (the server's certificate and name checked by the context)."""
        while not self._shake(writer):
            if not await self._fill(reader):
                raise ConnectionResetError("the server closed the connection in the handshake")

    def seal(self, data: bytes) -> bytes:
        """``data`` as TLS records to send."""
        tls, _, outgoing = self._live
        tls.write(data)
        return outgoing.read()

    async def recv(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
        """Plaintext that arrived, at most one record's; ``b""`` when the server closed."""
        while (data := self._read(writer)) is None:
            if not await self._fill(reader):
                return b""  # closed without close_notify: an end, as on a plain socket
        return data

    def _shake(self, writer: asyncio.StreamWriter) -> bool:
        """One step of the handshake; True when it is done."""
        tls, _, outgoing = self._live
        try:
            tls.do_handshake()
            done = True
        except ssl.SSLWantReadError:
            done = False
        writer.write(outgoing.read())
        return done

    def _read(self, writer: asyncio.StreamWriter) -> bytes | None:
        """Plaintext already here; ``b""`` at close_notify; None: more bytes are needed."""
        tls, _, outgoing = self._live
        try:
            return tls.read(_TLS_READ)
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLZeroReturnError:
            return b""
        pending = outgoing.read()  # what OpenSSL answers (a key update)
        if pending:
            writer.write(pending)
        return None

    def close(self, *, notify: bool) -> bytes:
        """Let OpenSSL's state and the buffers go; a close_notify to send first when
        ``notify``."""
        goodbye = b""
        if notify and self._state is not None:
            tls, _, outgoing = self._state
            with contextlib.suppress(ssl.SSLError):
                tls.unwrap()
            goodbye = outgoing.read()
        self._state = None
        return goodbye

    async def _fill(self, reader: asyncio.StreamReader) -> bool:
        data = await reader.read(_READ_SIZE)
        _, incoming, _ = self._live  # after the wait: the connection may have been closed
        if not data:
            incoming.write_eof()
            return False
        incoming.write(data)
        return True


@dataclasses.dataclass(slots=True)
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    tls: _Tls | None = None  # None: plain HTTP
    parked: float = 0.0  # when it last went idle (the transport's clock)
    closed: bool = False
    http: h11.Connection = dataclasses.field(
        default_factory=lambda: h11.Connection(
            h11.CLIENT, max_incomplete_event_size=MAX_HEADER_BYTES
        )
    )

    def usable(self) -> bool:
        return not (self.reader.at_eof() or self.writer.is_closing())

    def reusable(self) -> bool:
        """Both sides ended their message and neither asked to close: start the next cycle."""
        if self.http.our_state is h11.DONE and self.http.their_state is h11.DONE:
            self.http.start_next_cycle()
            return True
        return False

    def send(self, data: bytes) -> None:
        self.writer.write(data if self.tls is None else self.tls.seal(data))

    async def recv(self) -> bytes:
        """What the server sent next; ``b""`` when it closed the connection."""
        if self.tls is None:
            return await self.reader.read(_READ_SIZE)
        return await self.tls.recv(self.reader, self.writer)

    def close(self) -> bool:
        """Close it; ``True`` the first time (the transport counts each connection once)."""
        if self.closed:
            return False
        self.closed = True
        if self.tls is not None:
            # OpenSSL's state goes now, not with the stream: a connection that failed sits
            # in a reference cycle (its stream keeps the exception, whose frames keep the
            # TLS layer) until a full garbage collection.
            alive = not (self.reader.at_eof() or self.writer.is_closing())
            goodbye = self.tls.close(notify=alive)
            if goodbye:
                self.writer.write(goodbye)
        self.writer.close()
        _release_write_error(self.reader.exception())
        return True


def _release_write_error(stored: BaseException | None) -> None:
    """Clear the frames of a write error that asyncio kept instead of raising.

    A write the kernel refused (a reset) is caught inside asyncio's transport, which keeps
    the exception in the stream and in its futures (their ``_exception_tb`` too). Its
    traceback's frame links back (``f_back``) through asyncio's writes to our ``send`` and
    ``_exchange``, whose locals hold the connection, hence the stream: a cycle that only a
    full collection frees. Those frames have all returned when the connection is closed;
    the walk stops at ``_exchange``, or at any frame of other code.
    """
    tb = stored.__traceback__ if stored is not None else None
    frame = tb.tb_frame if tb is not None else None
    while frame is not None:
        code, back = frame.f_code, frame.f_back
        if not (code in _WRITE_PATH or f"{os.sep}asyncio{os.sep}" in code.co_filename):
            return
        with contextlib.suppress(RuntimeError):  # still running: not ours to clear
            frame.clear()
        if code is _EXCHANGE:
            return
        frame = back


class _Closed(TransportError):
    """The server closed the connection before answering (an idle keep-alive connection)."""


class BodyTooLarge(TransportError):
    """The answer's body is larger than :data:`MAX_BODY_BYTES`; the connection is dropped."""


@dataclasses.dataclass(frozen=True, slots=True)
class Endpoint:
    """Where to connect and how: from the client's ``Configuration``."""

    host: str
    port: int
    ssl: ssl.SSLContext | None
    server_hostname: str | None
    prefix: str  # the host URL's path ("" or "/k8s/clusters/x"), before each resource path


@dataclasses.dataclass(frozen=True, slots=True)
class PoolCounts:
    """The connection pool in numbers, for the metrics (``kubelet_dra_status_patch_*``)."""

    open: int = 0  # open now, idle or carrying a request
    idle: int = 0  # open and waiting for the next request
    opened: int = 0  # made since the start


class Transport:
    """PATCH (or any request with a JSON body) on pooled keep-alive connections.

    Use from one event loop; :meth:`aclose` closes the idle connections (a
    later request opens new ones).

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

    The wire protocol is h11's (the sans-IO HTTP/1.1 state machine under httpx):
    it frames the request, parses the answer (``Content-Length``, chunked or
    until close; interim 1xx answers skipped) and says whether the connection
    can carry the next request; this module only moves bytes and keeps the pool.
    TLS is ``ssl.SSLObject`` on memory BIOs over a plain asyncio connection
    (:class:`_Tls`), the handshake checked by the context built from the
    client's settings; not asyncio's SSL transport, whose 256 KiB read buffer
    per connection made each pooled connection cost 293 KB of RSS instead of 54
    (``python -m benchmarks.rssprobe tls-hold-asyncio`` / ``tls-hold-patch``).
    Heads are capped at :data:`MAX_HEADER_BYTES` and bodies at
    :data:`MAX_BODY_BYTES` (:class:`BodyTooLarge`). ``Accept-Encoding`` is not
    sent, so bodies come unencoded. :func:`endpoint_of` is the one place that
    reads the connection and TLS settings from the client's ``Configuration``.
    A response is an :class:`Answer`; turning a status into an error is the
    caller's (``kube.api``), so both paths raise the same ``CallError``/``PodGone``.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        headers: Callable[[str, str, str], dict[str, str]],
        *,
        timeout: tuple[float, float],
        clock: Callable[[], float] | None = None,
        idle_timeout: float = IDLE_TIMEOUT,
    ) -> None:
        self._endpoint = endpoint
        self._make_headers = headers
        self._connect_timeout, self._read_timeout = timeout
        self.idle_timeout = idle_timeout
        self._idle: list[_Conn] = []  # oldest first: the last one is taken next
        self._sweep: asyncio.TimerHandle | None = None
        self.opened = 0  # connections made
        self.closed = 0  # connections closed, for whatever reason
        self.closed_idle = 0  # idle connections closed after idle_timeout
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

    @property
    def idle(self) -> int:
        """Idle connections kept now."""
        return len(self._idle)

    @property
    def open(self) -> int:
        """Connections open now: the idle ones and those carrying a request."""
        return self.opened - self.closed

    def counts(self) -> PoolCounts:
        """The pool now (read on the event loop that uses the transport)."""
        return PoolCounts(open=self.open, idle=self.idle, opened=self.opened)

    def close_expired(self) -> int:
        """Close the connections idle for ``idle_timeout`` or longer; how many."""
        now = self._now()
        expired = 0
        # Oldest first (parked in order, taken from the end): the expired are a prefix.
        while self._idle and now - self._idle[0].parked >= self.idle_timeout:
            self._drop(self._idle.pop(0))
            expired += 1
        self.closed_idle += expired
        return expired

    async def aclose(self) -> None:
        """Close the idle connections."""
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        idle, self._idle = self._idle, []
        for conn in idle:
            self._drop(conn)
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
        fields = [("Host", self._host_header)]
        fields += [(k, v) for k, v in headers.items() if k.lower() not in _OURS]
        fields.append(("Content-Length", str(len(body))))
        request = h11.Request(method=method, target=target, headers=fields)
        conn, reused = await self._take()
        try:
            try:
                answer = await self._exchange(conn, request, body)
            except _Closed as exc:
                if not reused:
                    raise  # Api drops the frames of what leaves the transport
                # The stream keeps a reset's exception and the exception's frames keep
                # the stream: a cycle, unless the finished frames let go.
                errors.drop_frames(exc)
                # An idle connection the server had closed (or reset): one fresh
                # attempt, as client-go makes. Nothing was answered; a patch the
                # server did apply would fail its own `test` operations the
                # second time (a 422 the writer handles), never apply twice.
                self._drop(conn)
                conn = await self._connect()
                answer = await self._exchange(conn, request, body)
        except BaseException:
            self._drop(conn)
            raise
        if not conn.reusable() or len(self._idle) >= MAX_IDLE:
            self._drop(conn)
        else:
            self._park(conn)
        return answer

    def _drop(self, conn: _Conn) -> None:
        if conn.close():
            self.closed += 1

    def _park(self, conn: _Conn) -> None:
        conn.parked = self._now()
        self._idle.append(conn)
        if self._sweep is None:
            # With no request coming, nothing else would close them: a timer does.
            self._sweep = asyncio.get_running_loop().call_later(self.idle_timeout, self._swept)

    def _swept(self) -> None:
        self._sweep = None
        self.close_expired()
        if self._idle:
            # The oldest left goes idle_timeout after it was parked; the clock may be a
            # test's, so never sooner than a second from now.
            due = self._idle[0].parked + self.idle_timeout - self._now()
            loop = asyncio.get_running_loop()
            self._sweep = loop.call_later(max(1.0, due), self._swept)

    async def _take(self) -> tuple[_Conn, bool]:
        self.close_expired()
        while self._idle:
            conn = self._idle.pop()
            if conn.usable():
                return conn, True
            self._drop(conn)
        return await self._connect(), False

    async def _connect(self) -> _Conn:
        ep = self._endpoint
        try:
            async with asyncio.timeout(self._connect_timeout):
                reader, writer = await asyncio.open_connection(ep.host, ep.port)
                tls = await self._secure(reader, writer)
        except TimeoutError as exc:
            raise TransportError(f"connecting to {ep.host}:{ep.port} timed out") from exc
        except (OSError, ssl.SSLError) as exc:
            raise TransportError(f"cannot connect to {ep.host}:{ep.port}: {exc}") from exc
        sock = writer.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.opened += 1
        return _Conn(reader, writer, tls)

    async def _secure(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> _Tls | None:
        """TLS over the new connection when the endpoint has a context; ``None`` when not."""
        ep = self._endpoint
        if ep.ssl is None:
            return None
        tls = _Tls(ep.ssl, ep.server_hostname)
        try:
            await tls.handshake(reader, writer)
        except BaseException:
            tls.close(notify=False)
            writer.close()  # connected, never made secure: nothing else would close it
            raise
        return tls

    async def _exchange(self, conn: _Conn, request: h11.Request, body: bytes) -> Answer:
        try:
            async with asyncio.timeout(self._read_timeout):
                for event in (request, h11.Data(data=body), h11.EndOfMessage()):
                    conn.send(conn.http.send(event) or b"")
                await conn.writer.drain()
                return await _read_answer(conn)
        except TimeoutError as exc:
            raise TransportError(f"no answer within {self._read_timeout:g} s") from exc
        except (ConnectionResetError, BrokenPipeError) as exc:
            raise _Closed(f"connection lost ({exc})") from exc
        except h11.RemoteProtocolError as exc:
            raise TransportError(f"not an HTTP/1.1 answer: {exc}") from exc
        except (OSError, ssl.SSLError, h11.LocalProtocolError) as exc:
            raise TransportError(f"connection lost ({exc})") from exc


_OURS = frozenset({"host", "content-length", "transfer-encoding", "connection"})


async def _read_answer(conn: _Conn) -> Answer:
    """The next final answer on ``conn`` (1xx skipped), its body at most MAX_BODY_BYTES."""
    response: h11.Response | None = None
    body = bytearray()
    received = 0
    while True:
        event = conn.http.next_event()
        if event is h11.NEED_DATA:
            data = await conn.recv()
            if not data and not received:
                raise _Closed("the server closed the connection")
            received += len(data)
            conn.http.receive_data(data)  # b"": the server closed; h11 says what that means
        elif isinstance(event, h11.Response):
            response = event
            _check_length(event)
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_BODY_BYTES:
                raise BodyTooLarge(f"the answer's body exceeds {MAX_BODY_BYTES} bytes")
        elif isinstance(event, h11.EndOfMessage):
            break
        elif isinstance(event, h11.ConnectionClosed):
            raise TransportError("the server closed the connection mid-answer")
        # h11.InformationalResponse: an interim answer, the real one follows
    if response is None:  # pragma: no cover - h11 ends a message only after its head
        raise TransportError("the server sent no answer")
    headers: dict[str, str] = {}
    for raw_name, raw_value in response.headers:
        key, value = raw_name.decode("latin-1"), raw_value.decode("latin-1")
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return Answer(response.status_code, response.reason.decode("latin-1"), headers, bytes(body))


def _check_length(response: h11.Response) -> None:
    for name, value in response.headers:
        if name == b"content-length" and int(value) > MAX_BODY_BYTES:
            raise BodyTooLarge(
                f"the answer's body ({int(value)} bytes) exceeds {MAX_BODY_BYTES} bytes"
            )


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


#: Our frames on the way from a request to asyncio's write (``_release_write_error``).
_EXCHANGE = Transport._exchange.__code__
_WRITE_PATH = frozenset({_Conn.send.__code__, _EXCHANGE})
