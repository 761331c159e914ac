"""An HTTP fault proxy of ours in front of the real kube-apiserver, for the soak.

``tests/faults/_proxy.py`` is a TCP proxy that can only go down (connection
refused); the soak needs answers too, so this one terminates TLS with the API
server's own serving certificate (its CA is the sidecar's), reads each HTTP/1.1
request and either forwards it over its own TLS connection to the real server or
answers it with a fault:

- ``5xx``: ``503`` or ``500`` with a ``Status`` body;
- ``429``: ``429 Too Many Requests`` with ``Retry-After: 1`` (API Priority and Fairness);
- ``reset``: the connection reset (SO_LINGER 0) before the request is forwarded, or
  after it was (the server applied it, the client never hears);
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

FAULTS = ("5xx", "429", "reset", "stall")
_WRITES = (b"PATCH", b"PUT", b"POST", b"DELETE")


@dataclasses.dataclass(frozen=True)
class StatusWrite:
    at: float
    pod: str
    stored: dict[str, Any]
    #: Whether the request's body carried ``allocatedResourcesStatus``: beside a real
    #: kubelet the stored pod holds the kubelet's field too, which the sidecar did not send.
    sent_field: bool = True


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


@dataclasses.dataclass
class _Upstream:
    sock: ssl.SSLSocket
    reader: Any


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
        self._open: set[Any] = set()
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

    def _serve(self, raw: socket.socket) -> None:
        # Every socket and file of the connection is closed here, whatever ends it (a
        # file from makefile() keeps its socket open until both are closed).
        opened: list[Any] = [raw]
        upstream: _Upstream | None = None

        def server() -> _Upstream:
            nonlocal upstream
            if upstream is None:
                upstream = self._connect()
                opened.extend((upstream.sock, upstream.reader))
                with self._lock:
                    self._open.add(upstream.sock)
            return upstream

        try:
            raw.settimeout(30)
            conn = self._server_ctx.wrap_socket(raw, server_side=True)
            opened.append(conn)
            with self._lock:
                self._open.add(conn)
            conn.settimeout(None)
            reader = conn.makefile("rb")
            opened.append(reader)
            while not self._stopped.is_set():
                request = _read_request(reader)
                if request is None:
                    return
                self._one(conn, request, server)
        except (OSError, ssl.SSLError, _Closed, ValueError):
            return
        except Exception as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            for thing in reversed(opened):
                with contextlib.suppress(OSError):
                    thing.close()
            with self._lock:
                self._open.difference_update(opened)

    def _chosen(self) -> Window | None:
        with self._lock:
            window = self._window
            if window is None or time.monotonic() >= window.until:
                self._window = None
                return None
            if window.kind != "stall" and self._rng.random() >= window.rate:
                return None
            return window

    def _connect(self) -> _Upstream:
        sock = socket.create_connection(self.upstream, timeout=30)
        tls = self._client_ctx.wrap_socket(sock, server_hostname=self.upstream[0])
        tls.settimeout(None)
        return _Upstream(tls, tls.makefile("rb"))

    def _one(
        self, conn: ssl.SSLSocket, request: _Request, upstream: Callable[[], _Upstream]
    ) -> None:
        self.requests += 1
        window = self._chosen()
        after = False
        if window is not None:
            self.injected[window.kind] += 1
            if window.kind == "reset":
                after = self._rng.random() < 0.5
                if not after:
                    _reset(conn)
                    raise _Closed
            else:
                _answer_fault(conn, window)
                if window.kind == "stall":
                    raise _Closed
                return
        server = upstream()
        server.sock.sendall(request.raw)
        # A reset after forwarding: the server applies the request, its answer goes
        # nowhere (relayed, it could reach the client before the reset).
        send = _discard if after else conn.sendall
        status, head, body = _relay_response(server.reader, send, request, capture=request.captured)
        # Applied either way: a write whose answer the reset loses is in the stored pod's
        # history (the blip check reads it), and the writer must not take it for another's.
        self._record(request, status, head, body)
        if after:
            _reset(conn)
            raise _Closed

    def _record(self, request: _Request, status: int, head: bytes, body: bytes | None) -> None:
        if body is None:
            return
        if b"content-encoding: gzip" in head.lower():
            body = gzip.decompress(body)
        now = time.time()
        if 200 <= status < 300 and request.is_status_write:
            with contextlib.suppress(ValueError):
                stored = json.loads(body)
                name = request.path.split("?")[0].rstrip("/").rsplit("/", 2)[-2]
                sent = b"allocatedResourcesStatus" in request.body
                self.writes.append(StatusWrite(now, name, stored, sent))
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
    raw: bytes
    body: bytes

    @property
    def is_status_write(self) -> bool:
        return self.method in ("PATCH", "PUT") and self.path.split("?")[0].endswith("/status")

    @property
    def captured(self) -> bool:
        return self.method.encode() in _WRITES


def _read_head(reader: Any) -> tuple[list[bytes], dict[bytes, bytes]] | None:
    """A message's start line and headers as read (lines kept for relaying), and the
    headers by lower-cased name (the last one wins); ``None`` at end of stream."""
    lines: list[bytes] = []
    headers: dict[bytes, bytes] = {}
    while True:
        line = reader.readline(65537)
        if not line:
            return None
        lines.append(line)
        if len(lines) > 1 and line in (b"\r\n", b"\n"):
            return lines, headers
        if len(lines) > 1:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()


def _read_request(reader: Any) -> _Request | None:
    read = _read_head(reader)
    if read is None:
        return None
    head, headers = read
    if b"transfer-encoding" in headers:
        raise ValueError("chunked request bodies are not relayed")
    length = int(headers.get(b"content-length", b"0"))
    body = reader.read(length) if length else b""
    method, path, _ = head[0].decode("latin-1").split(" ", 2)
    return _Request(method, path, b"".join(head) + body, body)


def _relay_response(
    reader: Any, send: Callable[[bytes], object], request: _Request, *, capture: bool
) -> tuple[int, bytes, bytes | None]:
    """Copy one response from the upstream ``reader`` through ``send``; return its status,
    head and body (the body only when ``capture``, de-chunked)."""
    read = _read_head(reader)
    if read is None:
        raise _Closed
    head_lines, headers = read
    status = int(head_lines[0].split(b" ", 2)[1])
    length = int(headers[b"content-length"]) if b"content-length" in headers else None
    chunked = b"chunked" in headers.get(b"transfer-encoding", b"").lower()
    head = b"".join(head_lines)
    send(head)
    body = bytearray() if capture else None
    if request.method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return status, head, bytes(body) if body is not None else None
    if chunked:
        while True:
            size_line = reader.readline(65537)
            if not size_line:
                raise _Closed
            size = int(size_line.split(b";")[0].strip(), 16)
            data = reader.read(size + 2) if size else b""
            send(size_line + data)
            if body is not None:
                body += data[:-2]
            if size == 0:
                while (trailer := reader.readline(65537)) not in (b"\r\n", b"\n", b""):
                    send(trailer)
                send(b"\r\n")
                break
    elif length is not None:
        remaining = length
        while remaining:
            data = reader.read1(min(remaining, 65536))
            if not data:
                raise _Closed
            send(data)
            remaining -= len(data)
            if body is not None:
                body += data
    else:
        while data := reader.read1(65536):
            send(data)
        raise _Closed
    return status, head, bytes(body) if body is not None else None


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


def _answer_fault(conn: ssl.SSLSocket, window: Window) -> None:
    if window.kind == "stall":
        while time.monotonic() < window.until:
            time.sleep(0.1)
        return
    code, reason = (
        (429, "Too Many Requests") if window.kind == "429" else (503, "Service Unavailable")
    )
    status = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": f"soak fault proxy: {code}",
        "reason": "TooManyRequests" if code == 429 else "ServiceUnavailable",
        "code": code,
    }
    body = json.dumps(status).encode()
    extra = b"Retry-After: 1\r\n" if code == 429 else b""
    conn.sendall(
        f"HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\n".encode()
        + extra
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


def _discard(data: bytes) -> None:
    """Where an answer the client must never hear goes."""


def _reset(conn: ssl.SSLSocket) -> None:
    with contextlib.suppress(OSError):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        conn.close()
