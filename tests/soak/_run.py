"""The soak's conductor: start the parts, play the schedule, sample once a second, judge.

Parts (``tests/soak/_parts.py``): the real etcd and kube-apiserver of the interop suite
(``tests/interop/_apiserver.py``, the cached binaries of ``tests/interop/_build.py``;
restarted with ``tests/interop/_controlplane.py``), the fault proxy in front of it
(``_faultproxy.py``: the sidecar's kubeconfig points at it), 3 fake drivers of 8 devices
as processes, 30 pods in namespace ``soak`` on node ``soak-node``, and the sidecar;
with ``Options.kubelet`` also the real kubelet of that line on that node (``tests/e2e/_node.py``:
the upstream kubelet on the upstream fake CRI), which runs the pods, prepares their claims
through the drivers and writes their ``allocatedResourcesStatus`` itself, while the
sidecar writes its condition beside it.

Each part has a worker thread that runs its faults in order (a fault on one part waits
for the one before it; faults of different parts overlap); the main thread hands each
fault and health change to its part's worker at its time in the schedule, and a sampler
thread reads the pods, the sidecar's process and its ``/metrics`` every second.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import queue
import shutil
import signal
import tempfile
import threading
import time
import traceback
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlparse

from kubelet_dra.testing import make_claim, make_pod
from tests.e2e._node import Kubelet, KubeletSpec
from tests.interop import _build
from tests.interop._apiserver import KubeApiServer, free_port, start_kube_apiserver
from tests.interop._cluster import RealCluster
from tests.interop._controlplane import start_apiserver, stop_apiserver

from . import _checks as checks
from . import _parts as parts
from . import _schedule as plan
from ._faultproxy import FaultProxy

NAMESPACE = "soak"
#: The sidecar's metrics each sample reads. Without a kubelet the last two must stay 0: a
#: pod left to "the kubelet" loses its next change (a bug the soak found). Beside the
#: kubelet (gate on) the last must stay 0: that kubelet never removes the field.
SCRAPED = (
    "kubelet_dra_event_loop_tasks",
    "kubelet_dra_pending_pods",
    "kubelet_dra_kubelet_owned_pods",
    "kubelet_dra_kubelet_removes_field",
    "kubelet_dra_malloc_in_use_bytes",
    "kubelet_dra_malloc_free_bytes",
    "kubelet_dra_malloc_mmapped_bytes",
    "kubelet_dra_python_allocated_blocks",
    "kubelet_dra_status_patch_connections",
    "kubelet_dra_status_patch_idle_connections",
)
#: Pushes of the current report per flood tick, and ticks a second.
FLOOD_BATCH, FLOOD_TICKS = 50, 10
#: Seconds between snapshots of the sidecar's ``/proc/<pid>/smaps``.
SMAPS_EVERY = 60.0


@dataclasses.dataclass
class Options:
    minutes: float
    seed: int
    out: Path
    chart: bool = True
    #: The real kubelet's line (``"1.37"``) to run beside the sidecar, or ``None``.
    kubelet: str | None = None
    #: Environment variables for the sidecar alone (``--sidecar-env``).
    sidecar_env: dict[str, str] = dataclasses.field(default_factory=dict)


class _Worker:
    """Runs one part's actions in order, in its own thread; records failures."""

    def __init__(self, name: str, errors: list[str]) -> None:
        self.name = name
        self.errors = errors
        self.queue: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name=f"soak-{name}", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while (action := self.queue.get()) is not None:
            try:
                action()
            except Exception:
                self.errors.append(f"{self.name}: {traceback.format_exc(limit=3)}")

    def close(self) -> None:
        self.queue.put(None)


class Soak:
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.schedule = plan.make(opts.seed, opts.minutes, kubelet=opts.kubelet is not None)
        self.world = checks.World()
        self.errors: list[str] = []
        self.samples: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.t0 = 0.0
        self._stop = threading.Event()
        self._next_smaps = 0.0
        self._exit = contextlib.ExitStack()

    # -- set-up --------------------------------------------------------------------------

    def setup(self) -> None:
        out = self.opts.out
        out.mkdir(parents=True, exist_ok=True)
        (out / "schedule.json").write_text(json.dumps(self.schedule.to_json(), indent=1))
        self.server = self._apiserver(out)
        self.cluster = RealCluster(self.server)
        self._exit.callback(self.cluster.close)
        self.sockets = Path(tempfile.mkdtemp(prefix="kdra-soak-"))
        self._exit.callback(shutil.rmtree, self.sockets, ignore_errors=True)
        self.disk = parts.StateDisk(out / "state")
        self._exit.callback(self.disk.close)
        pki = self.server.workdir / "pki"
        url = urlparse(self.server.url)
        self.proxy = FaultProxy(
            (url.hostname or "127.0.0.1", url.port or 443),
            cert=pki / "serving.crt", key=pki / "serving.key", ca=self.server.ca_file,
            seed=self.opts.seed,
        )  # fmt: skip
        self._exit.callback(self.proxy.stop)
        self.kubelet = self._kubelet(out) if self.opts.kubelet else None
        registry = self.kubelet.registry if self.kubelet else self.sockets / "reg"
        if self.kubelet is None:
            self._pods()
        prepare = _prepare_claims()
        self.drivers = [
            parts.Driver(i, self.sockets, out, registry=registry, prepare=prepare[i])
            for i in range(plan.DRIVERS)
        ]
        for driver in self.drivers:
            self._exit.callback(driver.kill)
            driver.start(self.world.reports(driver.index))
        if self.kubelet is not None:
            # Pods after the kubelet took the drivers: it prepares their claims at once
            # rather than after a sync backoff.
            self._registered_with_kubelet()
            self._pods(bind=True)
        self.sidecar = parts.Sidecar(
            kubeconfig=self._kubeconfig(out / "sidecar.kubeconfig"),
            registry=registry, state_dir=self.disk.path,
            log=out / "sidecar.log", port=free_port(),
            kubelet_root=self.kubelet.root if self.kubelet else None,
            extra_env=self.opts.sidecar_env,
        )  # fmt: skip
        self._exit.callback(self.sidecar.signal, signal.SIGKILL)
        self._restart_sidecar()

    def _apiserver(self, out: Path) -> KubeApiServer:
        server = start_kube_apiserver(
            etcd_bin=_build.ensure("etcd"),
            apiserver_bin=_build.ensure("kube-apiserver"),
            workdir=out / "apiserver",
            timeout=300.0,  # a loaded 2-core machine (load 50 seen) takes minutes
            # The kubelet's identity: the Node authorizer applies to it as in a cluster.
            extra_users={f"system:node:{parts.NODE}": ("system:nodes",)},
        )
        self._exit.callback(server.stop)
        return server

    def _kubelet(self, out: Path) -> Kubelet:
        line = self.opts.kubelet
        assert line is not None
        # A short workdir: the drivers' registration sockets live under its root, and a
        # unix socket's path has at most 107 bytes.
        workdir = Path(tempfile.mkdtemp(prefix="kdra-soak-kl-"))
        kubelet = Kubelet(
            kubelet_bin=_build.ensure(f"kubelet-{line}"),
            fakecri_bin=_build.ensure("fakecri"),
            server=self.server,
            workdir=workdir,
            spec=KubeletSpec(line=line, gates=parts.KUBELET_GATES, node=parts.NODE),
        )

        def close() -> None:
            kubelet.stop()
            for name in ("kubelet.log", "fakecri.log"):
                with contextlib.suppress(OSError):
                    shutil.copyfile(workdir / name, out / name)
            shutil.rmtree(workdir, ignore_errors=True)

        self._exit.callback(close)
        kubelet.start(timeout=300.0)
        return kubelet

    def _registered_with_kubelet(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        for driver in self.drivers:
            while driver.request("calls")["calls"].get("NotifyRegistrationStatus", 0) < 1:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the kubelet never registered {driver.name}")
                time.sleep(0.2)

    def _kubeconfig(self, path: Path) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "soak",
                    "cluster": {
                        "server": self.proxy.url,
                        "certificate-authority": str(self.server.ca_file),
                    },
                }
            ],
            "users": [{"name": "soak", "user": {"token": self.server.admin_token}}],
            "contexts": [{"name": "soak", "context": {"cluster": "soak", "user": "soak"}}],
            "current-context": "soak",
        }
        path.write_text(json.dumps(config))
        path.chmod(0o600)
        return path

    def _pods(self, *, bind: bool = False) -> None:
        """Each pod and its claim, allocated and reserved for it.

        ``bind`` (beside a kubelet): as the scheduler would, the pod is created unbound
        with no status, its claim reserved for it, and only then bound to the node, so the
        kubelet sees it once its claim is ready, and writes its status itself.
        """
        for name, (driver, device) in checks.pod_devices().items():
            pod = make_pod(name, parts.NODE, namespace=NAMESPACE, claims=[f"{name}-gpu"])
            if bind:
                del pod["status"], pod["spec"]["nodeName"]
            created = self.cluster.create_pod(pod)
            result = (parts.driver_name(driver), parts.POOL, parts.device_name(device), "gpu")
            self.cluster.create_claim(
                make_claim(
                    f"{name}-gpu", NAMESPACE, [result], reserved_for=[created], node=parts.NODE
                )
            )
            if bind:
                binding = {
                    "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": parts.NODE},
                }  # fmt: skip
                self.cluster.core.create_namespaced_pod_binding(
                    name, NAMESPACE, cast(Any, binding), _preload_content=False
                )

    # -- reading -------------------------------------------------------------------------

    def list_pods(self) -> dict[str, dict[str, Any]] | None:
        try:
            answer = self.cluster.core.list_namespaced_pod(
                NAMESPACE, _preload_content=False, _request_timeout=5
            )
        except Exception:
            return None
        # _preload_content=False: the raw urllib3 answer, not the V1PodList of the stubs.
        items: list[dict[str, Any]] = json.loads(cast(Any, answer).data)["items"]
        return {p["metadata"]["name"]: p for p in items}

    def scrape(self) -> dict[str, float]:
        try:
            with urllib.request.urlopen(f"{self.sidecar.metrics_url}/metrics", timeout=2) as a:
                text = a.read().decode()
        except OSError:
            return {}
        found = {}
        for line in text.splitlines():
            for name in SCRAPED:
                if line.startswith(name + " "):
                    found[name] = float(line.split()[1])
        return found

    # -- the run -------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        print(self.schedule.table(), flush=True)
        try:
            self.setup()
            self._first_convergence()
            self.t0 = time.time()
            self.conv = checks.Convergence(self.world, self.t0, condition=self.beside_kubelet)
            # Beside a kubelet its own field is followed too, for comparison (not judged).
            self.kconv = checks.Convergence(self.world, self.t0) if self.kubelet else None
            sampler = threading.Thread(target=self._sampler, name="soak-sampler", daemon=True)
            sampler.start()
            self._play()
            final = self._final_convergence()
            self._stop.set()
            sampler.join(10)
            return self._judge(final)
        finally:
            self._exit.close()

    @property
    def beside_kubelet(self) -> bool:
        return self.opts.kubelet is not None

    def _first_convergence(self, timeout: float = 300.0) -> None:
        """Until every pod shows the drivers' first reports (beside a kubelet: in the
        sidecar's condition, every pod Running and the kubelet's field there too)."""
        ours = checks.Convergence(self.world, time.time(), condition=self.beside_kubelet)
        field = checks.Convergence(self.world, time.time())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pods = self.list_pods()
            if pods is not None and not ours.wrong(pods, time.time()):
                if not self.beside_kubelet:
                    return
                running = all(
                    (p.get("status") or {}).get("phase") == "Running" for p in pods.values()
                )
                if running and not field.wrong(pods, time.time()):
                    return
            time.sleep(0.5)
        raise RuntimeError("the pods never showed the drivers' first reports")

    def _final_convergence(self) -> dict[str, Any]:
        end = time.time()
        deadline = end + checks.BOUND
        wrong: dict[str, Any] = {}
        while time.time() < deadline:
            pods = self.list_pods()
            if pods is not None:
                wrong = self.conv.wrong(pods, time.time())
                if not wrong:
                    return {"converged_after": round(time.time() - end, 1), "wrong": {}}
            time.sleep(0.5)
        return {"converged_after": None, "wrong": {k: str(v) for k, v in wrong.items()}}

    def _play(self) -> None:
        names = plan.part_names(kubelet=self.beside_kubelet)
        workers = {name: _Worker(name, self.errors) for name in names}
        actions: list[tuple[float, str, Callable[[], None]]] = []
        for fault in self.schedule.faults:
            actions.append((fault.at, fault.part, self._fault_action(fault)))
        for change in self.schedule.changes:
            actions.append((change.at, f"driver-{change.driver}", self._change_action(change)))
        actions.sort(key=lambda a: a[0])
        for at, part, action in actions:
            delay = self.t0 + at - time.time()
            if delay > 0:
                time.sleep(delay)
            workers[part].queue.put(action)
        remaining = self.t0 + self.schedule.seconds - time.time()
        if remaining > 0:
            time.sleep(remaining)
        for worker in workers.values():
            worker.close()
        for worker in workers.values():
            worker.thread.join(300)

    def _change_action(self, change: plan.Change) -> Callable[[], None]:
        def act() -> None:
            self.world.say(change.driver, change.device, change.health, change.message, time.time())
            driver = self.drivers[change.driver]
            driver.request(
                "set_health", devices=self.world.reports(change.driver), resend=plan.RESEND
            )

        return act

    def _fault_action(self, fault: plan.Fault) -> Callable[[], None]:
        def act() -> None:
            # The two disk faults run on different workers (read-only restarts the
            # sidecar, so it is the sidecar's) but share one tmpfs: one waits for the
            # other, so a fill never meets a read-only disk and an unfill never fails
            # on one (seen on a loaded machine, where a restart outlasted the gap).
            # The fault's interval starts when it really starts.
            shared = self.disk.lock if fault.kind.startswith("disk-") else contextlib.nullcontext()
            with shared:
                interval = self.world.begin(fault.part, fault.kind, time.time())
                self.events.append(
                    {"at": time.time() - self.t0, "part": fault.part, "kind": fault.kind}
                )
                try:
                    self._apply(fault)
                finally:
                    self.world.end(interval, time.time())

        return act

    def _apply(self, fault: plan.Fault) -> None:
        kind, seconds = fault.kind, fault.seconds
        if kind.startswith("sidecar-"):
            sig = signal.SIGKILL if kind == "sidecar-sigkill" else signal.SIGTERM
            code = self.sidecar.signal(sig)
            if sig == signal.SIGTERM and code != 0:
                self.errors.append(f"sidecar exited {code} on SIGTERM")
            time.sleep(seconds)
            self._restart_sidecar()
        elif kind.startswith("driver-sigkill"):
            index = int(fault.part.split("-")[1])
            driver = self.drivers[index]
            driver.kill()
            self.world.driver_down(index, time.time())
            time.sleep(seconds)
            driver.start(self.world.reports(index), new_socket=kind.endswith("new-socket"))
            self.world.driver_up(index, time.time())
        elif kind == "driver-flood":
            self._flood(self.drivers[int(fault.part.split("-")[1])], seconds)
        elif kind == "apiserver-restart":
            stop_apiserver(self.server)
            time.sleep(seconds)
            start_apiserver(self.server)
        elif kind.startswith("proxy-"):
            self.proxy.fault(kind.removeprefix("proxy-"), seconds)
            time.sleep(seconds)
            self.proxy.clear()
        elif kind == "kubelet-restart":
            assert self.kubelet is not None
            self.kubelet.kill()
            time.sleep(seconds)
            # Its fake runtime kept the containers; it waits for the Node to be Ready
            # again (through an API server restart too, hence the long timeout).
            self.kubelet.start(timeout=300.0)
        elif kind == "disk-full":
            self.disk.fill()
            time.sleep(seconds)
            self.disk.unfill()
        elif kind == "disk-readonly":
            # A live remount read-only fails (EBUSY: SQLite holds the file open for
            # writing), so the sidecar crashes and comes back on a read-only disk.
            self.sidecar.signal(signal.SIGKILL)
            self.disk.readonly(True)
            try:
                self._restart_sidecar()
                time.sleep(seconds)
            finally:
                # Whatever the restart did: a disk left read-only turned every later
                # disk fault into a harness error (a niced hour beside a CI run, whose
                # sidecar took over 60 s to start: 2026-12-04).
                self.disk.readonly(False)
        else:
            raise ValueError(kind)

    def _restart_sidecar(self) -> None:
        before = [driver.streams_opened() for driver in self.drivers]
        self.sidecar.start()
        started = time.time()
        self.world.sidecar_starts.append(started)
        threading.Thread(
            target=self._note_streams, args=(started, before), name="soak-streams", daemon=True
        ).start()
        self.sidecar.wait_ready()

    def _note_streams(self, started: float, before: list[tuple[int, int] | None]) -> None:
        """Record when the sidecar started at ``started`` first streamed from each driver.

        Until then it holds what its state file kept (half a lease: ``World._guaranteed``).
        A stream counts when a driver has opened more than before the start, or any at
        all in a driver process started since (the old sidecar was dead by then).
        """
        waiting = set(range(len(self.drivers)))
        while waiting and not self._stop.wait(0.2):
            for index in sorted(waiting):
                now = self.drivers[index].streams_opened()
                if now is None:
                    continue
                old = before[index]
                if now[1] > (old[1] if old is not None and old[0] == now[0] else 0):
                    self.world.streamed_since(index, started, time.time())
                    waiting.discard(index)

    def _flood(self, driver: parts.Driver, seconds: float) -> None:
        # In its own thread: the driver's health changes go on during the flood.
        def flood() -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end and not self._stop.is_set():
                with contextlib.suppress(OSError, RuntimeError):
                    driver.request("push", times=FLOOD_BATCH)
                time.sleep(1 / FLOOD_TICKS)

        thread = threading.Thread(target=flood, name="soak-flood", daemon=True)
        thread.start()
        thread.join()

    def _sampler(self) -> None:
        next_at = time.time()
        while not self._stop.is_set():
            next_at += 1.0
            with contextlib.suppress(Exception):
                self._sample()
            time.sleep(max(0.0, next_at - time.time()))

    def _sample(self) -> None:
        now = time.time()
        row: dict[str, Any] = {"t": round(now - self.t0, 2), "life": self.sidecar.lives}
        pods = self.list_pods()
        row["wrong"] = self.conv.sample(pods, now) if pods is not None else None
        if self.kconv is not None and pods is not None:
            row["kubelet_wrong"] = self.kconv.sample(pods, now)
            row["kubelet_unknown"] = self._kubelet_unknown(pods, now)
        pid = self.sidecar.pid
        stats = parts.proc_stats(pid) if pid else None
        row.update(stats or {})
        if pid and now >= self._next_smaps:
            self._next_smaps = now + SMAPS_EVERY
            self._keep_smaps(pid, row)
        found = self.scrape()
        row["tasks"] = found.get("kubelet_dra_event_loop_tasks")
        row["pending"] = found.get("kubelet_dra_pending_pods")
        row["kubelet_owned"] = found.get("kubelet_dra_kubelet_owned_pods")
        row["kubelet_removes"] = found.get("kubelet_dra_kubelet_removes_field")
        # glibc's split of the heap (memtrim's gauges): an RSS step with "in use" flat is
        # free heap glibc keeps, not memory the sidecar holds.
        for name in ("in_use", "free", "mmapped"):
            value = found.get(f"kubelet_dra_malloc_{name}_bytes")
            row[f"malloc_{name}_mb"] = None if value is None else value / 2**20
        blocks = found.get("kubelet_dra_python_allocated_blocks")
        row["py_kblocks"] = None if blocks is None else blocks / 1000
        # The status-PATCH pool (about 280 KB a TLS connection): a step in bytes in use
        # at the same fd count may be the pool filling while urllib3's emptied.
        row["patch_conns"] = found.get("kubelet_dra_status_patch_connections")
        row["patch_idle"] = found.get("kubelet_dra_status_patch_idle_connections")
        row["api_conns"] = parts.tcp_connections(pid, self.proxy.port) if pid else None
        with contextlib.suppress(OSError):
            sizes = self.disk.state_bytes()
            row["state_bytes"] = sizes["total"]
            row["state_db_bytes"], row["wal_bytes"] = sizes["db"], sizes["wal"]
        row["writes"] = len(self.proxy.writes)
        self.samples.append(row)

    def _keep_smaps(self, pid: int, row: dict[str, Any]) -> None:
        """The sidecar's mappings now, to ``smaps/<life>-<t>.txt``: which mapping an RSS
        step landed in (a malloc heap, CPython's arenas, a thread stack, a library's code)
        is read from two of them (``python -m tests.soak.smapsdiff A B``)."""
        text = parts.smaps(pid)
        if text is None:
            return
        folder = self.opts.out / "smaps"
        folder.mkdir(exist_ok=True)
        (folder / f"{row['life']}-{int(row['t']):05d}.txt").write_text(text)

    def _kubelet_unknown(self, pods: dict[str, dict[str, Any]], now: float) -> int:
        """Pods whose kubelet-written field shows their device Unknown while its lease
        runs (the kubelet's ``clearDriver`` at a stream's end): the comparison's blips."""
        count = 0
        for name, (driver, device) in checks.pod_devices().items():
            health = checks.pod_health(pods.get(name, {})).get(parts.resource_id(driver, device))
            if health and health[0] == "Unknown" and self.world.lease_running(driver, now):
                count += 1
        return count

    # -- judging -------------------------------------------------------------------------

    def _judge(self, final: dict[str, Any]) -> dict[str, Any]:
        from . import _report

        return _report.judge(self, final)


def _prepare_claims() -> list[dict[str, list[dict[str, str]]]]:
    """Per driver, ``"<namespace>/<claim>"`` -> the one device its allocation names."""
    out: list[dict[str, list[dict[str, str]]]] = [{} for _ in range(plan.DRIVERS)]
    for name, (driver, device) in checks.pod_devices().items():
        key = f"{NAMESPACE}/{name}-gpu"
        out[driver][key] = [{"pool": parts.POOL, "device": parts.device_name(device)}]
    return out
