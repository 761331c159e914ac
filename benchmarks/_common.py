"""Shared pieces of the benchmarks: statistics, tables, results, processes, clusters.

Every scenario returns a :class:`Outcome`: its tables (printed as markdown),
its summary rows (figure, floor or baseline, ratio, target, met) and the
correctness failures it found. A correctness failure fails the whole run (exit
1); a missed target is reported, not fatal: the numbers are the deliverable.

Clocks: durations inside one process use ``time.perf_counter``; anything that
crosses a process boundary (driver send, API arrival, sidecar exec) uses
``time.time``, the wall clock every process on the machine shares.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import pathlib
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

DRIVER = "gpu.example.com"
NODE = "node-1"
OTHER_NODE = "node-2"
POOL = "pool"


_ROOT = str(pathlib.Path(__file__).resolve().parent.parent)  # where ``benchmarks`` imports from


class CheckFailed(AssertionError):
    """A benchmark produced a wrong final state: the run fails."""


# -- statistics ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Spread:
    """Median with min and max over several runs (or samples)."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        data = sorted(values)
        if not data:
            return cls(float("nan"), float("nan"), float("nan"), 0)
        return cls(statistics.median(data), data[0], data[-1], len(data))

    def fmt(self, unit: str = "", digits: int = 3) -> str:
        low, high = _num(self.low, digits), _num(self.high, digits)
        return f"{_num(self.median, digits)}{unit} [{low}-{high}]"


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100)."""
    data = sorted(values)
    if not data:
        return float("nan")
    rank = max(1, min(len(data), round(q / 100 * len(data) + 0.5)))
    return data[rank - 1]


def _num(value: float, digits: int) -> str:
    if value != value:  # NaN
        return "n/a"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def num(value: float, digits: int = 3) -> str:
    return _num(value, digits)


# -- results -----------------------------------------------------------------


@dataclasses.dataclass
class SummaryRow:
    scenario: str
    figure: str
    floor: str
    ratio: str
    target: str
    met: bool | None  # None: report only
    #: The ratio as a number (what ``--compare`` compares) and which way is better:
    #: "lower" (a cost: latency, memory, requests) or "higher" (a rate); "" = not compared.
    value: float | None = None
    better: str = ""


@dataclasses.dataclass
class Outcome:
    name: str
    tables: list[str] = dataclasses.field(default_factory=list)
    summary: list[SummaryRow] = dataclasses.field(default_factory=list)
    failures: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    def table(self, title: str, headers: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
        self.tables.append(markdown_table(title, headers, rows))

    def check(self, ok: bool, message: str) -> None:
        if not ok:
            self.failures.append(message)


def markdown_table(title: str, headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    lines = [f"**{title}**", "", "| " + " | ".join(headers) + " |"]
    lines.append("|" + "|".join("---" for _ in headers) + "|")
    lines.extend("| " + " | ".join(str(c) for c in row) + " |" for row in rows)
    return "\n".join(lines)


def met_mark(met: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "—"}[met]


def machine() -> dict[str, str]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": str(os.cpu_count()),
        "cpu": model,
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


# -- temp dirs, ports, polling ------------------------------------------------------------


@contextlib.contextmanager
def short_tmpdir(prefix: str = "kdb") -> Iterator[pathlib.Path]:
    """A short directory under /tmp: unix socket paths are limited to 107 bytes."""
    path = pathlib.Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_until(
    predicate: Callable[[], object], *, timeout: float, what: str, interval: float = 0.005
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise CheckFailed(f"timed out after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(interval)


def vm_status(pid: int) -> dict[str, int]:
    """VmHWM, VmRSS (kB) of a process from /proc/<pid>/status."""
    found: dict[str, int] = {}
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            found[key] = int(value.split()[0])
    return found


def api_server() -> Any:
    """A FakeApiServer (its sockets send at once, TCP_NODELAY, as kube-apiserver's do)."""
    from kubelet_dra.testing import FakeApiServer

    return FakeApiServer()


# -- the cluster in the API stand-in ------------------------------------------------


def device_name(i: int) -> str:
    return f"dev-{i:06d}"


def resource_id(i: int) -> str:
    return f"{DRIVER}/{POOL}/{device_name(i)}"


def build_cluster(
    api: Any,
    *,
    pods: int,
    devices_per_pod: int,
    other_claims: int = 0,
    device_of: Callable[[int, int], int] | None = None,
) -> dict[str, list[int]]:
    """``pods`` pods on NODE, each with one claim of ``devices_per_pod`` devices.

    Returns pod name -> device indices. ``other_claims`` claims (with a pod
    each) live on OTHER_NODE in namespace ``elsewhere``: they must never be read.
    """
    from kubelet_dra.testing import make_claim, make_pod

    choose = device_of or (lambda p, k: p * devices_per_pod + k)
    layout: dict[str, list[int]] = {}
    for p in range(pods):
        devices = [choose(p, k) for k in range(devices_per_pod)]
        claim = f"claim-{p:04d}"
        api.create_claim(
            make_claim(claim, results=[(DRIVER, POOL, device_name(d), "gpu") for d in devices])
        )
        api.create_pod(make_pod(f"pod-{p:04d}", NODE, claims=[claim]))
        layout[f"pod-{p:04d}"] = devices
    for c in range(other_claims):
        claim = f"other-{c:05d}"
        api.create_claim(
            make_claim(
                claim,
                namespace="elsewhere",
                results=[(DRIVER, "far", f"far-{c}", "gpu")],
                node=OTHER_NODE,
            )
        )
        api.create_pod(make_pod(f"far-{c:05d}", OTHER_NODE, namespace="elsewhere", claims=[claim]))
    return layout


def health_entries(status_or_body: dict[str, Any]) -> dict[str, str]:
    """resourceID -> health in a pod status (or a status PATCH body's ``status``)."""
    found: dict[str, str] = {}
    for cs in status_or_body.get("containerStatuses") or ():
        for entry in cs.get("allocatedResourcesStatus") or ():
            for resource in entry.get("resources") or ():
                found[str(resource.get("resourceID"))] = str(resource.get("health"))
    return found


def written_health(body: Any) -> dict[str, str]:
    """resourceID -> health that a status write sets: a JSON patch (the writer's
    ops) or a merge-patch body with ``status``."""
    if isinstance(body, list):
        sets = [
            {"allocatedResourcesStatus": op["value"]}
            for op in body
            if op.get("op") in ("add", "replace")
            and op["path"].endswith("/allocatedResourcesStatus")
        ]
        return health_entries({"containerStatuses": sets})
    return health_entries((body or {}).get("status") or {})


def pods_match(api: Any, layout: dict[str, list[int]], expected: Callable[[int], str]) -> bool:
    """Every pod on the node shows exactly the expected health of each device."""
    for name, devices in layout.items():
        shown = health_entries(api.get_pod("default", name).get("status") or {})
        if shown != {resource_id(d): expected(d) for d in devices}:
            return False
    return True


def mismatches(api: Any, layout: dict[str, list[int]], expected: Callable[[int], str]) -> int:
    bad = 0
    for name, devices in layout.items():
        shown = health_entries(api.get_pod("default", name).get("status") or {})
        bad += sum(1 for d in devices if shown.get(resource_id(d)) != expected(d))
    return bad


def quiet_env() -> dict[str, str]:
    """The environment for child processes, without gRPC core's info logs."""
    env = dict(os.environ)
    env.setdefault("GRPC_VERBOSITY", "ERROR")
    return env


# -- the sidecar as a real process ---------------------------------------------------------


class SidecarProcess:
    """``python -m kubelet_dra run`` against the API stand-in; settings via environment."""

    def __init__(
        self, workdir: pathlib.Path, api: Any, *, registry: pathlib.Path, **settings: object
    ) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.state_dir = workdir / "state"
        kubeconfig = api.write_kubeconfig(workdir / "kubeconfig")
        self.env = quiet_env()
        self.env.update(
            {
                "NODE_NAME": NODE,
                "KUBECONFIG": str(kubeconfig),
                "KUBELET_DRA_PLUGINS_REGISTRY": str(registry),
                "KUBELET_DRA_STATE_DIR": str(self.state_dir),
                "KUBELET_DRA_METRICS_ADDRESS": f"127.0.0.1:{self.port}",
                "KUBELET_DRA_REGISTRY_POLL_INTERVAL": "0.05",
            }
        )
        for key, value in settings.items():
            self.env[f"KUBELET_DRA_{key.upper()}"] = str(value)
        self.proc: subprocess.Popen[bytes] | None = None
        self.exec_time = 0.0
        self.log = workdir / "sidecar.log"

    def start(self) -> SidecarProcess:
        self.exec_time = time.time()
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kubelet_dra", "run"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    def ready(self) -> bool:
        self._check_alive()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    async def wait_ready(self, timeout: float = 30.0) -> float:
        """Poll /readyz; return the wall time it first answered 200."""
        await wait_until(self.ready, timeout=timeout, what="sidecar /readyz")
        return time.time()

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-2000:]
            raise CheckFailed(f"sidecar exited with {self.proc.returncode}:\n{tail}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> SidecarProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- the benchmark driver as a process --------------------------------------------------


class DriverProcess:
    """``python -m benchmarks._driver``: pre-encoded health streams, JSON-lines control."""

    def __init__(
        self, workdir: pathlib.Path, *, devices: int, chunk: int = 100, lease: int = 3600
    ) -> None:
        self.registry = workdir / "reg"
        self.args = [
            sys.executable, "-m", "benchmarks._driver",
            "--registry", str(self.registry), "--name", DRIVER,
            "--devices", str(devices), "--chunk", str(chunk), "--lease", str(lease),
        ]  # fmt: skip
        self.proc: asyncio.subprocess.Process | None = None
        self.streams = 0
        self.dra_socket = ""
        self._events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> DriverProcess:
        self.proc = await asyncio.create_subprocess_exec(
            *self.args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=quiet_env(),
            cwd=_ROOT,
        )
        self._reader = asyncio.create_task(self._read())
        ready = await self.expect("ready", timeout=30)
        self.dra_socket = str(ready["dra_socket"])
        return self

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            event = json.loads(line)
            if event.get("event") == "stream":
                self.streams += 1
            await self._events.put(event)
        await self._events.put({"event": "exit"})

    async def expect(self, name: str, *, timeout: float = 60.0) -> dict[str, Any]:
        while True:
            event = await asyncio.wait_for(self._events.get(), timeout)
            if event["event"] == name:
                return event
            if event["event"] == "exit":
                raise CheckFailed(f"benchmark driver exited while waiting for {name}")

    async def send(self, op: str, **args: object) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}).encode() + b"\n")
        await self.proc.stdin.drain()

    async def wait_streams(self, count: int = 1, timeout: float = 30.0) -> None:
        await wait_until(lambda: self.streams >= count, timeout=timeout, what="a health stream")

    async def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.returncode is None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                await self.send("stop")
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)

    async def __aenter__(self) -> DriverProcess:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


# -- floors shared by the latency scenarios ------------------------------------------------


def patch_floor(api: Any, samples: int) -> list[float]:
    """One raw PATCH of a pod status (http.client, persistent connection): seconds from
    send to the API stand-in logging it, the same end point the pipeline is timed to."""
    from kubelet_dra.testing import make_pod

    api.create_pod(make_pod("floor-pod", "node-floor", namespace="floor"))
    uid = api.get_pod("floor", "floor-pod")["metadata"]["uid"]
    bodies = (
        json.dumps({
            "metadata": {"uid": uid},
            "status": {"conditions": [{
                "type": "DeviceHealthy", "status": "True" if k % 2 else "False",
                "reason": "Bench", "message": f"sample {k}",
            }]},
        })
        for k in range(samples)
    )  # fmt: skip
    return time_raw_patches(
        api, "floor-pod", "application/strategic-merge-patch+json", bodies, "raw PATCH"
    )


def time_raw_patches(
    api: Any, pod: str, content_type: str, bodies: Iterable[str], what: str
) -> list[float]:
    """Send each body as a PATCH of pod ``floor/<pod>``'s status on one persistent
    http.client connection: seconds from send to the API stand-in logging it."""
    import http.client

    host, port = api.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port))
    headers = {
        "Content-Type": content_type,
        "Authorization": f"Bearer {api.token}",
        "Accept": "application/json",
    }
    path = f"/api/v1/namespaces/floor/pods/{pod}/status?fieldManager=bench"
    found: list[float] = []
    try:
        for body in bodies:
            api.reset_log()
            sent = time.time()
            conn.request("PATCH", path, body, headers)
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                raise CheckFailed(f"{what} answered {response.status}")
            [record] = [r for r in api.requests if r.path.endswith(f"{pod}/status")]
            found.append(record.timestamp - sent)
    finally:
        conn.close()
        api.reset_log()
    return found


async def grpc_floor(workdir: pathlib.Path, samples: int) -> list[float]:
    """One health message over a unix socket: FakeDriver send to a bare client's receipt."""
    import grpc

    from kubelet_dra._proto.dra_health.v1 import api_pb2 as pb
    from kubelet_dra._proto.dra_health.v1 import api_pb2_grpc as pb_grpc
    from kubelet_dra.testing import FakeDriver

    received: asyncio.Queue[float] = asyncio.Queue()
    found: list[float] = []
    async with (
        FakeDriver(name="floor.example.com", registry=workdir / "floor-reg") as drv,
        grpc.aio.insecure_channel(f"unix:{drv.dra_socket}") as channel,
    ):
        call = pb_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            pb.NodeWatchResourcesRequest()
        )

        async def read() -> None:
            async for _response in call:
                received.put_nowait(time.time())

        reader = asyncio.create_task(read())
        await drv.wait_for_streams(1)
        for k in range(samples):
            health = "Healthy" if k % 2 else "Unhealthy"
            sent = time.time()
            await drv.set_health({"pool": POOL, "device": "d", "health": health})
            found.append(await asyncio.wait_for(received.get(), 5) - sent)
        call.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    return found
