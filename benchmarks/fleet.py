"""Scenario ``fleet``: N nodes of our library against one real kube-apiserver and etcd.

The interop suite's kube-apiserver and etcd (``tests/interop/_apiserver.py``,
built and cached by ``tests/interop/_build.py``; without Go the scenario is
skipped with the reason) run fresh for each fleet size. Every node has a
FakeDriver with 8 devices and 10 pods using 8 claims (pods 8 and 9 share the
claims of pods 0 and 1), and runs our library (``DRAHealthManager`` with its own
API client, watch, token bucket and state file) in one of a few worker
processes (``benchmarks/_fleetnode.py``). Phases:

(a) steady state; (b) one device flapping on every node; (c) a rack failure:
25 % of the nodes with every device Unhealthy at once, then recovered; (d) the
kube-apiserver restarted under the fleet while one device per node changes,
twice: with the nodes' relist backoff as it was before issue 15 (fixed
doubling) and with its full jitter, timing every node's relist; (e) the rack
failure again with API Priority and Fairness on and the nodes' user in a
priority level of a few seats and a short queue, so that the writers get 429s
with ``Retry-After`` (against (c), where APF is off).

The nodes authenticate as one user (``fleet-node``, in the group
``system:serviceaccounts`` like a DaemonSet's service account, bound to
``cluster-admin``), not as the admin: members of ``system:masters`` are
exempt from every inflight limit and from APF.

Costs come from the servers: requests by verb and resource from the
apiserver's own ``apiserver_request_total`` (watches excluded, the
benchmark's own requests subtracted), response bytes from
``apiserver_response_sizes``, request-body bytes counted in each worker (in
urllib3 and in the status PATCH's event-loop transport, ``kube/asyncpatch.py``;
the kubelet baseline's: the bodies it sent), apiserver CPU seconds from
``/proc/<pid>/stat``, etcd growth from etcd's ``etcd_mvcc_db_total_size_in_bytes``
and its revision (one per write).
Visibility is timed by a watch on every pod, from the driver's send to the
watch event that shows the pod's new health.

Baseline, same run, same pods: the kubelet's status manager writes a device
change as a GET of the pod and a strategic-merge patch of its status carrying
the whole ``containerStatuses`` list (the list is atomic, so the patch
replaces it whole). The benchmark does that for twin pods (same spec, claims
and status, on node names no node of ours serves) for the same changes, with
the kubelet's content types: answers in protobuf (the kubelet's default
``--kube-api-content-type``), the patch body in JSON (as the kubelet sends
every patch). Our nodes ask for JSON.

Every size runs ``runs`` times (a fresh apiserver and etcd each); the
comparison with the kubelet's way and the summary are medians over the runs,
the per-phase tables are those of the first run.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import dataclasses
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any

from benchmarks import _common as c
from benchmarks._fleetnode import DRIVER, POOL, device_name

NAME = "fleet"
DEVICES = 8
PODS = 10
OURS = "fleet"  # namespace of the pods our nodes serve
TWINS = "kubelet"  # namespace of the baseline's twin pods
RACK = 0.25


#: The nodes' user (a static token), its groups, and the APF objects of case (e).
NODE_USER = "fleet-node"
NODE_GROUPS = ("system:serviceaccounts",)
APF_LEVEL = "fleet-nodes"
#: Nominal concurrency shares of the nodes' priority level: of the bootstrap levels' 245
#: shares plus these, against the default 600 seats (400 + 200 inflight): 3 seats.
APF_SHARES = 1


@dataclasses.dataclass(frozen=True)
class Config:
    sizes: tuple[int, ...]
    processes: int
    steady_seconds: float
    flaps: int
    #: Case (e): the share of the nodes failing at once, and the nodes' priority level's
    #: one queue's length (requests beyond its seats + this many are answered 429).
    apf_rack: float = RACK
    apf_queue: int = 4
    runs: int = 1


FULL = Config(sizes=(10, 50, 100, 200), processes=4, steady_seconds=20.0, flaps=3, runs=3)
QUICK = Config(sizes=(10, 50), processes=4, steady_seconds=5.0, flaps=1)
#: The interop test's size: every node fails in case (e) and the queue holds one request,
#: so 4 nodes x 8 concurrent writes against 3 seats + 1 are sure to meet 429s.
SMOKE = Config(sizes=(4,), processes=2, steady_seconds=1.0, flaps=1, apf_rack=1.0, apf_queue=1)

Key = tuple[str, str]  # namespace, pod name


def node_name(i: int) -> str:
    return f"n{i:04d}"


def pod_devices(k: int) -> int:
    """The device (and claim) index of pod ``k``: 0..7, pods 8 and 9 share 0 and 1."""
    return k % DEVICES


def resource_id(k: int) -> str:
    return f"{DRIVER}/{POOL}/{device_name(k)}"


# -- servers: metrics, CPU, restart ---------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ([0-9.eE+-]+|NaN|\+Inf)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    found = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            labels = dict(_LABEL.findall(match.group(2) or ""))
            found.append((match.group(1), labels, float(match.group(3))))
    return found


@dataclasses.dataclass
class Snapshot:
    """Server-side counters at one moment."""

    requests: dict[str, float]  # "VERB resource[/sub]" -> count (no WATCH)
    response_bytes: float
    cpu_s: float
    etcd_db: float
    etcd_revision: float
    at: float
    #: "VERB resource[/sub]" -> requests answered 429 (APF or the inflight limits), from
    #: ``apiserver_request_terminations_total`` (``apiserver_request_total`` counts them
    #: too, among the requests).
    throttled: dict[str, float] = dataclasses.field(default_factory=dict)

    def minus(self, other: Snapshot) -> Snapshot:
        keys = set(self.requests) | set(other.requests)
        rejected = set(self.throttled) | set(other.throttled)
        return Snapshot(
            {k: self.requests.get(k, 0) - other.requests.get(k, 0) for k in keys},
            self.response_bytes - other.response_bytes,
            self.cpu_s - other.cpu_s,
            self.etcd_db - other.etcd_db,
            self.etcd_revision - other.etcd_revision,
            self.at - other.at,
            {k: self.throttled.get(k, 0) - other.throttled.get(k, 0) for k in rejected},
        )

    def rejected(self) -> float:
        """Requests of the kinds a node makes that were answered 429."""
        return sum(v for k, v in self.throttled.items() if _ours(k))

    def count(self, pattern: str = "") -> float:
        """Requests whose "VERB resource[/sub]" matches, of the kinds a node makes (the
        apiserver's own lease renewals, RBAC bootstrap and probes are not counted)."""
        return sum(v for k, v in self.requests.items() if re.search(pattern, k) and _ours(k))


#: The resources a node of ours (or the kubelet's way) touches.
NODE_RESOURCES = ("pods", "pods/status", "resourceclaims", "events")


def _ours(kind: str) -> bool:
    return kind.partition(" ")[2] in NODE_RESOURCES


class Servers:
    """The kube-apiserver and etcd of one fleet size."""

    def __init__(self, server: Any) -> None:
        self.server = server
        import ssl

        self._ctx = ssl.create_default_context(cafile=str(server.ca_file))
        self._base = Snapshot({}, 0, 0, 0, 0, 0)  # counters of apiservers that were restarted

    @property
    def apiserver(self) -> Any:
        return next(p for p in self.server._procs if p.name == "kube-apiserver")

    def _get(self, url: str, token: bool) -> str:
        headers = {"Authorization": f"Bearer {self.server.admin_token}"} if token else {}
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, context=self._ctx if token else None, timeout=30) as r:
            return str(r.read().decode())

    def cpu_seconds(self) -> float:
        fields = pathlib.Path(f"/proc/{self.apiserver.popen.pid}/stat").read_text()
        utime, stime = fields.rsplit(")", 1)[1].split()[11:13]
        return (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")

    def snapshot(self) -> Snapshot:
        requests: dict[str, float] = {}
        throttled: dict[str, float] = {}
        response_bytes = 0.0
        for name, labels, value in parse_metrics(self._get(f"{self.server.url}/metrics", True)):
            sub = labels.get("subresource")
            key = f"{labels.get('verb')} {labels.get('resource')}{'/' + sub if sub else ''}"
            if name == "apiserver_request_total" and labels.get("verb") != "WATCH":
                requests[key] = requests.get(key, 0) + value
            elif name == "apiserver_response_sizes_sum" and labels.get("verb") != "WATCH":
                response_bytes += value
            elif name == "apiserver_request_terminations_total" and labels.get("code") == "429":
                throttled[key] = throttled.get(key, 0) + value
        etcd = {
            n: v for n, _, v in parse_metrics(self._get(f"{self.server.etcd_url}/metrics", False))
        }
        now = Snapshot(
            requests, response_bytes, self.cpu_seconds(),
            etcd.get("etcd_mvcc_db_total_size_in_bytes", 0.0),
            etcd.get("etcd_debugging_mvcc_current_revision", 0.0), time.time(), throttled,
        )  # fmt: skip
        base = self._base
        return Snapshot(
            _add(now.requests, base.requests),
            now.response_bytes + base.response_bytes, now.cpu_s + base.cpu_s,
            now.etcd_db, now.etcd_revision, now.at, _add(now.throttled, base.throttled),
        )  # fmt: skip

    def metric(self, wanted: str, **labels: str) -> float | None:
        """The value of one apiserver metric sample with these labels, if it is there."""
        for name, found, value in parse_metrics(self._get(f"{self.server.url}/metrics", True)):
            if name == wanted and all(found.get(k) == v for k, v in labels.items()):
                return value
        return None

    def post(self, path: str, body: dict[str, Any]) -> None:
        """Create an object as the admin (409, already there, is fine)."""
        request = urllib.request.Request(
            f"{self.server.url}{path}", data=json.dumps(body).encode(), method="POST",
            headers={"Authorization": f"Bearer {self.server.admin_token}",
                     "Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, context=self._ctx, timeout=30):
                pass
        except urllib.error.HTTPError as exc:
            if exc.code != 409:
                raise

    def stop_apiserver(self) -> None:
        """Stop kube-apiserver (etcd keeps running); keep its counters."""
        last = self.snapshot()
        self._base = dataclasses.replace(
            last, requests=dict(last.requests), throttled=dict(last.throttled)
        )
        self.apiserver.stop()

    def start_apiserver(
        self, timeout: float = 120.0, flags: Callable[[list[str]], list[str]] = list
    ) -> tuple[float, float]:
        """Start kube-apiserver again with the same flags (or ``flags(old flags)``); return
        when it was started and when ``/readyz`` first answered (it serves requests before
        it is ready)."""
        from tests.interop import _apiserver

        old = self.apiserver
        started = time.time()
        new = _apiserver._spawn("kube-apiserver", flags(list(old.popen.args)), old.log)
        self.server._procs[self.server._procs.index(old)] = new
        _apiserver._wait_ready(
            self.server.url, self.server.ca_file, self.server.admin_token, [new], timeout
        )
        return started, time.time()


def _add(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in set(a) | set(b)}


def apf_on(args: list[str]) -> list[str]:
    """The apiserver's flags with API Priority and Fairness on (its default)."""
    return [a for a in args if not a.startswith("--enable-priority-and-fairness")] + [
        "--enable-priority-and-fairness=true"
    ]


def apf_objects(queue: int) -> list[tuple[str, dict[str, Any]]]:
    """A priority level of ``APF_SHARES`` shares (a few seats, no borrowing, one queue of
    ``queue``) and a FlowSchema putting the nodes' user in it: (path, body) to POST."""
    base = "/apis/flowcontrol.apiserver.k8s.io/v1"
    level = {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration",
        "metadata": {"name": APF_LEVEL},
        "spec": {"type": "Limited", "limited": {
            "nominalConcurrencyShares": APF_SHARES, "lendablePercent": 0,
            "borrowingLimitPercent": 0,
            "limitResponse": {"type": "Queue", "queuing": {
                "queues": 1, "handSize": 1, "queueLengthLimit": queue}},
        }},
    }  # fmt: skip
    schema = {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
        "metadata": {"name": APF_LEVEL},
        "spec": {
            "priorityLevelConfiguration": {"name": APF_LEVEL}, "matchingPrecedence": 500,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{
                "subjects": [{"kind": "User", "user": {"name": NODE_USER}}],
                "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                   "namespaces": ["*"], "clusterScope": True}],
            }],
        },
    }  # fmt: skip
    return [(f"{base}/prioritylevelconfigurations", level), (f"{base}/flowschemas", schema)]


# -- the pods: ours and the twins, and a watch on all of them -----------------------------


def health_of(pod: dict[str, Any]) -> dict[str, str]:
    return c.health_entries(pod.get("status") or {})


class Watcher:
    """One watch on every pod: the latest health each shows, and when a wanted state showed."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.lock = threading.Lock()
        self.shown: dict[Key, dict[str, str]] = {}
        self.objects: dict[Key, dict[str, Any]] = {}
        self.wanted: dict[Key, dict[str, str]] = {}
        self.reached: dict[Key, float] = {}
        self.lists = 0  # our own LIST requests, subtracted from the counts
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fleet-watch")

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def expect(self, wanted: dict[Key, dict[str, str]]) -> None:
        with self.lock:
            self.wanted = dict(wanted)
            self.reached = {}
            for key, state in wanted.items():
                if self.shown.get(key) == state:
                    self.reached[key] = time.time()

    def done(self) -> bool:
        with self.lock:
            return len(self.reached) >= len(self.wanted)

    def _see(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        shown = health_of(pod)
        with self.lock:
            self.shown[key] = shown
            self.objects[key] = pod
            if key in self.wanted and key not in self.reached and self.wanted[key] == shown:
                self.reached[key] = time.time()

    def _run(self) -> None:
        from kubernetes import client

        core: Any = client.CoreV1Api(self.api)  # raw responses: _preload_content=False
        while not self._stop.is_set():
            try:
                listed = json.loads(core.list_pod_for_all_namespaces(_preload_content=False).data)
                self.lists += 1  # counted once the server answered: it counted it too
                for pod in listed["items"]:
                    self._see(pod)
                rv = listed["metadata"]["resourceVersion"]
                response = core.list_pod_for_all_namespaces(
                    watch=True, resource_version=rv, allow_watch_bookmarks=False,
                    timeout_seconds=300, _preload_content=False,
                )  # fmt: skip
                for line in response:
                    if self._stop.is_set():
                        break
                    event = json.loads(line)
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self._see(event["object"])
                response.release_conn()
            except Exception:  # the server restarts under us: list again
                time.sleep(0.2)


def _pod(i: int, k: int, namespace: str, node: str) -> dict[str, Any]:
    from kubelet_dra.testing.fakeapi import PodClaim, make_pod

    d = pod_devices(k)
    return make_pod(
        f"{node_name(i)}-p{k}", node, namespace=namespace,
        claims=[PodClaim("gpu", f"{node_name(i)}-c{d}")],
    )  # fmt: skip


def populate(cluster: Any, nodes: int, threads: int = 8) -> None:
    """Our pods (on n0000...) and their twins (on kl-n0000..., never served by us)."""
    from kubelet_dra.testing.fakeapi import make_claim

    def one_node(i: int) -> None:
        for namespace, node in ((OURS, node_name(i)), (TWINS, f"kl-{node_name(i)}")):
            created = [cluster.create_pod(_pod(i, k, namespace, node)) for k in range(PODS)]
            for d in range(DEVICES):
                users = [p for k, p in enumerate(created) if pod_devices(k) == d]
                cluster.create_claim(
                    make_claim(
                        f"{node_name(i)}-c{d}", namespace,
                        [(DRIVER, POOL, device_name(d), "gpu")], reserved_for=users, node=node,
                    )
                )  # fmt: skip

    for namespace in (OURS, TWINS):
        cluster.ensure_namespace(namespace)
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(one_node, range(nodes)))


def expected(
    nodes: Iterable[int], state: Callable[[int, int], str], namespace: str = OURS
) -> dict[Key, dict[str, str]]:
    """What every pod of ``nodes`` must show when device d of node i has ``state(i, d)``."""
    return {
        (namespace, f"{node_name(i)}-p{k}"): {resource_id(pod_devices(k)): state(i, pod_devices(k))}
        for i in nodes
        for k in range(PODS)
    }


# -- the baseline: the kubelet's GET + strategic-merge patch of the whole status -------------

#: What the kubelet's client accepts: its ``--kube-api-content-type`` defaults to protobuf
#: (``pkg/kubelet/apis/config/v1beta1/defaults.go``), and ``setContentTypeForClient`` in
#: ``cmd/kubelet/app/server.go`` then accepts protobuf, else JSON.
KUBELET_ACCEPT = "application/vnd.kubernetes.protobuf,application/json"
#: The envelope every protobuf answer of the apiserver starts with (``runtime.Unknown``).
PROTOBUF_MAGIC = b"k8s\x00"
SMP = "application/strategic-merge-patch+json"


def _pb_fields(data: bytes) -> dict[int, list[bytes | int]]:
    """The fields of one protobuf message, by number (varints as ints, the rest as bytes):
    just enough wire format to read a pod's name, uid and resourceVersion back."""
    found: dict[int, list[bytes | int]] = {}
    at = 0

    def varint() -> int:
        nonlocal at
        value = shift = 0
        while True:
            byte = data[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    while at < len(data):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            found.setdefault(number, []).append(varint())
        elif wire == 2:
            size = varint()
            found.setdefault(number, []).append(data[at : at + size])
            at += size
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            found.setdefault(number, []).append(data[at : at + size])
            at += size
        else:
            raise ValueError(f"protobuf wire type {wire} not expected in a pod")
    return found


def protobuf_pod_meta(answer: bytes) -> tuple[str, str, str]:
    """(name, uid, resourceVersion) of a pod in the apiserver's protobuf encoding:
    ``k8s\\0`` + ``runtime.Unknown`` whose ``raw`` (2) is the ``v1.Pod``, whose
    ``metadata`` (1) is an ``ObjectMeta``: name 1, uid 5, resourceVersion 6."""
    if not answer.startswith(PROTOBUF_MAGIC):
        raise c.CheckFailed(
            f"the kubelet baseline's GET was not answered in protobuf: {answer[:40]!r}"
        )
    raw = _pb_fields(answer[len(PROTOBUF_MAGIC) :])[2][0]
    meta = _pb_fields(bytes(_pb_fields(bytes(raw))[1][0]))

    def text(number: int) -> str:
        values = meta.get(number) or [b""]
        return bytes(values[0]).decode()

    return text(1), text(5), text(6)


def _raw(api: Any, method: str, path: str, body: Any = None) -> bytes:
    """One request as the kubelet's client sends it (protobuf accepted); the raw answer."""
    headers = {"Accept": KUBELET_ACCEPT}
    if body is not None:
        headers["Content-Type"] = SMP
    request = api.param_serialize(
        method=method, resource_path=path, header_params=headers, body=body,
        auth_settings=["BearerToken"],
    )  # fmt: skip
    response = api.call_api(*request, _request_timeout=(5, 30))
    response.read()
    if not 200 <= response.status <= 299:
        raise c.CheckFailed(f"kubelet baseline {method} {path}: {response.status}")
    return bytes(response.data)


def kubelet_write(api: Any, watcher: Watcher, key: Key, health: dict[str, str]) -> int:
    """What the kubelet's status manager sends for a pod: GET (answered in protobuf), then
    a strategic-merge patch with its uid and the whole containerStatuses list
    (allocatedResourcesStatus set to ``health``), answered in protobuf. The patch body is
    JSON, as the kubelet's is (a patch has no protobuf form: ``PatchPodStatus`` in
    ``pkg/util/pod`` marshals it with ``json`` and sends it as ``StrategicMergePatchType``).
    Returns the bytes of the body sent.

    The Python client cannot decode protobuf, so the status to patch is taken from
    the watch's JSON copy of the same pod, once the GET's resourceVersion (read from
    the protobuf) says that copy is the one the GET returned."""
    namespace, name = key
    path = f"/api/v1/namespaces/{namespace}/pods/{name}"
    got, uid, version = protobuf_pod_meta(_raw(api, "GET", path))
    pod = _watched(watcher, key, version)
    if got != name or pod["metadata"]["uid"] != uid:
        raise c.CheckFailed(f"kubelet baseline: GET of {key} answered pod {got} ({uid})")
    statuses = copy.deepcopy(pod["status"].get("containerStatuses") or [])
    for cs in statuses:
        cs["allocatedResourcesStatus"] = [
            {
                "name": "claim:gpu",
                "resources": [
                    {"resourceID": rid, "health": h} for rid, h in sorted(health.items())
                ],
            }
        ]
    body = {"metadata": {"uid": uid}, "status": {"containerStatuses": statuses}}
    _raw(api, "PATCH", f"{path}/status", body)
    return len(json.dumps(body))  # what the client's rest layer sends (json.dumps)


def _watched(watcher: Watcher, key: Key, version: str, timeout: float = 10.0) -> dict[str, Any]:
    """The watch's copy of pod ``key`` at ``version`` (the watch may lag the GET)."""
    deadline = time.monotonic() + timeout
    while True:
        with watcher.lock:
            pod = watcher.objects.get(key)
        if pod is not None and pod["metadata"]["resourceVersion"] == version:
            return pod
        if time.monotonic() > deadline:
            raise c.CheckFailed(f"kubelet baseline: the watch never showed {key} at {version}")
        time.sleep(0.01)


# -- the fleet's worker processes -------------------------------------------------------------


class Workers:
    """A few ``benchmarks._fleetnode`` processes sharing the nodes round-robin."""

    def __init__(self, workdir: pathlib.Path, kubeconfig: pathlib.Path, nodes: int, procs: int):
        self.procs: list[subprocess.Popen[str]] = []
        self.nodes = nodes
        count = max(1, min(procs, nodes))
        for w in range(count):
            names = ",".join(node_name(i) for i in range(w, nodes, count))
            with (workdir / f"worker-{w}.log").open("w") as log:  # the child keeps its copy
                self._spawn(kubeconfig, workdir, w, names, log)
        self.ready = [self._expect(p, "ready", timeout=60 + nodes) for p in self.procs]

    def _spawn(
        self, kubeconfig: pathlib.Path, workdir: pathlib.Path, w: int, names: str, log: Any
    ) -> None:
        args = [
            sys.executable, "-m", "benchmarks._fleetnode", "--kubeconfig", str(kubeconfig),
            "--workdir", str(workdir / f"w{w}"), "--nodes", names,
        ]  # fmt: skip
        self.procs.append(
            subprocess.Popen(
                args,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=c.quiet_env(),
                cwd=c._ROOT,
            )
        )

    def _expect(self, proc: subprocess.Popen[str], event: str, timeout: float) -> dict[str, Any]:
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                raise c.CheckFailed(f"fleet worker exited (code {proc.wait()}); see worker logs")
            found: dict[str, Any] = json.loads(line)
            if found.get("event") == event:
                return found
        raise c.CheckFailed(f"fleet worker: no {event} within {timeout:.0f} s")

    def _all(self, command: dict[str, Any], event: str) -> list[dict[str, Any]]:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(command) + "\n")
            proc.stdin.flush()
        return [self._expect(p, event, timeout=120) for p in self.procs]

    def set_health(self, nodes: Iterable[int], devices: list[int] | None, health: str) -> float:
        """Send; return the wall time the first driver sent (all send within milliseconds)."""
        started = time.time()
        names = [node_name(i) for i in nodes]
        self._all({"op": "health", "nodes": names, "devices": devices, "health": health}, "sent")
        return started

    def stats(self) -> list[dict[str, Any]]:
        return self._all({"op": "stats"}, "stats")

    def retries(self) -> float:
        """The writers' retries so far (429, 5xx, lost connections), every node."""
        return float(sum(s["writers"].get("result_retried", 0) for s in self.stats()))

    def lists(self, since: float) -> list[tuple[float, bool]]:
        """Every pod LIST a node started since ``since`` (wall time, answered)."""
        found = self._all({"op": "lists", "since": since}, "lists")
        return sorted((float(t), bool(ok)) for w in found for t, ok in w["lists"])

    def jitter(self, on: bool) -> None:
        """Full jitter on the nodes' relist backoff, or the fixed doubling from before."""
        self._all({"op": "jitter", "on": on}, "jitter")

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(BrokenPipeError, OSError):
                assert proc.stdin is not None
                proc.stdin.write(json.dumps({"op": "stop"}) + "\n")
                proc.stdin.flush()
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()


# -- one phase: a change, its costs, its visibility ----------------------------------------


@dataclasses.dataclass
class Phase:
    name: str
    device_changes: int
    pod_updates: int
    cost: Snapshot
    sent_bytes: float
    latencies: list[float]
    missing: int
    own_lists: int = 0
    retries: float = 0.0  # the writers' retries during the phase

    def requests(self) -> float:
        return self.cost.count(r"^(?!LIST pods$)") + max(
            0.0, self.cost.count(r"^LIST pods$") - self.own_lists
        )

    def events(self) -> float:
        return self.cost.count(r" events$")

    def writes(self) -> float:
        return self.cost.count(r"^PATCH pods/status$")


def _wait_visible(watcher: Watcher, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not watcher.done() and time.monotonic() < deadline:
        time.sleep(0.02)


def run_phase(
    name: str, servers: Servers, watcher: Watcher, workers: Workers | None,
    change: Callable[[], float], wanted: dict[Key, dict[str, str]], device_changes: int,
    timeout: float,
) -> Phase:  # fmt: skip
    """Apply ``change`` (returns its start time), wait until ``wanted`` shows, settle, count."""
    before = servers.snapshot()
    stats = workers.stats() if workers else []
    sent_before = sum(s["sent_bytes"] for s in stats)
    retried_before = sum(s["writers"].get("result_retried", 0) for s in stats)
    lists_before = watcher.lists
    watcher.expect(wanted)
    started = change()
    _wait_visible(watcher, timeout)
    time.sleep(1.0)  # let the writers' events and late writes land in the counts
    after = servers.snapshot()
    stats = workers.stats() if workers else []
    sent_after = sum(s["sent_bytes"] for s in stats)
    retried_after = sum(s["writers"].get("result_retried", 0) for s in stats)
    with watcher.lock:
        latencies = [t - started for t in watcher.reached.values()]
        missing = len(wanted) - len(watcher.reached)
    return Phase(
        name, device_changes, len(wanted), after.minus(before), sent_after - sent_before,
        latencies, missing, watcher.lists - lists_before, retried_after - retried_before,
    )  # fmt: skip


def baseline_phase(
    name: str, servers: Servers, watcher: Watcher, api: Any,
    wanted: dict[Key, dict[str, str]], device_changes: int, threads: int,
) -> Phase:  # fmt: skip
    """The kubelet's way for the twins: one GET + SMP per pod, ``threads`` kubelets at once;
    the request bytes are the bodies it sent."""
    sent: list[int] = []

    def change() -> float:
        started = time.time()
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            sent.extend(pool.map(lambda kv: kubelet_write(api, watcher, kv[0], kv[1]),
                                 wanted.items()))  # fmt: skip
        return started

    phase = run_phase(name, servers, watcher, None, change, wanted, device_changes, 120)
    phase.sent_bytes = float(sum(sent))
    return phase


# -- the run ---------------------------------------------------------------------------------


def _binaries() -> tuple[pathlib.Path, pathlib.Path] | str:
    from tests.interop import _apiserver, _build

    reason = _apiserver.openssl_unavailable_reason()
    if reason:
        return reason
    try:
        return _build.ensure("etcd"), _build.ensure("kube-apiserver")
    except _build.BuildUnavailable as exc:
        return str(exc)


def _size(
    n: int, config: Config, bins: tuple[pathlib.Path, pathlib.Path], workdir: pathlib.Path,
    out: c.Outcome,
) -> dict[str, Any]:  # fmt: skip
    from tests.interop import _apiserver, _cluster

    server = _apiserver.start_kube_apiserver(
        etcd_bin=bins[0], apiserver_bin=bins[1], workdir=workdir / "api",
        extra_users={NODE_USER: NODE_GROUPS},
    )  # fmt: skip
    servers = Servers(server)
    cluster = _cluster.RealCluster(server)
    workers: Workers | None = None
    watcher: Watcher | None = None
    watch_api = server.api_client()
    result: dict[str, Any] = {"nodes": n}
    try:
        t0 = time.time()
        populate(cluster, n)
        kubeconfig = node_user(servers, workdir)
        result["populate_s"] = time.time() - t0
        watcher = Watcher(watch_api).start()
        everyone = range(n)
        healthy = expected(everyone, lambda i, d: "Healthy")
        # The twins start as the kubelet would have left them: every device Healthy.
        twins = expected(everyone, lambda i, d: "Healthy", TWINS)
        baseline_phase("twins: initial", servers, watcher, cluster.api, twins, 0, 16)
        # Start: every node lists its pods, reads its claims, writes every pod once.
        workers_holder: list[Workers] = []

        def start() -> float:
            started = time.time()
            workers_holder.append(Workers(workdir, kubeconfig, n, config.processes))
            return started

        phases = [run_phase("start", servers, watcher, None, start, healthy, 0, 120 + 2 * n)]
        workers = workers_holder[0]
        result["worker_rss_mb"] = [s["rss_kb"] / 1024 for s in workers.stats()]
        # (a) steady state.
        before = servers.snapshot()
        lists = watcher.lists
        time.sleep(config.steady_seconds)
        steady = servers.snapshot().minus(before)
        result["steady_requests"] = steady.count("") - (watcher.lists - lists)
        result["steady_seconds"] = steady.at
        # (b) one device flapping on every node, and the kubelet's way for the twins.
        flap = expected(everyone, lambda i, d: "Unhealthy" if d == 0 else "Healthy")
        flap_pods = {k: v for k, v in flap.items() if resource_id(0) in v}
        ok_pods = {k: healthy[k] for k in flap_pods}
        twin_flap = {(TWINS, k[1]): v for k, v in flap_pods.items()}
        twin_ok = {(TWINS, k[1]): v for k, v in ok_pods.items()}
        for _ in range(config.flaps):
            for state, wanted, twin, health in (
                ("down", flap_pods, twin_flap, "Unhealthy"), ("up", ok_pods, twin_ok, "Healthy")
            ):  # fmt: skip
                phases.append(run_phase(
                    f"flap {state}", servers, watcher, workers,
                    lambda h=health: workers.set_health(everyone, [0], h),  # type: ignore[misc]
                    wanted, n, 60 + n,
                ))  # fmt: skip
                phases.append(baseline_phase(
                    f"kubelet flap {state}", servers, watcher, cluster.api, twin, n, min(n, 16)
                ))  # fmt: skip
        # (c) rack failure: 25 % of the nodes, every device, at once; then recovered.
        rack = range(max(1, round(n * RACK)))
        for state, health in (("down", "Unhealthy"), ("up", "Healthy")):
            wanted = expected(rack, lambda i, d, h=health: h)  # type: ignore[misc]
            phases.append(run_phase(
                f"rack {state}", servers, watcher, workers,
                lambda h=health: workers.set_health(rack, None, h),  # type: ignore[misc]
                wanted, len(rack) * DEVICES, 60 + 2 * n,
            ))  # fmt: skip
            twin = {(TWINS, k[1]): v for k, v in wanted.items()}
            phases.append(baseline_phase(
                f"kubelet rack {state}", servers, watcher, cluster.api, twin,
                len(rack) * DEVICES, min(len(rack), 16),
            ))  # fmt: skip
        # (d) the apiserver restarted under the fleet: device 1 of every node goes
        # Unhealthy (then Healthy) while it is down; first with the relist backoff as it
        # was before issue 15 (fixed doubling), then with its jitter.
        workers.jitter(False)
        result["restart_fixed"] = _restart(servers, watcher, workers, n, "Unhealthy", False)
        workers.jitter(True)
        result["restart"] = _restart(servers, watcher, workers, n, "Healthy", True)
        phases += [result["restart_fixed"]["phase"], result["restart"]["phase"]]
        # (e) the rack failure again, with APF on and the nodes in a small priority level.
        result["apf"] = _apf(servers, watcher, workers, n, config)
        phases += result["apf"]["phases"]
        result["phases"] = phases
        result["worker_hwm_mb"] = [s["hwm_kb"] / 1024 for s in workers.stats()]
        result["worker_cpu_s"] = [s["cpu_s"] for s in workers.stats()]
        for phase in phases:
            out.check(
                phase.missing == 0,
                f"{n} nodes, {phase.name}: {phase.missing} pods never showed the change",
            )
    finally:
        if watcher is not None:
            watcher.stop()
        if workers is not None:
            workers.stop()
        watch_api.close()
        cluster.close()
        server.stop()
    return result


def node_user(servers: Servers, workdir: pathlib.Path) -> pathlib.Path:
    """The nodes' kubeconfig: user ``NODE_USER`` (a static token), bound to cluster-admin
    (not in ``system:masters``, so the inflight limits and APF apply to it)."""
    server = servers.server
    servers.post("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": NODE_USER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                      "name": NODE_USER}],
    })  # fmt: skip
    path: pathlib.Path = server.write_kubeconfig(
        workdir / "node.kubeconfig", server.tokens[NODE_USER], NODE_USER
    )
    _wait_authorized(servers, server.tokens[NODE_USER])
    return path


def _wait_authorized(servers: Servers, token: str, timeout: float = 60.0) -> None:
    """Until the apiserver's RBAC cache has the new binding: the nodes' first requests
    would be answered 403 and retried on their backoff, which the start phase would time."""
    request = urllib.request.Request(
        f"{servers.server.url}/api/v1/namespaces/{OURS}/pods?limit=1",
        headers={"Authorization": f"Bearer {token}"},
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(request, context=servers._ctx, timeout=10):
                return
        except urllib.error.HTTPError as exc:
            if exc.code != 403:
                raise
        time.sleep(0.1)
    raise c.CheckFailed(f"{NODE_USER} still forbidden {timeout:.0f} s after its binding")


def relist_stats(lists: list[tuple[float, bool]], up: float) -> dict[str, float]:
    """The nodes' pod LISTs since the apiserver went down, timed from its new start
    ``up``: answered ones (p50 / p99 / max s after ``up``), the most answered in one
    100 ms window, and the attempts that got no answer."""
    answered = [t - up for t, ok in lists if ok]
    buckets: dict[int, int] = {}
    for t in answered:
        buckets[int(t // 0.1)] = buckets.get(int(t // 0.1), 0) + 1
    return {
        "answered": len(answered),
        "failed": sum(1 for _, ok in lists if not ok),
        "p50": c.percentile(answered, 50),
        "p99": c.percentile(answered, 99),
        "max": max(answered, default=float("nan")),
        "peak_100ms": max(buckets.values(), default=0),
    }


def _restart(
    servers: Servers, watcher: Watcher, workers: Workers, n: int, health: str, jitter: bool
) -> dict[str, Any]:
    everyone = range(n)
    wanted = {
        k: v
        for k, v in expected(everyone, lambda i, d: health if d == 1 else "Healthy").items()
        if resource_id(1) in v
    }
    before = servers.snapshot()
    sent_before = sum(s["sent_bytes"] for s in workers.stats())
    retried_before = workers.retries()
    lists_before = watcher.lists
    down = time.time()
    servers.stop_apiserver()
    watcher.expect(wanted)
    workers.set_health(everyone, [1], health)
    time.sleep(2.0)  # the writers try, fail and back off while the server is down
    up, ready = servers.start_apiserver()
    _wait_visible(watcher, 120 + n)
    _wait_relisted(workers, down, n, 60 + n)
    time.sleep(1.0)
    after = servers.snapshot()
    cost = after.minus(before)
    with watcher.lock:
        latencies = [t - up for t in watcher.reached.values()]
        missing = len(wanted) - len(watcher.reached)
    phase = Phase(
        f"apiserver restart ({'jitter' if jitter else 'fixed backoff'})", n, len(wanted), cost,
        sum(s["sent_bytes"] for s in workers.stats()) - sent_before, latencies, missing,
        watcher.lists - lists_before, workers.retries() - retried_before,
    )  # fmt: skip
    return {
        "phase": phase,
        "jitter": jitter,
        "down_s": up - down,
        "ready_s": ready - up,
        "relists": cost.count(r"^LIST pods$") - (watcher.lists - lists_before),
        "lists": relist_stats(workers.lists(down), up),
        "current_after_s": max(latencies) if latencies else float("nan"),
    }


def _wait_relisted(workers: Workers, since: float, n: int, timeout: float) -> None:
    """Until the nodes have listed their pods ``n`` times since ``since`` (each node lists
    once when its watch broke and the server answers again)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(1 for _, ok in workers.lists(since) if ok) >= n:
            return
        time.sleep(0.25)
    raise c.CheckFailed(f"the nodes did not list their pods again within {timeout:.0f} s")


def _apf(
    servers: Servers, watcher: Watcher, workers: Workers, n: int, config: Config
) -> dict[str, Any]:
    """Case (e): the apiserver restarted with APF on, the nodes' user in a priority level
    of ``APF_SHARES`` shares (a few seats) and one queue of ``config.apf_queue``; then a
    rack failure of ``config.apf_rack`` of the nodes, down and up."""
    for path, body in apf_objects(config.apf_queue):
        servers.post(path, body)
    down = time.time()
    servers.stop_apiserver()
    up, _ = servers.start_apiserver(flags=apf_on)
    seats = _wait_metric(
        servers, "apiserver_flowcontrol_nominal_limit_seats", priority_level=APF_LEVEL
    )
    _wait_relisted(workers, down, n, 120 + n)
    restart = relist_stats(workers.lists(down), up)
    rack = range(max(1, round(n * config.apf_rack)))
    phases = []
    for state, health in (("down", "Unhealthy"), ("up", "Healthy")):
        wanted = expected(rack, lambda i, d, h=health: h)  # type: ignore[misc]
        phases.append(run_phase(
            f"APF rack {state}", servers, watcher, workers,
            lambda h=health: workers.set_health(rack, None, h),  # type: ignore[misc]
            wanted, len(rack) * DEVICES, 120 + 2 * n,
        ))  # fmt: skip
    return {"phases": phases, "seats": seats, "queue": config.apf_queue,
            "rack_nodes": len(rack), "restart_lists": restart}  # fmt: skip


def _wait_metric(servers: Servers, name: str, timeout: float = 60.0, **labels: str) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = servers.metric(name, **labels)
        if value is not None:
            return value
        time.sleep(0.25)
    raise c.CheckFailed(f"apiserver metric {name} {labels} not there within {timeout:.0f} s")


# -- report ---------------------------------------------------------------------------------


def _per(value: float, count: float) -> float:
    return value / count if count else float("nan")


def _lat(phase: Phase) -> str:
    if not phase.latencies:
        return "n/a"
    ms = 1000.0
    p50, p99 = c.percentile(phase.latencies, 50), c.percentile(phase.latencies, 99)
    return f"{c.num(p50 * ms)} / {c.num(p99 * ms)} / {c.num(max(phase.latencies) * ms)}"


def _phase_row(n: int, phase: Phase) -> tuple[object, ...]:
    writes = phase.writes()
    changes = phase.device_changes or phase.pod_updates
    return (
        n, phase.name, phase.device_changes, phase.pod_updates, f"{phase.requests():.0f}",
        f"{writes:.0f}", c.num(_per(phase.requests(), changes)),
        c.num(_per(phase.sent_bytes + phase.cost.response_bytes, changes)),
        c.num(_per(phase.cost.cpu_s * 1000, writes)), f"{phase.cost.etcd_revision:.0f}",
        c.num(phase.cost.etcd_db / 1024), _lat(phase), f"{phase.cost.rejected():.0f}",
        f"{phase.retries:.0f}", _kinds(phase),
    )  # fmt: skip


def _kinds(phase: Phase) -> str:
    counts = {k: v for k, v in phase.cost.requests.items() if _ours(k)}
    if "LIST pods" in counts:
        counts["LIST pods"] -= phase.own_lists
    shown = sorted(((v, k) for k, v in counts.items() if v >= 0.5), reverse=True)
    return ", ".join(f"{k} {v:.0f}" for v, k in shown)


def _totals(phases: list[Phase], prefix: str) -> dict[str, float]:
    """Sums over the phases named ``prefix...``. Event requests belong to our nodes
    whichever phase they landed in (the kubelet's way sends none): a folded series is
    updated an ``event_interval`` later, often during the next (kubelet) phase."""
    chosen = [p for p in phases if p.name.startswith(prefix)]
    changes = sum(p.device_changes for p in chosen)
    if prefix.startswith("kubelet"):
        requests = sum(p.requests() - p.events() for p in chosen)
    else:
        theirs = [p for p in phases if p.name.startswith(f"kubelet {prefix}")]
        requests = sum(p.requests() for p in chosen) + sum(p.events() for p in theirs)
    return {
        "changes": changes,
        "pods": sum(p.pod_updates for p in chosen),
        "requests": requests,
        "writes": sum(p.writes() for p in chosen),
        "bytes": sum(p.sent_bytes + p.cost.response_bytes for p in chosen),
        "cpu": sum(p.cost.cpu_s for p in chosen),
        "revisions": sum(p.cost.etcd_revision for p in chosen),
    }


#: Overrides the fleet sizes of the chosen config: ``FLEET_SIZES=200 python -m benchmarks
#: --quick --only fleet`` runs the quick phases at 200 nodes only.
SIZES_ENV = "FLEET_SIZES"


def sizes_from_env(config: Config, value: str | None) -> Config:
    """``config`` with the sizes of ``$FLEET_SIZES`` (comma list of positive ints), if set."""
    if not value:
        return config
    try:
        sizes = tuple(int(x) for x in value.split(","))
    except ValueError:
        raise c.CheckFailed(
            f"{SIZES_ENV}={value!r}: expected a comma list of node counts"
        ) from None
    if not sizes or min(sizes) < 1:
        raise c.CheckFailed(f"{SIZES_ENV}={value!r}: node counts must be at least 1")
    return dataclasses.replace(config, sizes=sizes)


async def run(config: Config) -> c.Outcome:
    out = c.Outcome(NAME)
    config = sizes_from_env(config, os.environ.get(SIZES_ENV))
    bins = _binaries()
    if isinstance(bins, str):
        out.notes.append(f"SKIPPED: {bins}")
        return out
    results = []
    with c.short_tmpdir("kfl") as workdir:
        for n in config.sizes:
            for k in range(config.runs):
                t0 = time.time()
                results.append(_size(n, config, bins, workdir / f"n{n}-{k}", out))
                results[-1]["run"] = k
                out.notes.append(f"{n} nodes, run {k + 1}: {time.time() - t0:.0f} s (objects "
                                 f"created in {results[-1]['populate_s']:.0f} s)")  # fmt: skip
    report(out, results, config)
    return out


def by_size(results: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """The runs of each fleet size, in the order they ran."""
    found: dict[int, list[dict[str, Any]]] = {}
    for r in results:
        found.setdefault(int(r["nodes"]), []).append(r)
    return found


def _per_change(result: dict[str, Any], kind: str) -> dict[str, float]:
    """Ours and the kubelet's way, per device change, in one run: requests, bytes, CPU ms
    and etcd writes, keyed ``ours_requests`` ... ``kubelet_revisions``."""
    found: dict[str, float] = {}
    for side, prefix in (("ours", kind), ("kubelet", f"kubelet {kind}")):
        totals = _totals(result["phases"], prefix)
        for field in ("requests", "bytes", "cpu", "revisions"):
            scale = 1000.0 if field == "cpu" else 1.0
            found[f"{side}_{field}"] = _per(totals[field], totals["changes"]) * scale
    return found


def _med(runs: list[dict[str, float]], key: str) -> str:
    """Median [min-max] of ``key`` over runs (the bare figure for one run)."""
    spread = c.Spread.of(r[key] for r in runs)
    return c.num(spread.median) if spread.n <= 1 else spread.fmt()


def report(out: c.Outcome, results: list[dict[str, Any]], config: Config) -> None:
    sizes = by_size(results)
    results = [runs[0] for runs in sizes.values()]  # the per-phase tables: the first run
    rows = [_phase_row(r["nodes"], p) for r in results for p in r["phases"]]
    out.table(
        "Fleet: cost and visibility per phase (requests to pods, pods/status, resourceclaims "
        "and events, without watches and the benchmark's own pod lists; bytes = request "
        "bodies + responses; CPU = kube-apiserver)",
        ["nodes", "phase", "device changes", "pod updates", "requests", "status writes",
         "requests / change", "bytes / change", "apiserver CPU s / 1,000 writes",
         "etcd revisions", "etcd DB growth KiB", "visible p50 / p99 / max ms", "429s",
         "writer retries", "requests by kind"],
        rows,
    )  # fmt: skip
    cmp_rows = []
    for n, runs in sizes.items():
        for kind in ("flap", "rack"):
            per = [_per_change(r, kind) for r in runs]
            cmp_rows.append((
                n, kind, len(runs),
                *(_med(per, f"{side}_{field}") for field in ("requests", "bytes", "cpu",
                                                             "revisions")
                  for side in ("ours", "kubelet")),
            ))  # fmt: skip
    out.table(
        "Fleet against the kubelet's way (GET + strategic-merge patch of the whole status, "
        "answers in protobuf, the patch in JSON, as the kubelet sends them), per device "
        "health change; median [min-max] over the runs",
        ["nodes", "phase", "runs", "requests: ours", "requests: kubelet", "bytes: ours",
         "bytes: kubelet", "apiserver CPU ms: ours", "CPU ms: kubelet", "etcd writes: ours",
         "etcd writes: kubelet"],
        cmp_rows,
    )  # fmt: skip
    out.table(
        "Fleet: steady state, apiserver restart, worker processes",
        ["nodes", "steady requests/min (all nodes)", "restart: stop asked to new start s",
         "new apiserver ready after s", "pod relists",
         "all pods current after the new apiserver started, s", "processes",
         "RSS per process MB (after start)",
         "peak RSS per process MB", "worker CPU s"],
        [(
            r["nodes"], c.num(r["steady_requests"] / r["steady_seconds"] * 60),
            c.num(r["restart"]["down_s"]), c.num(r["restart"]["ready_s"]),
            f"{r['restart']['relists']:.0f}",
            c.num(r["restart"]["current_after_s"]), len(r["worker_rss_mb"]),
            ", ".join(f"{x:.0f}" for x in r["worker_rss_mb"]),
            ", ".join(f"{x:.0f}" for x in r["worker_hwm_mb"]),
            ", ".join(f"{x:.0f}" for x in r["worker_cpu_s"]),
        ) for r in results],
    )  # fmt: skip
    out.table(
        "Fleet: relists after an apiserver restart, the relist backoff without jitter (fixed "
        "doubling, as before issue 15) and with full jitter (seconds after the new apiserver "
        "started; the nodes' own clocks)",
        ["nodes", "relist backoff", "relists answered", "list attempts unanswered",
         "relist p50 / p99 / max s", "most relists in 100 ms", "all pods current after s"],
        [_relist_row(r["nodes"], r[key]) for r in results for key in ("restart_fixed", "restart")],
    )  # fmt: skip
    out.table(
        "Fleet: rack failure with API Priority and Fairness off (inflight limits 400 + 200) and "
        "on (the nodes' user in a priority level of a few seats and one short queue)",
        ["nodes", "APF", "rack nodes", "device changes", "requests", "429s", "writer retries",
         "visible p50 / p99 / max ms", "pods not current"],
        [row for r in results for row in _apf_rows(r)],
    )  # fmt: skip
    biggest = results[-1]
    runs = sizes[int(biggest["nodes"])]
    per = [_per_change(r, "rack") for r in runs]
    cost = c.Spread.of(x["ours_requests"] for x in per).median
    base = c.Spread.of(x["kubelet_requests"] for x in per).median
    ratio = c.Spread.of(_per(x["ours_requests"], x["kubelet_requests"]) for x in per).median
    med = f" (medians of {len(runs)} runs)" if len(runs) > 1 else ""
    out.summary.append(
        c.SummaryRow(
            f"9 fleet, rack failure, {biggest['nodes']} nodes",
            f"{c.num(cost)} requests, {c.num(c.Spread.of(x['ours_bytes'] for x in per).median)}"
            f" B per device change{med}",
            f"{c.num(base)} requests, "
            f"{c.num(c.Spread.of(x['kubelet_bytes'] for x in per).median)} B (kubelet GET + "
            "SMP, protobuf answers)",
            f"{c.num(ratio)}x",
            "report",
            None,
            value=ratio,
            better="lower",
        )
    )
    out.summary.append(
        c.SummaryRow(
            f"9 fleet, apiserver restart, {biggest['nodes']} nodes",
            f"all pods current {c.num(biggest['restart']['current_after_s'])} s after it "
            f"started; {biggest['restart']['relists']:.0f} relists",
            f"{biggest['nodes']} nodes",
            c.num(_per(biggest["restart"]["relists"], biggest["nodes"])) + " relists/node",
            "no change lost",
            all(r["restart"]["phase"].missing == 0 for r in runs),
        )
    )
    fixed, jittered = biggest["restart_fixed"]["lists"], biggest["restart"]["lists"]
    out.summary.append(
        c.SummaryRow(
            f"9 fleet, relists after a restart, {biggest['nodes']} nodes",
            f"jitter: at most {jittered['peak_100ms']} relists in 100 ms, p50 / max "
            f"{c.num(jittered['p50'])} / {c.num(jittered['max'])} s",
            f"fixed backoff: {fixed['peak_100ms']} in 100 ms, "
            f"{c.num(fixed['p50'])} / {c.num(fixed['max'])} s",
            f"{c.num(_per(jittered['peak_100ms'], fixed['peak_100ms']))}x peak",
            "report",
            None,
        )
    )
    apf = biggest["apf"]["phases"]
    out.summary.append(
        c.SummaryRow(
            f"9 fleet, rack failure under APF, {biggest['nodes']} nodes",
            f"{sum(p.cost.rejected() for p in apf):.0f} 429s, "
            f"{sum(p.retries for p in apf):.0f} retries, every pod current after "
            f"{c.num(max(max(p.latencies, default=0.0) for p in apf))} s",
            f"APF off: {c.num(max(max(p.latencies, default=0.0) for p in _rack(biggest)))} s",
            f"{sum(p.missing for p in apf)} pods not current",
            "no change lost",
            all(p.missing == 0 for p in apf),
        )
    )
    out.table(
        "Projection of a rack failure from the biggest run's cost per device change "
        f"(writer concurrency {WRITER_CONCURRENCY}, QPS {QPS:g}, burst {BURST})",
        ["nodes", "rack nodes", "requests", "requests per rack node", "requests in flight",
         f"> {MUTATING_INFLIGHT} mutating inflight (APF off)",
         f"> {WORKLOAD_LOW_SEATS} seats + {WORKLOAD_LOW_QUEUED:,} queued (APF workload-low)",
         "node-side wait s (beyond burst)", "apiserver CPU s", "s on 8 apiserver cores"],
        projection_rows(results),
    )  # fmt: skip
    out.notes.append(projection(results))


def _relist_row(n: int, restart: dict[str, Any]) -> tuple[object, ...]:
    lists = restart["lists"]
    return (
        n, "full jitter" if restart["jitter"] else "fixed doubling", f"{lists['answered']:.0f}",
        f"{lists['failed']:.0f}",
        f"{c.num(lists['p50'])} / {c.num(lists['p99'])} / {c.num(lists['max'])}",
        f"{lists['peak_100ms']:.0f}", c.num(restart["current_after_s"]),
    )  # fmt: skip


def _rack(result: dict[str, Any]) -> list[Phase]:
    return [p for p in result["phases"] if p.name.startswith("rack ")]


def _apf_rows(result: dict[str, Any]) -> list[tuple[object, ...]]:
    apf = result["apf"]
    rows: list[tuple[object, ...]] = []
    for label, rack_nodes, phases in (
        ("off", max(1, round(result["nodes"] * RACK)), _rack(result)),
        (f"on: {apf['seats']:.0f} seats + queue {apf['queue']}", apf["rack_nodes"],
         apf["phases"]),
    ):  # fmt: skip
        for phase in phases:
            rows.append((
                result["nodes"], label, rack_nodes, f"{phase.name.split()[-1]}: "
                f"{phase.device_changes}", f"{phase.requests():.0f}",
                f"{phase.cost.rejected():.0f}", f"{phase.retries:.0f}", _lat(phase),
                phase.missing,
            ))  # fmt: skip
    return rows


#: The apiserver's defaults (k8s.io/apiserver server.Config, flowcontrol bootstrap):
#: --max-requests-inflight 400, --max-mutating-requests-inflight 200; with API Priority
#: and Fairness (on by default) their sum, 600 seats, is shared by priority level, and
#: service accounts land in "workload-low": 100 of 245 shares = 245 seats, 128 queues of 50.
MUTATING_INFLIGHT = 200
WORKLOAD_LOW_SEATS = 245
WORKLOAD_LOW_QUEUED = 128 * 50


def _default(field: str) -> Any:
    from kubelet_dra.settings import Settings

    return Settings.model_fields[field].default


WRITER_CONCURRENCY = int(_default("write_concurrency"))  # pod writes in flight per node
QPS, BURST = float(_default("api_qps")), int(_default("api_burst"))


def projection_rows(results: list[dict[str, Any]]) -> list[tuple[object, ...]]:
    """A rack failure (25 % of the nodes, 8 devices each) at 1,000 and 5,000 nodes, from
    the biggest run's measured cost per device change."""
    biggest = results[-1]
    ours = _totals(biggest["phases"], "rack")
    per_change = _per(ours["requests"], ours["changes"])
    cpu_per_request = _per(ours["cpu"], ours["requests"])
    per_node = per_change * DEVICES  # requests one rack node makes
    rows: list[tuple[object, ...]] = []
    for nodes in (biggest["nodes"], 1000, 5000):
        rack_nodes = nodes * RACK
        requests = rack_nodes * per_node
        in_flight = rack_nodes * min(WRITER_CONCURRENCY, PODS)
        # Node side: a node's requests beyond its burst wait for tokens.
        node_s = max(0.0, per_node - BURST) / QPS
        cpu = requests * cpu_per_request
        rows.append((
            f"{nodes:,}", f"{rack_nodes:,.0f}", f"{requests:,.0f}", c.num(per_node),
            f"{in_flight:,.0f}",
            "yes" if in_flight > MUTATING_INFLIGHT else "no",
            "yes" if in_flight > WORKLOAD_LOW_SEATS + WORKLOAD_LOW_QUEUED else "no",
            c.num(node_s), c.num(cpu), c.num(cpu / 8),
        ))  # fmt: skip
    return rows


def projection(results: list[dict[str, Any]]) -> str:
    """One line for the notes: the 1,000 and 5,000 node rows of :func:`projection_rows`."""
    rows = projection_rows(results)[1:]
    return "Projection (rack failure): " + "; ".join(
        f"{r[0]} nodes: {r[2]} requests, {r[4]} in flight, {r[8]} apiserver CPU s" for r in rows
    )
