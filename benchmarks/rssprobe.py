"""Where the RSS goes: repeat one kind of event N times and sample memory after each.

``python -m benchmarks.rssprobe KIND [--events N] [--warmup W] [--trim] [--tracemalloc]``

Not one of ``python -m benchmarks``'s scenarios and not a test: a probe for
``docs/memory.md`` (issue 22's RSS slope in the soak). After every event it
samples this process's ``VmRSS`` (and its parts ``RssAnon``, ``RssFile``,
``RssShmem``) and glibc's ``mallinfo2()`` (``uordblks``: bytes
in use in malloc's heaps; ``fordblks``: free bytes kept in them; ``hblkhd``:
bytes in mmapped chunks; ``arena``: the heaps' size), the threads' stacks (``stacks``,
resident bytes; ``threads`` is the count, printed in thousands), CPython's own small-object
allocator (``pyarenas``: its 1 MiB arenas, mmapped outside malloc;
``pyused``: bytes of live objects in them), optionally
``tracemalloc``'s traced total, and after the warm-up events prints the median
growth per event and the least-squares slope of each. ``--trim`` calls
``malloc_trim(0)`` before every sample (what ``kubelet_dra.memtrim`` does every
60 s), so what stays is not whole free pages. Every sample follows a ``gc.collect()``,
which frees what reference cycles hold; ``--keep-cycles`` leaves it out and turns the
automatic collector off, which counts them as a long-lived process does between its rare
full collections (a failed connection's cycle: the soak's step at a kube-apiserver
restart, ``docs/memory.md``). ``--mmap-threshold BYTES`` /
``--trim-threshold BYTES`` call ``mallopt(M_MMAP_THRESHOLD / M_TRIM_THRESHOLD)`` first,
which turns off glibc's dynamic adjustment of both; at the end the probe prints the mmap
threshold found by trial (:func:`mmap_threshold`).

Kinds, each isolating one thing the soak does:

- ``ssl-context``: ``ssl.create_default_context`` + a CA file, dropped;
- ``urllib3-context``: what urllib3 does per new TLS connection when it is given no
  context (``create_urllib3_context`` + ``load_verify_locations``), dropped;
- ``tls-connect``: one new TLS connection of the official ``ApiClient`` (its pool
  cleared, then one GET) to a local HTTPS server in a child process;
  ``--shared-ssl-context`` hands urllib3 one context for every connection;
- ``tls-fail-async`` / ``tls-fail-urllib3`` / ``tls-fail-api``: a request that fails, to a
  server in a child process that closes each connection (``--fail-when``: ``accept``,
  before the TLS handshake; ``handshake``, after it and the request, with no answer: what
  a restarting kube-apiserver does to a request in flight); through the status PATCH
  transport (``kube.asyncpatch``), the official ``ApiClient`` (urllib3, no retries), or
  ``kube.api.Api`` over that client (a claim GET, as the sidecar's reads, lists and
  Events go: the client's exception translated, its frames dropped);
- ``tls-hold-patch`` / ``tls-hold-asyncio``: one more idle keep-alive TLS connection
  kept, after one answered GET, to a local HTTPS server in a child process: through the
  status PATCH transport (its own TLS on memory BIOs), or asyncio's TLS streams, the
  floor it is compared with: the growth per event over ``--batch`` is one pooled
  connection's cost;
- ``apiclient``: an official ``ApiClient`` made and closed;
- ``grpc-channel``: a ``grpc.aio`` channel to a fake driver's unix socket, one
  ``NodeWatchResources`` response read, the channel closed;
- ``sqlite``: the health store opened and closed;
- ``driver-new`` / ``driver-same``: the real pipeline (``DRAHealthManager`` in this
  process, a FakeApiServer in a child) with a fake driver process that is
  SIGKILLed and restarted on a new socket / the same socket; an event ends when the
  driver's stream delivers again;
- ``driver-flood``: the same pipeline; the driver sends ``--flood-reports`` reports of
  ``--flood-devices`` devices (half unhealthy), then goes back to its 8 devices (the
  soak's driver flood);
- ``apiserver-restart``: the same pipeline against the interop suite's real etcd +
  kube-apiserver (TLS; its Go binaries must be cached), restarted per event; an event
  ends when the pod watch has relisted and the API answers again.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import itertools
import json
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIELDS = (
    "rss",
    "anon",
    "file",
    "shmem",
    "stacks",
    "threads",
    "uordblks",
    "fordblks",
    "hblkhd",
    "arena",
    "pyarenas",
    "pyused",
    "traced",
)


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def _libc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):
        return None


LIBC = _libc()


_STATUS = {"VmRSS:": "rss", "RssAnon:": "anon", "RssFile:": "file", "RssShmem:": "shmem"}


def rss() -> dict[str, int]:
    """``VmRSS`` and its three parts: anonymous, file-backed (mapped code and files, such
    as SQLite's ``-shm``) and shared memory."""
    out: dict[str, int] = {}
    with open("/proc/self/status") as status:
        for line in status:
            name, *rest = line.split()
            if name in _STATUS:
                out[_STATUS[name]] = int(rest[0]) * 1024
    return out


def stacks() -> dict[str, int]:
    """Resident bytes of the threads' stacks (anonymous 8 MiB mappings, glibc's default
    size, guard page apart) and the number of threads."""
    resident, size, anonymous = 0, 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()
            if "-" in head[0] and len(head) >= 5:  # a mapping's first line
                anonymous = len(head) == 5
            elif head[0] == "Size:":
                size = int(head[1])
            elif head[0] == "Rss:" and anonymous and 8180 <= size <= 8192:
                resident += int(head[1]) * 1024
    return {"stacks": resident, "threads": len(os.listdir("/proc/self/task")) * 1024}


def pymalloc() -> dict[str, int]:
    """CPython's small-object allocator: its 1 MiB arenas (``mmap``ed, outside malloc
    and so outside ``mallinfo2``) and the bytes of the blocks in use in them, read from
    ``sys._debugmallocstats()`` (which writes to the C stderr)."""
    with tempfile.TemporaryFile() as out:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(out.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode(errors="replace")
    found: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition("=")
        value = value.strip().replace(",", "")
        if not value.isdigit():
            continue
        if "bytes/arena" in name:
            found["pyarenas"] = int(value)
        elif name.startswith("# bytes in allocated blocks"):
            found["pyused"] = int(value)
    return found


def mmap_threshold() -> int:
    """glibc's mmap threshold now, found by trial: the smallest power of two from 64 KiB to
    64 MiB that ``malloc`` serves with its own ``mmap`` (``hblkhd`` grows), 0 if none.
    glibc raises it (up to 32 MiB) when an mmapped chunk bigger than it is freed, unless
    ``M_MMAP_THRESHOLD`` was set; this shows where it ended up. An upper bound: glibc
    mmaps only what its free heap (top included) cannot serve, and the trial's own
    freed chunk raises the dynamic threshold to its size."""
    if LIBC is None:
        return 0
    LIBC.malloc.restype = ctypes.c_void_p
    LIBC.malloc.argtypes = [ctypes.c_size_t]
    LIBC.free.argtypes = [ctypes.c_void_p]
    size = 64 * 1024
    while size <= 64 * 1024 * 1024:
        before = LIBC.mallinfo2().hblkhd
        block = LIBC.malloc(size - 64)
        mapped = LIBC.mallinfo2().hblkhd > before
        LIBC.free(block)
        if mapped:
            return size
        size *= 2
    return 0


def sample(*, trim: bool, collect: bool = True) -> dict[str, int]:
    if collect:
        gc.collect()
    if trim and LIBC is not None:
        LIBC.malloc_trim(0)
    out = rss()
    if LIBC is not None:
        info = LIBC.mallinfo2()
        for name in ("uordblks", "fordblks", "hblkhd", "arena"):
            out[name] = int(getattr(info, name))
    out.update(stacks())
    out.update(pymalloc())
    if tracemalloc.is_tracing():
        out["traced"] = tracemalloc.get_traced_memory()[0]
    return out


def slope(values: list[int]) -> float:
    n = len(values)
    if n < 2:
        return 0.0
    mean_x, mean_y = (n - 1) / 2, statistics.fmean(values)
    num = sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values))
    return num / sum((i - mean_x) ** 2 for i in range(n))


def summarize(samples: list[dict[str, int]], warmup: int) -> dict[str, dict[str, float]]:
    kept = samples[warmup:]
    out: dict[str, dict[str, float]] = {}
    for field in FIELDS:
        if field not in kept[0]:
            continue
        series = [s[field] for s in kept]
        steps = [b - a for a, b in itertools.pairwise(series)]
        out[field] = {
            "median_step": statistics.median(steps) if steps else 0.0,
            "slope": slope(series),
            "total": float(series[-1] - series[0]),
            "range": float(max(series) - min(series)),
        }
    return out


def print_summary(kind: str, ns: argparse.Namespace, summary: dict[str, dict[str, float]]) -> None:
    counted = ns.events - ns.warmup
    print(f"\n{kind}: {counted} events after {ns.warmup} warm-up (trim={ns.trim})")
    print("| field | median step (kB/event) | slope (kB/event) | total (kB) | max-min (kB) |")
    print("|---|---:|---:|---:|---:|")
    for field, row in summary.items():
        print(
            f"| {field} | {row['median_step'] / 1024:.1f} | {row['slope'] / 1024:.2f} "
            f"| {row['total'] / 1024:.0f} | {row['range'] / 1024:.0f} |"
        )


# -- helpers ------------------------------------------------------------------------------


@contextlib.contextmanager
def _tmpdir() -> Iterator[pathlib.Path]:
    path = pathlib.Path(tempfile.mkdtemp(prefix="rssp", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBELET_DRA_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _certificates(directory: pathlib.Path) -> dict[str, pathlib.Path]:
    from tests.interop._apiserver import make_certificates

    return make_certificates(directory)


_HTTPS_SERVER = """
import http.server, ssl, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = b'{"kind":"Status"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"""

_CLOSING_SERVER = """
import socket, ssl, sys, threading
when, cert, key = sys.argv[1:4]
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
srv = socket.create_server(("127.0.0.1", 0), backlog=512)
print(srv.getsockname()[1], flush=True)
def serve(conn):
    try:
        if when == "handshake":
            conn = context.wrap_socket(conn, server_side=True)
            conn.recv(65536)
    except OSError:
        pass
    conn.close()
while True:
    threading.Thread(target=serve, args=(srv.accept()[0],), daemon=True).start()
"""

_FAKE_API = """
import sys, time
from kubelet_dra.testing.fakeapi import FakeApiServer
api = FakeApiServer().start()
print(api.url, flush=True)
sys.stdin.read()
api.stop()
"""


def fake_api_client(url: str) -> Any:
    """An official ``ApiClient`` for the ``_FAKE_API`` child at ``url`` (its token)."""
    import kubernetes.client

    config = kubernetes.client.Configuration()
    config.host = url
    config.api_key = {"authorization": "fake-token"}
    config.api_key_prefix = {"authorization": "Bearer"}
    return kubernetes.client.ApiClient(config)


@contextlib.contextmanager
def _child(argv: list[str]) -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=_child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        yield proc, proc.stdout.readline().strip()
    finally:
        proc.kill()
        proc.wait()


class _Driver:
    """A fake driver process, as the soak starts it (``tests/soak/_parts.py``)."""

    def __init__(self, root: pathlib.Path, registry: pathlib.Path) -> None:
        self.root, self.registry = root, registry
        self.generation = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def plugin_dir(self) -> pathlib.Path:
        return self.root / f"p{self.generation}"

    def start(self, *, new_socket: bool) -> None:
        if new_socket:
            shutil.rmtree(self.plugin_dir, ignore_errors=True)
            self.generation += 1
        devices = [{"pool": "pool", "device": f"dev-{i}", "health": "Healthy"} for i in range(8)]
        argv = [
            sys.executable, "-m", "kubelet_dra", "fake-driver", "--name", "probe.example.com",
            "--registry", str(self.registry), "--plugin-dir", str(self.plugin_dir),
            "--control", str(self.root / "ctl.sock"), "--devices", json.dumps(devices),
            "--resend", "5",
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, env=_child_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line or json.loads(line).get("event") != "ready":
            raise RuntimeError(f"fake driver did not start: {line!r}")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self.proc = None


async def _until(check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("the event did not complete")
        await asyncio.sleep(0.05)


# -- the probes ---------------------------------------------------------------------------

Event = Callable[[], Awaitable[None]]


@contextlib.asynccontextmanager
async def micro(kind: str, ns: argparse.Namespace) -> AsyncIterator[Event]:
    with _tmpdir() as tmp:
        if kind in ("ssl-context", "urllib3-context", "tls-connect", *TLS_FAIL, *TLS_HOLD):
            certs = _certificates(tmp / "pki")
            ca = str(certs["ca.crt"])
        if kind == "ssl-context":
            import ssl

            async def event() -> None:
                for _ in range(ns.batch):
                    ssl.create_default_context(cafile=ca)

            yield event
        elif kind == "urllib3-context":
            import ssl

            from urllib3.util.ssl_ import create_urllib3_context

            async def event() -> None:
                for _ in range(ns.batch):
                    ctx = create_urllib3_context(cert_reqs=ssl.CERT_REQUIRED)
                    ctx.load_verify_locations(ca)

            yield event
        elif kind == "tls-connect":
            import kubernetes.client

            argv = [sys.executable, "-c", _HTTPS_SERVER, str(certs["serving.crt"])]
            argv.append(str(certs["serving.key"]))
            with _child(argv) as (_, port):
                config = kubernetes.client.Configuration()
                config.host = f"https://127.0.0.1:{port}"
                config.ssl_ca_cert = ca
                client = kubernetes.client.ApiClient(config)
                pool = client.rest_client.pool_manager
                if ns.shared_ssl_context:
                    import ssl

                    shared = ssl.create_default_context(cafile=ca)
                    pool.connection_pool_kw["ssl_context"] = shared

                async def event() -> None:
                    for _ in range(ns.batch):
                        pool.clear()
                        client.call_api("GET", config.host + "/version").read()

                yield event
                client.close()
        elif kind in TLS_HOLD:
            argv = [sys.executable, "-c", _HTTPS_SERVER, str(certs["serving.crt"])]
            argv.append(str(certs["serving.key"]))
            with _child(argv) as (_, port):
                async with _held_connections(kind, int(port), ca, ns.batch) as event:
                    yield event
        elif kind in TLS_FAIL:
            argv = [sys.executable, "-c", _CLOSING_SERVER, ns.fail_when]
            argv += [str(certs["serving.crt"]), str(certs["serving.key"])]
            with _child(argv) as (_, port):
                async with _failing_request(kind, int(port), ca, ns.batch) as event:
                    yield event
        elif kind == "apiclient":
            import kubernetes.client

            async def event() -> None:
                for _ in range(ns.batch):
                    config = kubernetes.client.Configuration()
                    config.host = "https://127.0.0.1:1"
                    kubernetes.client.ApiClient(config).close()

            yield event
        elif kind == "grpc-channel":
            import grpc

            from kubelet_dra.plugin import streams

            driver = _Driver(tmp, tmp / "reg")
            (tmp / "reg").mkdir()
            driver.start(new_socket=False)
            endpoint = f"unix:{driver.plugin_dir / 'dra.sock'}"

            async def event() -> None:
                for _ in range(ns.batch):
                    async with grpc.aio.insecure_channel(endpoint) as channel:
                        call = streams.open_watch(channel, "v1.DRAResourceHealth")
                        await call.read()
                        call.cancel()

            try:
                yield event
            finally:
                driver.kill()
        elif kind == "sqlite":
            from kubelet_dra.state import store

            async def event() -> None:
                for _ in range(ns.batch):
                    store.HealthStore.open(tmp / "state").close()

            yield event
        else:
            raise SystemExit(f"unknown kind {kind}")


@contextlib.asynccontextmanager
async def _held_connections(kind: str, port: int, ca: str, batch: int) -> AsyncIterator[Event]:
    """``batch`` more idle keep-alive TLS connections per event, each after one answered
    request, all kept to the end: the growth per event over ``batch`` is what one idle
    connection of a pool costs. ``tls-hold-patch``: the status-PATCH transport (one per
    connection, each made by ``Transport.from_client`` and keeping its one idle
    connection); ``tls-hold-asyncio``: asyncio's own TLS streams
    (``open_connection(ssl=...)``), the floor the transport is measured against."""
    import ssl

    import kubernetes.client

    from kubelet_dra.kube import asyncpatch

    config = kubernetes.client.Configuration()
    config.host, config.ssl_ca_cert = f"https://127.0.0.1:{port}", ca
    client = kubernetes.client.ApiClient(config)
    context = ssl.create_default_context(cafile=ca)
    request = b"GET /version HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    transports: list[asyncpatch.Transport] = []
    streams: list[asyncio.StreamWriter] = []

    async def by_transport() -> None:
        for _ in range(batch):
            made = asyncpatch.Transport.from_client(client, timeout=(5.0, 5.0))
            assert made is not None
            transports.append(made)
            answer = await made.request("GET", "/version", "", b"", "application/json")
            assert answer.status == 200 and made.idle == 1, answer

    async def by_asyncio() -> None:
        for _ in range(batch):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
            streams.append(writer)
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            await reader.readexactly(17)  # the body: {"kind":"Status"}

    try:
        yield by_transport if kind == "tls-hold-patch" else by_asyncio
    finally:
        for transport in transports:
            await transport.aclose()
        for writer in streams:
            writer.close()
        client.close()


@contextlib.asynccontextmanager
async def _failing_request(kind: str, port: int, ca: str, batch: int) -> AsyncIterator[Event]:
    """``batch`` requests to ``port`` that fail, through the status-PATCH transport as the
    sidecar builds it from the client (one for the process, as there) or through urllib3."""
    import kubernetes.client
    import urllib3.exceptions

    from kubelet_dra.kube import api as kube_api
    from kubelet_dra.kube import asyncpatch

    config = kubernetes.client.Configuration()
    config.host, config.ssl_ca_cert, config.retries = f"https://127.0.0.1:{port}", ca, 0
    client = kubernetes.client.ApiClient(config)
    transport = asyncpatch.Transport.from_client(client, timeout=(5.0, 5.0))
    assert transport is not None  # no proxy, no socket options

    async def by_asyncio() -> None:
        for _ in range(batch):
            with contextlib.suppress(asyncpatch.TransportError):
                await transport.request("PATCH", "/x", "", b"{}", "application/json")

    async def by_urllib3() -> None:
        for _ in range(batch):
            with contextlib.suppress(urllib3.exceptions.HTTPError):
                client.call_api("GET", config.host + "/version", _request_timeout=5)

    async def by_api() -> None:
        api = kube_api.Api(client, async_patch=False)
        for _ in range(batch):
            with contextlib.suppress(kube_api.CallError):
                api.get_claim("default", "probe")

    event: Event = {"tls-fail-async": by_asyncio, "tls-fail-urllib3": by_urllib3}.get(kind, by_api)
    try:
        yield event
    finally:
        await transport.aclose()
        client.close()


@contextlib.asynccontextmanager
async def pipeline(kind: str, ns: argparse.Namespace) -> AsyncIterator[Event]:
    from kubelet_dra.manager import DRAHealthManager
    from kubelet_dra.testing import make_settings

    with _tmpdir() as tmp, contextlib.ExitStack() as stack:
        server: Any = None
        if kind == "apiserver-restart":
            from tests.interop import _build
            from tests.interop._apiserver import start_kube_apiserver

            server = start_kube_apiserver(
                etcd_bin=_build.ensure("etcd"),
                apiserver_bin=_build.ensure("kube-apiserver"),
                workdir=tmp / "apiserver",
            )
            stack.callback(server.stop)
            client = server.api_client()
            _create_pods(client, ns.pods)
        else:
            _, url = stack.enter_context(_child([sys.executable, "-c", _FAKE_API]))
            client = fake_api_client(url)
        settings = make_settings(
            tmp,
            malloc_trim_interval=0,
            stream_backoff_initial=0.1,
            stream_backoff_max=0.5,
            registration_backoff_max=0.5,
        )
        driver = _Driver(tmp, settings.plugins_registry)
        driver.start(new_socket=False)
        stack.callback(driver.kill)
        manager = DRAHealthManager(settings, api_client=client)
        await manager.start()
        try:

            def delivered(since: int) -> Callable[[], bool]:
                def check() -> bool:
                    total = sum(s.reports for s in manager.plugins.endpoints.values())
                    return total > since

                return check

            await _until(delivered(0))
            relists = [0]
            pods = manager.pods
            relist = pods._relist

            async def counted() -> str:
                rv: str = await relist()
                relists[0] += 1
                return rv

            pods._relist = counted

            async def driver_event() -> None:
                await asyncio.to_thread(driver.kill)
                endpoint = str(driver.plugin_dir / "dra.sock")
                old = manager.plugins.endpoints.get(endpoint)
                seen = old.reports if old is not None else 0
                await asyncio.to_thread(driver.start, new_socket=kind == "driver-new")
                endpoint = str(driver.plugin_dir / "dra.sock")

                def again() -> bool:
                    status = manager.plugins.endpoints.get(endpoint)
                    if status is None or status.state != "streaming":
                        return False
                    return status is not old or status.reports > seen

                await _until(again)

            async def api_event() -> None:
                from tests.interop._controlplane import start_apiserver, stop_apiserver

                before = relists[0]
                await asyncio.to_thread(stop_apiserver, server)
                await asyncio.to_thread(start_apiserver, server)
                await _until(lambda: relists[0] > before, timeout=120.0)

            async def flood_event() -> None:
                from kubelet_dra.testing.fakedriver_control import FakeDriverClient

                endpoint = str(driver.plugin_dir / "dra.sock")
                status = manager.plugins.endpoints[endpoint]
                many = [
                    {"pool": "pool", "device": f"dev-{i}", "health": "Unhealthy" if i % 2 else
                     "Healthy", "message": f"flood {i}"}
                    for i in range(ns.flood_devices)
                ]  # fmt: skip
                async with FakeDriverClient(tmp / "ctl.sock") as control:
                    seen = status.reports
                    await control.request("set_health", devices=many, resend=5)
                    await control.request("push", times=ns.flood_reports - 1)
                    await _until(lambda: status.reports >= seen + ns.flood_reports)
                    few = many[:8]
                    seen = status.reports
                    await control.request("set_health", devices=few, resend=5)
                    await _until(lambda: status.reports > seen)

            events = {"apiserver-restart": api_event, "driver-flood": flood_event}
            yield events.get(kind, driver_event)
        finally:
            await manager.close()
            client.close()


def _create_pods(client: Any, count: int) -> None:
    """``count`` pods bound to node-1 (never run: there is no kubelet), for relists."""
    for i in range(count):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"probe-{i}", "namespace": "default",
                         "labels": {"app": "probe", "index": str(i)}},
            "spec": {"nodeName": "node-1",
                     "containers": [{"name": "c", "image": "registry.example/probe:1"}]},
        }  # fmt: skip
        client.call_api(
            "POST",
            client.configuration.host + "/api/v1/namespaces/default/pods",
            header_params={"Content-Type": "application/json"},
            body=pod,
        ).read()


TLS_FAIL = ("tls-fail-async", "tls-fail-urllib3", "tls-fail-api")
TLS_HOLD = ("tls-hold-patch", "tls-hold-asyncio")
MICRO = (
    "ssl-context", "urllib3-context", "tls-connect", *TLS_FAIL, *TLS_HOLD, "apiclient",
    "grpc-channel", "sqlite",
)  # fmt: skip
PIPELINE = ("driver-new", "driver-same", "driver-flood", "apiserver-restart")


async def run(ns: argparse.Namespace) -> list[dict[str, int]]:
    if ns.tracemalloc:
        tracemalloc.start()
    if ns.keep_cycles:
        gc.disable()
    probe = micro if ns.kind in MICRO else pipeline
    samples: list[dict[str, int]] = []
    async with probe(ns.kind, ns) as event:
        samples.append(sample(trim=ns.trim, collect=not ns.keep_cycles))
        for i in range(ns.events):
            await event()
            await asyncio.sleep(ns.settle)
            samples.append(sample(trim=ns.trim, collect=not ns.keep_cycles))
            if ns.verbose:
                row = samples[-1]
                print(i, " ".join(f"{k}={v / 1024:.0f}k" for k, v in row.items()), flush=True)
    return samples


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.rssprobe",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("kind", choices=MICRO + PIPELINE)
    parser.add_argument("--events", type=int, default=40, help="events (default 40)")
    parser.add_argument("--warmup", type=int, default=10, help="events not counted (default 10)")
    parser.add_argument(
        "--batch", type=int, default=10, help="micro kinds: repetitions per event (default 10)"
    )
    parser.add_argument(
        "--settle", type=float, default=0.0, help="seconds to wait after each event"
    )
    parser.add_argument(
        "--pods", type=int, default=30, help="apiserver-restart: pods on the node (default 30)"
    )
    parser.add_argument(
        "--flood-devices", type=int, default=500, help="driver-flood: devices per report"
    )
    parser.add_argument(
        "--flood-reports", type=int, default=200, help="driver-flood: reports per flood"
    )
    parser.add_argument("--trim", action="store_true", help="malloc_trim(0) before each sample")
    parser.add_argument(
        "--keep-cycles",
        action="store_true",
        help="no gc.collect() before each sample, and the automatic collector off: what "
        "reference cycles hold is counted, as in a process whose full collections are rare",
    )
    parser.add_argument("--tracemalloc", action="store_true", help="also sample traced memory")
    parser.add_argument(
        "--shared-ssl-context",
        action="store_true",
        help="tls-connect: one SSLContext for every connection",
    )
    parser.add_argument(
        "--fail-when",
        choices=("accept", "handshake"),
        default="handshake",
        help="tls-fail-*: the server closes at accept or after the handshake (default)",
    )
    parser.add_argument(
        "--arena-max",
        type=int,
        default=2,
        help="mallopt(M_ARENA_MAX) first, as the sidecar does (default 2; 0: glibc's own)",
    )
    parser.add_argument(
        "--mmap-threshold",
        type=int,
        default=0,
        help="mallopt(M_MMAP_THRESHOLD) first (bytes; default 0: glibc's dynamic threshold)",
    )
    parser.add_argument(
        "--trim-threshold",
        type=int,
        default=0,
        help="mallopt(M_TRIM_THRESHOLD) first (bytes; default 0: glibc's dynamic threshold)",
    )
    parser.add_argument("--json", help="write the samples and the summary to this file")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every sample")
    ns = parser.parse_args(argv)
    if ns.events <= ns.warmup + 1:
        parser.error("--events must exceed --warmup + 1")
    return ns


def main(argv: list[str] | None = None) -> int:
    ns = parse(argv)
    if ns.arena_max and LIBC is not None and "MALLOC_ARENA_MAX" not in os.environ:
        LIBC.mallopt(-8, ns.arena_max)  # M_ARENA_MAX, as kubelet_dra.memtrim.cap_arenas does
    if ns.mmap_threshold and LIBC is not None:
        LIBC.mallopt(-3, ns.mmap_threshold)  # M_MMAP_THRESHOLD: no dynamic adjustment
    if ns.trim_threshold and LIBC is not None:
        LIBC.mallopt(-1, ns.trim_threshold)  # M_TRIM_THRESHOLD
    started = time.monotonic(), time.process_time()
    samples = asyncio.run(run(ns))
    # Only at the end: the trial frees an mmapped chunk, which itself raises the threshold.
    print(f"mmap threshold (by trial) at the end: {mmap_threshold() >> 10} KiB")
    summary = summarize(samples, ns.warmup)
    print_summary(ns.kind, ns, summary)
    wall, cpu = time.monotonic() - started[0], time.process_time() - started[1]
    print(f"\nwall {wall:.1f} s, CPU of this process {cpu:.1f} s")
    if ns.json:
        out = {"kind": ns.kind, "args": vars(ns), "samples": samples, "summary": summary}
        pathlib.Path(ns.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
