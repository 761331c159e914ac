"""The status PATCH sent from the event loop (kube.asyncpatch) against real sockets.

Two servers: the FakeApiServer through ``kube.Api`` (the same answers and
errors as the official client's path, with its faults), and a scripted
asyncio server for what the stand-in never does (chunked bodies,
``Connection: close``, closing an idle keep-alive connection, a 401 after a
token rotation, no answer at all). TLS against a real kube-apiserver is the
interop suite's (``tests/interop/test_interop_sidecar.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import os
import pathlib
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import kubernetes.client
import pytest

from kubelet_dra import errors
from kubelet_dra.kube import api as kube_api
from kubelet_dra.kube import asyncpatch
from kubelet_dra.testing import eventually, fakeapi
from tests.interop import _apiserver

STATUS = r"/pods/p1/status$"


def _ops(pod: dict[str, Any], value: str) -> list[dict[str, Any]]:
    return [
        {"op": "test", "path": "/metadata/uid", "value": pod["metadata"]["uid"]},
        {"op": "add", "path": "/status/message", "value": value},
    ]


@contextlib.asynccontextmanager
async def _api(server: fakeapi.FakeApiServer) -> AsyncIterator[kube_api.Api]:
    client = server.api_client()
    api = kube_api.Api(client)
    try:
        yield api
    finally:
        await api.aclose()
        client.close()


# -- against the API stand-in: the same answers and errors as the urllib3 path --------


async def test_patch_answers_as_the_official_client_does() -> None:
    with fakeapi.FakeApiServer() as server:
        pod = server.create_pod(fakeapi.make_pod("p1", "node-1"))
        async with _api(server) as api:
            fast = await api.json_patch_pod_status_async("default", "p1", _ops(pod, "a"))
            slow = await asyncio.to_thread(
                api.json_patch_pod_status, "default", "p1", _ops(pod, "b")
            )
            assert fast["status"]["message"] == "a"
            assert slow["status"]["message"] == "b"
            assert set(fast) == set(slow)
            [first, second] = [r for r in server.requests if r.method == "PATCH"]
            # The same request on the wire: path, query, content type and body.
            assert (first.path, first.query, first.content_type) == (
                second.path, second.query, second.content_type,
            )  # fmt: skip
            assert first.query == {"fieldManager": kube_api.FIELD_MANAGER}
            assert first.body == _ops(pod, "a")
            assert api.calls == 2


@pytest.mark.parametrize(
    ("code", "expected", "transient"),
    [(404, errors.PodGone, False), (409, kube_api.CallError, False),
     (422, kube_api.CallError, False), (503, kube_api.CallError, True)],
)  # fmt: skip
async def test_refusals_become_the_same_errors(
    code: int, expected: type[errors.ApiError], transient: bool
) -> None:
    with fakeapi.FakeApiServer() as server:
        pod = server.create_pod(fakeapi.make_pod("p1", "node-1"))
        async with _api(server) as api:
            caught = []
            for send in (
                lambda: api.json_patch_pod_status_async("default", "p1", _ops(pod, "a")),
                lambda: asyncio.to_thread(
                    api.json_patch_pod_status, "default", "p1", _ops(pod, "a")
                ),
            ):
                server.fail("PATCH", STATUS, code=code)
                with pytest.raises(expected) as info:
                    await send()
                caught.append(info.value)
            fast, slow = caught
            assert type(fast) is type(slow)
            assert fast.status == slow.status == code
            assert str(fast) == str(slow)
            assert kube_api.is_transient(fast) is transient


async def test_retry_after_and_lost_connections_are_kept() -> None:
    with fakeapi.FakeApiServer() as server:
        pod = server.create_pod(fakeapi.make_pod("p1", "node-1"))
        async with _api(server) as api:
            server.fail("PATCH", STATUS, code=429, retry_after=7)
            with pytest.raises(kube_api.CallError) as info:
                await api.json_patch_pod_status_async("default", "p1", _ops(pod, "a"))
            assert info.value.status == 429 and info.value.retry_after == 7.0
            # A kept-alive connection closed without an answer is tried once more on
            # a fresh one (as an idle connection the server closed); a second loss is
            # the caller's, a transient CallError.
            server.drop_connection("PATCH", STATUS, times=2)
            with pytest.raises(kube_api.CallError) as lost:
                await api.json_patch_pod_status_async("default", "p1", _ops(pod, "a"))
            assert lost.value.status is None and kube_api.is_transient(lost.value)
            assert server.count("PATCH", STATUS) == 3  # 429, then the two dropped
            await api.json_patch_pod_status_async("default", "p1", _ops(pod, "b"))  # kept alive
            server.drop_connection("PATCH", STATUS, times=1)
            answer = await api.json_patch_pod_status_async("default", "p1", _ops(pod, "b"))
            assert answer["status"]["message"] == "b"  # the fresh connection's answer
            await api.aclose()
            server.drop_connection("PATCH", STATUS, times=1)
            with pytest.raises(kube_api.CallError):  # a fresh connection is not tried twice
                await api.json_patch_pod_status_async("default", "p1", _ops(pod, "c"))


async def test_a_proxy_keeps_the_urllib3_path() -> None:
    config = kubernetes.client.Configuration()
    config.host = "https://10.0.0.1:6443"
    config.proxy = "http://proxy.example:3128"
    assert asyncpatch.endpoint_of(config) is None
    config.no_proxy = "10.0.0.1"
    endpoint = asyncpatch.endpoint_of(config)
    assert endpoint is not None and (endpoint.host, endpoint.port) == ("10.0.0.1", 6443)


def test_endpoint_keeps_the_host_path_prefix_and_tls_settings() -> None:
    config = kubernetes.client.Configuration()
    config.host = "https://api.example:8443/k8s/clusters/c-1/"
    config.verify_ssl = True
    config.tls_server_name = "kubernetes.default"
    endpoint = asyncpatch.endpoint_of(config)
    assert endpoint is not None and endpoint.ssl is not None
    assert endpoint.prefix == "/k8s/clusters/c-1"
    assert endpoint.server_hostname == "kubernetes.default"
    assert endpoint.ssl.check_hostname
    config.verify_ssl = False
    insecure = asyncpatch.endpoint_of(config)
    assert insecure is not None and insecure.ssl is not None
    assert not insecure.ssl.check_hostname


# -- against a scripted server: the HTTP/1.1 corners ----------------------------------

Handler = Callable[[int, bytes, asyncio.StreamWriter], Awaitable[bool]]
"""(connection number, request head, writer) -> keep the connection open."""


@dataclasses.dataclass(frozen=True)
class Wire:
    """How the scripted server is reached: plain TCP, or TLS with the client checking the
    server's certificate and name (the transport's own TLS layer, ``asyncpatch._Tls``)."""

    server: ssl.SSLContext | None = None
    client: ssl.SSLContext | None = None


def _tls_wire(pki: dict[str, pathlib.Path]) -> Wire:
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(pki["serving.crt"], pki["serving.key"])
    return Wire(server, ssl.create_default_context(cafile=str(pki["ca.crt"])))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    return _apiserver.make_certificates(tmp_path_factory.mktemp("pki"))


@pytest.fixture(params=["tcp", "tls"])
def wire(request: pytest.FixtureRequest, pki: dict[str, pathlib.Path]) -> Wire:
    """Each scripted test runs over TCP and over TLS."""
    return Wire() if request.param == "tcp" else _tls_wire(pki)


class Scripted:
    """An HTTP/1.1 server on a real socket whose answers a test writes."""

    def __init__(self, handler: Handler, wire: Wire | None = None) -> None:
        self.handler = handler
        self.wire = wire or Wire()
        self.connections = 0
        self.ended = 0  # connections the client closed
        self.heads: list[bytes] = []
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> Scripted:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.wire.server)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        await self._server.wait_closed()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    def transport(
        self, headers: Callable[[], dict[str, str]] | None = None, **kwargs: Any
    ) -> asyncpatch.Transport:
        name = "127.0.0.1" if self.wire.client is not None else None
        endpoint = asyncpatch.Endpoint("127.0.0.1", self.port, self.wire.client, name, "")
        make = headers or (lambda: {"Authorization": "Bearer t"})
        return asyncpatch.Transport(endpoint, lambda *_: make(), timeout=(1.0, 0.2), **kwargs)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        self._writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                self.heads.append(head)
                if not await self.handler(number, head, writer):
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            self.ended += 1
            writer.close()


def _answer(status: str, body: bytes, *headers: str) -> bytes:
    head = [f"HTTP/1.1 {status}", *headers, "", ""]
    return "\r\n".join(head).encode() + body


async def _request(transport: asyncpatch.Transport) -> asyncpatch.Answer:
    return await transport.request("PATCH", "/api/v1/x", "a=b", b"[]", kube_api.JSON_PATCH)


async def test_chunked_answers_on_one_keep_alive_connection(wire: Wire) -> None:
    async def handler(number: int, head: bytes, writer: asyncio.StreamWriter) -> bool:
        body = json.dumps({"n": len(scripted.heads)}).encode()
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:3], body[3:]))
        writer.write(_answer("200 OK", chunks + b"0\r\n\r\n", "Transfer-Encoding: chunked"))
        return True

    async with Scripted(handler, wire) as scripted:
        port = scripted.port
        transport = scripted.transport()
        try:
            answers = [await _request(transport) for _ in range(3)]
        finally:
            await transport.aclose()
    assert [json.loads(a.body) for a in answers] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert scripted.connections == 1
    head = scripted.heads[0].decode()
    assert head.startswith("PATCH /api/v1/x?a=b HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{port}\r\n" in head
    assert "Authorization: Bearer t\r\n" in head and "Content-Length: 2\r\n" in head


async def test_connection_close_and_a_closed_idle_connection_open_a_new_one(wire: Wire) -> None:
    async def handler(number: int, head: bytes, writer: asyncio.StreamWriter) -> bool:
        if number == 1:
            writer.write(_answer("200 OK", b"{}", "Content-Length: 2", "Connection: close"))
            return False
        writer.write(_answer("200 OK", b"{}", "Content-Length: 2"))
        return number != 2  # the second connection is closed after answering, silently

    async with Scripted(handler, wire) as scripted:
        transport = scripted.transport()
        try:
            for _ in range(3):
                assert (await _request(transport)).status == 200
                await asyncio.sleep(0)  # let a close reach us, as it would while idle
        finally:
            await transport.aclose()
    assert scripted.connections == 3


async def test_a_401_asks_for_the_headers_again_once(wire: Wire) -> None:
    tokens = iter(["old", "new", "newer"])

    async def handler(number: int, head: bytes, writer: asyncio.StreamWriter) -> bool:
        ok = b"Authorization: Bearer new\r\n" in head
        status = "200 OK" if ok else "401 Unauthorized"
        writer.write(_answer(status, b"{}", "Content-Length: 2"))
        return True

    async with Scripted(handler, wire) as scripted:
        transport = scripted.transport(lambda: {"Authorization": f"Bearer {next(tokens)}"})
        try:
            assert (await _request(transport)).status == 200
            assert (await _request(transport)).status == 200  # the new headers are kept
        finally:
            await transport.aclose()
    assert len(scripted.heads) == 3


async def test_no_answer_is_a_transport_error_and_the_connection_is_dropped(wire: Wire) -> None:
    async def handler(number: int, head: bytes, writer: asyncio.StreamWriter) -> bool:
        if number == 1:
            return True  # never answers
        writer.write(_answer("204 No Content", b""))
        return True

    async with Scripted(handler, wire) as scripted:
        transport = scripted.transport()
        try:
            with pytest.raises(asyncpatch.TransportError, match="no answer"):
                await _request(transport)
            assert (await _request(transport)).status == 204
        finally:
            await transport.aclose()
    assert scripted.connections == 2


async def test_garbage_is_a_transport_error(wire: Wire) -> None:
    async def handler(number: int, head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        return True

    async with Scripted(handler, wire) as scripted:
        transport = scripted.transport()
        try:
            with pytest.raises(asyncpatch.TransportError, match=r"not an HTTP/1\.1 answer"):
                await _request(transport)
        finally:
            await transport.aclose()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_body_over_the_cap_is_a_clear_error_and_the_next_request_works(
    chunked: bool, monkeypatch: pytest.MonkeyPatch, wire: Wire
) -> None:
    monkeypatch.setattr(asyncpatch, "MAX_BODY_BYTES", 1000)
    big = b"x" * 1001

    async def handler(number: int, head: bytes, writer: asyncio.StreamWriter) -> bool:
        if number == 1 and chunked:
            parts = b"".join(b"%x\r\n%s\r\n" % (100, big[i : i + 100]) for i in range(0, 1000, 100))
            writer.write(
                _answer("200 OK", parts + b"1\r\nx\r\n0\r\n\r\n", "Transfer-Encoding: chunked")
            )
        elif number == 1:
            writer.write(_answer("200 OK", big, f"Content-Length: {len(big)}"))
        else:
            writer.write(_answer("200 OK", b"{}", "Content-Length: 2"))
        return True

    async with Scripted(handler, wire) as scripted:
        transport = scripted.transport()
        try:
            with pytest.raises(asyncpatch.BodyTooLarge, match="exceeds 1000 bytes"):
                await _request(transport)
            assert (await _request(transport)).body == b"{}"  # on a new connection
        finally:
            await transport.aclose()
    assert scripted.connections == 2


def _answer_when(count: int) -> Handler:
    """A handler that holds every answer until ``count`` requests have arrived: that
    many requests in flight at once, each on a connection of its own."""
    arrived = asyncio.Event()
    seen = 0

    async def handler(number: int, head: bytes, writer: asyncio.StreamWriter) -> bool:
        nonlocal seen
        seen += 1
        if seen >= count:
            arrived.set()
        await arrived.wait()
        writer.write(_answer("200 OK", b"{}", "Content-Length: 2"))
        return True

    return handler


async def test_connections_idle_past_the_idle_timeout_are_closed_the_newest_kept(
    wire: Wire,
) -> None:
    # A burst of 4 concurrent writes leaves 4 connections, each holding OpenSSL's state
    # over TLS in production: they must not stay for the process's life.
    now = [0.0]
    async with Scripted(_answer_when(4), wire) as scripted:
        transport = scripted.transport(clock=lambda: now[0], idle_timeout=90.0)
        try:
            await asyncio.gather(*(_request(transport) for _ in range(4)))
            assert (transport.idle, transport.opened, transport.closed_idle) == (4, 4, 0)
            now[0] = 89.0  # one write: the newest connection is reused, none expired
            await _request(transport)
            assert (transport.idle, transport.opened, transport.closed_idle) == (4, 4, 0)
            now[0] = 100.0  # three idle since 0, one since 89: the three are closed
            await _request(transport)
            assert (transport.idle, transport.opened, transport.closed_idle) == (1, 4, 3)
            await eventually(lambda: scripted.ended == 3)
            assert scripted.connections == 4  # the write went on the kept one
            now[0] = 189.9  # parked again at 100: not yet
            assert transport.close_expired() == 0
            now[0] = 190.0
            assert transport.close_expired() == 1 and transport.idle == 0
        finally:
            await transport.aclose()


async def test_the_pool_counts_each_connection_while_it_is_open(wire: Wire) -> None:
    # kubelet_dra_status_patch_connections: the soak tells a pool that filled from a leak
    # by it, so every way a connection ends must take it off, once.
    async def handler(number: int, head: bytes, writer: asyncio.StreamWriter) -> bool:
        if number == 3:
            return True  # never answers: the request times out and the connection is dropped
        close = ("Connection: close",) if number == 4 else ()
        writer.write(_answer("200 OK", b"{}", "Content-Length: 2", *close))
        return True

    async with Scripted(_answer_when(2), wire) as busy:
        transport = busy.transport()
        try:
            first = asyncio.ensure_future(_request(transport))
            await eventually(lambda: transport.open == 1)  # carrying a request, not idle
            assert transport.counts() == asyncpatch.PoolCounts(open=1, idle=0, opened=1)
            await asyncio.gather(first, _request(transport))
            assert transport.counts() == asyncpatch.PoolCounts(open=2, idle=2, opened=2)
        finally:
            await transport.aclose()
        assert transport.counts() == asyncpatch.PoolCounts(open=0, idle=0, opened=2)
    async with Scripted(handler, wire) as scripted:
        transport = scripted.transport()
        try:
            await asyncio.gather(_request(transport), _request(transport))  # conns 1 and 2
            with pytest.raises(asyncpatch.TransportError, match="no answer"):
                await asyncio.gather(*(_request(transport) for _ in range(3)))  # 3rd: new
            await asyncio.sleep(0.3)  # the two others answered on 1 and 2
            assert transport.counts() == asyncpatch.PoolCounts(open=2, idle=2, opened=3)
            for conn in transport._idle:
                conn.writer.close()  # gone while idle: the pool drops it when taking it
            await _request(transport)  # conn 4: answered with Connection: close
            assert transport.counts() == asyncpatch.PoolCounts(open=0, idle=0, opened=4)
        finally:
            await transport.aclose()


async def test_idle_connections_are_closed_by_a_timer_when_no_write_comes(wire: Wire) -> None:
    # A node whose devices stop changing sends nothing more: the timer closes the pool.
    async with Scripted(_answer_when(3), wire) as scripted:
        transport = scripted.transport(idle_timeout=0.05)
        try:
            await asyncio.gather(*(_request(transport) for _ in range(3)))
            await eventually(lambda: transport.idle == 0 and scripted.ended == 3)
            assert transport.closed_idle == 3
            # And the pool works after it: a new connection.
            assert (await _request(transport)).status == 200
            assert transport.opened == 4
        finally:
            await transport.aclose()


# -- TLS: the transport's own layer (asyncpatch._Tls) ----------------------------------


async def test_a_certificate_the_context_refuses_fails_the_connect_and_leaves_nothing_open(
    pki: dict[str, pathlib.Path],
) -> None:
    ok = _tls_wire(pki)
    stranger = ssl.create_default_context()  # the system's CAs: not the server's
    async with Scripted(_answer_when(1), Wire(ok.server, stranger)) as scripted:
        transport = scripted.transport()
        try:
            fds = len(os.listdir("/proc/self/fd"))
            with pytest.raises(asyncpatch.TransportError, match=r"cannot connect.*CERTIFICATE"):
                await _request(transport)
            assert transport.counts() == asyncpatch.PoolCounts(open=0, idle=0, opened=0)
            # The TCP connection made before the handshake is closed, not left to the GC.
            await eventually(lambda: len(os.listdir("/proc/self/fd")) == fds)
        finally:
            await transport.aclose()
    async with Scripted(_answer_when(1), ok) as scripted:  # the name must match too
        endpoint = asyncpatch.Endpoint("127.0.0.1", scripted.port, ok.client, "api.example", "")
        transport = asyncpatch.Transport(endpoint, lambda *_: {}, timeout=(1.0, 0.2))
        try:
            with pytest.raises(asyncpatch.TransportError, match=r"cannot connect.*api\.example"):
                await _request(transport)
        finally:
            await transport.aclose()


async def test_a_server_that_closes_in_the_handshake_is_a_transport_error() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        record = await reader.readexactly(5)  # the ClientHello's record, then a close
        await reader.readexactly(int.from_bytes(record[3:5], "big"))
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    endpoint = asyncpatch.Endpoint("127.0.0.1", port, ssl.create_default_context(), "x", "")
    transport = asyncpatch.Transport(endpoint, lambda *_: {}, timeout=(1.0, 0.2))
    try:
        with pytest.raises(asyncpatch.TransportError, match="closed the connection in the hand"):
            await _request(transport)
        assert transport.open == 0
    finally:
        await transport.aclose()
        server.close()
        await server.wait_closed()


async def test_a_body_of_many_tls_records_arrives_whole(pki: dict[str, pathlib.Path]) -> None:
    big = bytes(range(256)) * 1200  # 300 KB: about 19 records of 16 KiB

    async def handler(number: int, head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(_answer("200 OK", big, f"Content-Length: {len(big)}"))
        return True

    async with Scripted(handler, _tls_wire(pki)) as scripted:
        transport = scripted.transport()
        try:
            for _ in range(2):
                assert (await _request(transport)).body == big
        finally:
            await transport.aclose()
    assert scripted.connections == 1


async def test_a_failed_tls_connection_leaves_no_openssl_state_to_the_garbage_collector(
    pki: dict[str, pathlib.Path],
) -> None:
    # A connection that fails sits in a reference cycle (its stream keeps the exception,
    # whose frames keep the connection) until a full collection, which a steady process
    # may not run for hours: what the cycle holds must be small (the soak's step).
    async def handler(number: int, head: bytes, writer: asyncio.StreamWriter) -> bool:
        # A reset after the request, no answer: a kube-apiserver going away mid-request.
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
        return False

    async with Scripted(handler, _tls_wire(pki)) as scripted:
        transport = scripted.transport()
        gc.collect()
        gc.disable()
        try:
            for _ in range(6):
                with pytest.raises(asyncpatch.TransportError):
                    await _request(transport)
            await asyncio.sleep(0.05)
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            kept = [o for o in gc.garbage if isinstance(o, (ssl.SSLObject, ssl.MemoryBIO))]
            assert kept == [], f"{len(kept)} TLS objects left to the collector"
            assert transport.open == 0
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
            await transport.aclose()
