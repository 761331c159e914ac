"""An HTTP fault proxy of ours in front of the real kube-apiserver, for the soak.

``tests/faults/_proxy.py`` is a TCP proxy that can only go down (connection
refused); the soak needs answers too, so this one terminates TLS with the API
server's own serving certificate (its CA is the sidecar's), reads each HTTP/1.1
request and either forwards it over its own TLS connection to the real server or
answers it with a fault. HTTP/1.1 on both sides is h11's (the sans-IO parser that
``kube.asyncpatch`` uses too): one ``h11.SERVER`` connection towards the sidecar, one
``h11.CLIENT`` connection per upstream socket, so framing (lengths, chunks, keep-alive)
is the library's and only the faults are ours. The faults:

- ``5xx``: ``503`` or ``500`` with a ``Status`` body;
- ``429``: ``429 Too Many Requests`` with ``Retry-After: 1`` (API Priority and Fairness);
- ``reset``: the connection reset (SO_LINGER 0) before the request is forwarded, or
  after it was (the server applied it and answered; the answer is dropped, the client
  never hears);
- ``stall``: the request read and never answered until the window ends, then the
  connection closed (a hung server or a black-holed connection).

During a window each request meets the fault with probability ``rate`` (a stall
takes every new request). Watches are relayed chunk by chunk as they stream.

It also records what the checks need from the sidecar's own traffic, as the
server answered it: every accepted pod status write with the pod the server
stored (the body of the answer: the same pod that ``tests/faults/_faults``'s
blip detector reads from the FakeApiServer's records), every write the server
refused as invalid (400, or 422 naming causes), and how many JSON patches it
could not apply (a failed ``test``: a conflict the writer handles).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import random
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h11

FAULTS = ("5xx", "429", "reset", "stall")
_WRITES = ("PATCH", "PUT", "POST", "DELETE")
_READ = 65536


@dataclasses.dataclass(frozen=True)
class StatusWrite:
    at: float
    pod: str
    stored: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Refused:
    at: float
    method: str
    path: str
    status: int
    body: str
    request: str


@dataclasses.dataclass
class Window:
    kind: str
    rate: float
    until: float


class _Closed(Exception):
    pass


class _Peer:
    """One socket and its h11 connection: events in, events out."""

    def __init__(self, sock: socket.socket, role: type[h11.SERVER] | type[h11.CLIENT]) -> None:
        self.sock = sock
        self.http = h11.Connection(role)

    def next_event(self) -> Any:
        while True:
            event = self.http.next_event()
            if event is not h11.NEED_DATA:
                return event
            self.http.receive_data(self.sock.recv(_READ))

    def send(self, *events: Any) -> None:
        for event in events:
            data = self.http.send(event)
            if data:
                self.sock.sendall(data)

    def reusable(self) -> bool:
        """Both sides done with a keep-alive exchange: ready for the next one."""
        if self.http.our_state is h11.DONE and self.http.their_state is h11.DONE:
            self.http.start_next_cycle()
            return True
        return False


@dataclasses.dataclass
class _Response:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes | None  # kept for writes only


class FaultProxy:
    """TLS in, TLS out; ``fault(kind, seconds, rate)`` opens a window of faults."""

    def __init__(
        self, upstream: tuple[str, int], *, cert: Path, key: Path, ca: Path, seed: int
    ) -> None:
        self.upstream = upstream
        self._server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._server_ctx.load_cert_chain(str(cert), str(key))
        self._client_ctx = ssl.create_default_context(cafile=str(ca))
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._window: Window | None = None
        self.writes: list[StatusWrite] = []
        self.refused: list[Refused] = []
        self.injected: dict[str, int] = dict.fromkeys(FAULTS, 0)
        self.requests = 0
        self.test_failures = 0
        #: Bugs of the proxy itself (a soak with any fails: its traffic was not what it says).
        self.errors: list[str] = []
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port: int = self._listener.getsockname()[1]
        self._stopped = threading.Event()
        self._open: set[socket.socket] = set()
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def fault(self, kind: str, seconds: float, rate: float = 0.5) -> None:
        if kind not in FAULTS:
            raise ValueError(f"unknown fault {kind!r}")
        with self._lock:
            self._window = Window(kind, rate, time.monotonic() + seconds)

    def clear(self) -> None:
        with self._lock:
            self._window = None

    def stop(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        # Unblock every connection thread (a watch waits on the server): each closes its own.
        with self._lock:
            live = list(self._open)
        for sock in live:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    # -- connections ---------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                raw, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(
                target=self._serve, args=(raw,), name="proxy-conn", daemon=True
            ).start()

    @contextlib.contextmanager
    def _tracked(self, sock: socket.socket) -> Iterator[socket.socket]:
        """``sock`` closed on the way out whatever ends the connection, and reachable by
        :meth:`stop` meanwhile."""
        with self._lock:
            self._open.add(sock)
        try:
            yield sock
        finally:
            with self._lock:
                self._open.discard(sock)
            with contextlib.suppress(OSError):
                sock.close()

    def _serve(self, raw: socket.socket) -> None:
        with contextlib.ExitStack() as stack:
            upstream: _Peer | None = None

            def server() -> _Peer:
                nonlocal upstream
                if upstream is None:
                    upstream = _Peer(
                        stack.enter_context(self._tracked(self._connect())), h11.CLIENT
                    )
                return upstream

            def done_with_server() -> None:
                nonlocal upstream
                if upstream is not None and not upstream.reusable():
                    upstream.sock.close()  # the server ends it (Connection: close, a watch)
                    upstream = None

            try:
                stack.enter_context(self._tracked(raw))
                raw.settimeout(30)
                conn = stack.enter_context(
                    self._tracked(self._server_ctx.wrap_socket(raw, server_side=True))
                )
                conn.settimeout(None)
                client = _Peer(conn, h11.SERVER)
                while not self._stopped.is_set():
                    request = _read_request(client)
                    if request is None:
                        return
                    self._one(client, request, server)
                    done_with_server()
                    if not client.reusable():
                        return
            except (OSError, ssl.SSLError, _Closed, h11.ProtocolError):
                return
            except Exception as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def _chosen(self) -> Window | None:
        with self._lock:
            window = self._window
            if window is None or time.monotonic() >= window.until:
                self._window = None
                return None
            if window.kind != "stall" and self._rng.random() >= window.rate:
                return None
            return window

    def _connect(self) -> ssl.SSLSocket:
        sock = socket.create_connection(self.upstream, timeout=30)
        tls = self._client_ctx.wrap_socket(sock, server_hostname=self.upstream[0])
        tls.settimeout(None)
        return tls

    def _one(self, client: _Peer, request: _Request, upstream: Callable[[], _Peer]) -> None:
        self.requests += 1
        window = self._chosen()
        after = False
        if window is not None:
            self.injected[window.kind] += 1
            if window.kind == "reset":
                after = self._rng.random() < 0.5
                if not after:
                    _reset(client.sock)
                    raise _Closed
            else:
                _answer_fault(client, window)
                if window.kind == "stall":
                    raise _Closed
                return
        server = upstream()
        server.send(
            h11.Request(method=request.method, target=request.path, headers=request.headers)
        )
        if request.body:
            server.send(h11.Data(data=request.body))
        server.send(h11.EndOfMessage())
        # Reset after: the server applied the request; its answer goes nowhere.
        response = _relay_response(server, None if after else client, request)
        if after:
            _reset(client.sock)
            raise _Closed
        self._record(request, response)

    def _record(self, request: _Request, response: _Response) -> None:
        body = response.body
        if body is None:
            return
        if (b"content-encoding", b"gzip") in response.headers:
            body = gzip.decompress(body)
        now = time.time()
        status = response.status
        if 200 <= status < 300 and request.is_status_write:
            with contextlib.suppress(ValueError):
                stored = json.loads(body)
                name = request.path.split("?")[0].rstrip("/").rsplit("/", 2)[-2]
                self.writes.append(StatusWrite(now, name, stored))
        elif status == 422 and _patch_test_failed(body):
            # A JSON patch whose `test` failed: the pod changed under the writer (the
            # writer re-reads and plans again), not content the server found invalid.
            self.test_failures += 1
        elif status in (400, 422):
            self.refused.append(
                Refused(
                    now,
                    request.method,
                    request.path,
                    status,
                    body[:500].decode(errors="replace"),
                    request.body[:20000].decode(errors="replace"),
                )
            )


@dataclasses.dataclass
class _Request:
    method: str
    path: str
    headers: list[tuple[bytes, bytes]]
    body: bytes

    @property
    def is_status_write(self) -> bool:
        return self.method in ("PATCH", "PUT") and self.path.split("?")[0].endswith("/status")

    @property
    def captured(self) -> bool:
        return self.method in _WRITES


def _read_request(client: _Peer) -> _Request | None:
    """The next whole request from the sidecar (``None``: it closed the connection)."""
    event = client.next_event()
    if isinstance(event, h11.ConnectionClosed):
        return None
    if not isinstance(event, h11.Request):
        raise _Closed
    body = bytearray()
    while not isinstance(part := client.next_event(), h11.EndOfMessage):
        if not isinstance(part, h11.Data):
            raise _Closed
        body += part.data
    return _Request(
        event.method.decode("ascii"),
        event.target.decode("latin-1"),
        list(event.headers),
        bytes(body),
    )


def _relay_response(server: _Peer, client: _Peer | None, request: _Request) -> _Response:
    """Copy one response from ``server`` to ``client`` (``None``: drop it) as it streams; a
    watch's events pass one by one. The body is kept for writes only."""
    event = server.next_event()
    while isinstance(event, h11.InformationalResponse):
        event = server.next_event()
    if not isinstance(event, h11.Response):
        raise _Closed
    headers = [
        (name.lower(), value.lower() if name.lower() == b"content-encoding" else value)
        for name, value in event.headers
    ]
    if client is not None:
        client.send(
            h11.Response(
                status_code=event.status_code, headers=list(event.headers), reason=event.reason
            )
        )
    body = bytearray() if request.captured else None
    while not isinstance(part := server.next_event(), h11.EndOfMessage):
        if not isinstance(part, h11.Data):
            raise _Closed  # the server closed mid-body
        if client is not None:
            client.send(part)
        if body is not None:
            body += part.data
    if client is not None:
        client.send(h11.EndOfMessage())
    return _Response(event.status_code, headers, bytes(body) if body is not None else None)


def _patch_test_failed(body: bytes) -> bool:
    """Whether a 422 is the API server's answer to a JSON patch it could not apply.

    It answers a failed ``test`` (or a path that is not there) with a bare 422: reason
    ``Invalid``, the generic message and no details (``NewGenericServerResponse`` in
    its patch handler); content it refuses names the object and lists the causes.
    """
    try:
        status = json.loads(body)
    except ValueError:
        return False
    return status.get("reason") == "Invalid" and not status.get("details")


def _answer_fault(client: _Peer, window: Window) -> None:
    if window.kind == "stall":
        while time.monotonic() < window.until:
            time.sleep(0.1)
        return
    code = 429 if window.kind == "429" else 503
    status = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": f"soak fault proxy: {code}",
        "reason": "TooManyRequests" if code == 429 else "ServiceUnavailable",
        "code": code,
    }
    body = json.dumps(status).encode()
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    if code == 429:
        headers.append(("Retry-After", "1"))
    client.send(
        h11.Response(status_code=code, headers=headers), h11.Data(data=body), h11.EndOfMessage()
    )


def _reset(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        conn.close()
