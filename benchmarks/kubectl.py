"""Scenario kubectl: ``kubectl dra-health devices`` over 10,000 pods with 8 devices each.

The API stand-in holds 10,000 running pods (100 nodes, 10 namespaces), each with one
ResourceClaim of 8 devices and an ``allocatedResourcesStatus`` entry reporting them: 1 % of
the devices Unhealthy with a message, 0.5 % Unknown, the rest Healthy. The plugin runs as a
real process (``python -m kubelet_dra.kubectl devices --kubeconfig ...``); the figure is the
wall time from its start until it exited after printing the table, and its peak RSS
(``ru_maxrss`` of the child). The table must hold exactly the non-Healthy devices.

Floors, measured in the same run against the same server: a process that only imports what
the plugin imports, and one that lists the pods the same way (pages of 500, JSON decoded)
and does nothing else. A second row times ``--all -o json`` (every device, every claim read:
a paged claim list instead of 10,000 GETs), reported only.

The same measurements run twice in one invocation: against the FakeApiServer stand-in (a
Python process on the same cores, which answers slower than the real thing), and against a
real etcd + kube-apiserver (the interop suite's binaries, built and cached by
``tests/interop/_build.py``; ``ResourceHealthStatus`` on so the status subresource keeps
``allocatedResourcesStatus``). The real variant is skipped, with the reason in the notes,
when Go, the module proxy or openssl is missing. Its cluster is created through the
official client from a thread pool: each claim is created and its allocation written with a
status update, each pod created and its status written as a kubelet would.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import dataclasses
import json
import pathlib
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from benchmarks import _common as c

NAME = "kubectl"
PER_POD = 8
NAMESPACES, NODES = 10, 100


@dataclasses.dataclass(frozen=True)
class Config:
    pods: int
    runs: int
    #: Pods of the real kube-apiserver variant; 0 leaves it out (the smoke test: starting
    #: etcd and kube-apiserver does not fit its time limit on a loaded machine).
    real_pods: int


FULL = Config(pods=10_000, runs=3, real_pods=10_000)
QUICK = Config(pods=10_000, runs=1, real_pods=1_000)
SMOKE = Config(pods=200, runs=1, real_pods=0)
CREATE_THREADS = 16

# Peak RSS is the process's own VmHWM at exit: a child's ru_maxrss would count the pages it
# shared with this (large) process between fork and exec.
HWM_PRELUDE = """
import atexit as _atexit, os as _os, pathlib as _pathlib
def _hwm():
    for line in _pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            _pathlib.Path(_os.environ["KUBECTL_BENCH_HWM"]).write_text(line.split()[1])
_atexit.register(_hwm)
"""

PLUGIN_SCRIPT = """
import runpy, sys
sys.argv = ["kubectl-dra_health", *sys.argv[1:]]
runpy.run_module("kubelet_dra.kubectl", run_name="__main__")
"""

IMPORTS_SCRIPT = """
import kubelet_dra.kubectl._cli, kubelet_dra.kubectl._config, kubelet_dra.kubectl._api
"""

LIST_SCRIPT = """
import json, sys
import kubernetes.client
url, token, ca = sys.argv[1:4]
config = kubernetes.client.Configuration()
config.host = url
if ca:
    config.ssl_ca_cert = ca
config.api_key = {"authorization": token}
config.api_key_prefix = {"authorization": "Bearer"}
count, token_ = 0, ""
with kubernetes.client.ApiClient(config) as client:
    while True:
        query = [("limit", "500")] + ([("continue", token_)] if token_ else [])
        request = client.param_serialize("GET", "/api/v1/pods", query_params=query,
                                         header_params={"Accept": "application/json"},
                                         auth_settings=["BearerToken"])
        page = json.loads(client.call_api(*request).read())
        count += len(page["items"])
        token_ = page["metadata"].get("continue") or ""
        if not token_:
            break
print(count)
"""


def health_of(device: int) -> str:
    if device % 100 == 7:
        return "Unhealthy"
    if device % 200 == 3:
        return "Unknown"
    return "Healthy"


def objects(pods: int) -> Iterator[tuple[dict[str, Any], dict[str, Any], int]]:
    """(claim, pod, devices not Healthy) for every pod of the scenario."""
    from kubelet_dra.testing import make_claim, make_pod

    for p in range(pods):
        namespace, node = f"team-{p % NAMESPACES}", f"node-{p % NODES:03d}"
        devices = [p * PER_POD + k for k in range(PER_POD)]
        claim_name = f"claim-{p:05d}"
        claim = make_claim(
            claim_name, namespace,
            [(c.DRIVER, node, c.device_name(d), "gpus") for d in devices], node=node,
        )  # fmt: skip
        pod = make_pod(f"pod-{p:05d}", node, namespace=namespace, claims=[claim_name])
        resources = []
        for d in devices:
            entry = {"resourceID": f"{c.DRIVER}/{node}/{c.device_name(d)}", "health": health_of(d)}
            if entry["health"] == "Unhealthy":
                entry["message"] = f"ECC uncorrectable error count exceeded on {c.device_name(d)}"
            resources.append(entry)
        pod["status"]["containerStatuses"][0]["allocatedResourcesStatus"] = [
            {"name": f"claim:{claim_name}", "resources": resources}
        ]
        yield claim, pod, sum(health_of(d) != "Healthy" for d in devices)


def build(api: Any, pods: int) -> int:
    """The cluster on the stand-in; returns how many devices are not Healthy."""
    bad = 0
    for claim, pod, not_healthy in objects(pods):
        api.create_claim(claim)
        api.create_pod(pod)
        bad += not_healthy
    return bad


def build_real(server: Any, pods: int) -> int:
    """The cluster on a real kube-apiserver, from a thread pool; returns the non-Healthy count.

    Two requests per object, as the control plane writes them: create, then a status update
    (the claim's allocation; the pod's status as a kubelet reports it).
    """
    from kubernetes import client

    config = server.client_configuration()
    config.connection_pool_maxsize = CREATE_THREADS
    with client.ApiClient(config) as api:
        core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
        for n in range(NAMESPACES):
            core.create_namespace(
                client.V1Namespace(metadata=client.V1ObjectMeta(name=f"team-{n}"))
            )

        def create(obj: dict[str, Any], post: Callable[..., Any], put: Callable[..., Any]) -> None:
            obj = copy.deepcopy(obj)
            namespace, status = obj["metadata"]["namespace"], obj.pop("status", None)
            created = json.loads(post(namespace, obj, _preload_content=False).data)
            if status is None:
                return
            created["status"] = status
            put(created["metadata"]["name"], namespace, created, _preload_content=False)

        bad = 0
        with concurrent.futures.ThreadPoolExecutor(CREATE_THREADS) as pool:
            futures = []
            for claim, pod, not_healthy in objects(pods):
                futures.append(
                    pool.submit(
                        create, claim, res.create_namespaced_resource_claim,
                        res.replace_namespaced_resource_claim_status,
                    )
                )  # fmt: skip
                futures.append(
                    pool.submit(
                        create, pod, core.create_namespaced_pod,
                        core.replace_namespaced_pod_status,
                    )
                )  # fmt: skip
                bad += not_healthy
            for future in futures:
                future.result()
    return bad


def measure(script: str, args: list[str], workdir: pathlib.Path) -> tuple[float, float, float, str]:
    """Seconds from start to exit, peak RSS (VmHWM) in MB, CPU seconds, stdout."""
    out_path, hwm_path = workdir / "out.txt", workdir / "hwm.txt"
    hwm_path.unlink(missing_ok=True)
    env = {**c.quiet_env(), "KUBECTL_BENCH_HWM": str(hwm_path)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with out_path.open("wb") as out:
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-c", HWM_PRELUDE + script, *args],
            stdout=out, stderr=subprocess.PIPE, env=env, check=False,
        )  # fmt: skip
        seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if proc.returncode not in (0, 3):
        raise c.CheckFailed(f"{args[:2]} exited {proc.returncode}: {proc.stderr.decode()[-500:]}")
    return seconds, int(hwm_path.read_text()) / 1024, cpu, out_path.read_text()


@contextlib.contextmanager
def real_server(workdir: pathlib.Path) -> Iterator[tuple[Any, str]]:
    """(a running etcd + kube-apiserver, its version) or (None, why it is unavailable)."""
    try:
        from tests.interop import _apiserver, _build
    except ImportError as exc:  # run outside the repository checkout
        yield None, f"the interop helpers are not importable ({exc})"
        return
    reason = _apiserver.openssl_unavailable_reason()
    if reason:
        yield None, reason
        return
    try:
        etcd, apiserver = _build.ensure("etcd"), _build.ensure("kube-apiserver")
    except _build.BuildUnavailable as exc:  # no Go or no module proxy; a compile error raises
        yield None, exc.reason
        return
    server = _apiserver.start_kube_apiserver(
        etcd_bin=etcd, apiserver_bin=apiserver, workdir=workdir / "apiserver",
        feature_gates={"ResourceHealthStatus": True},
    )  # fmt: skip
    try:
        yield server, _build.ARTIFACTS["kube-apiserver"].version
    finally:
        server.stop()


def measure_runs(
    out: c.Outcome, runs: int, pods: int, bad: int, kubeconfig: pathlib.Path,
    list_args: list[str], workdir: pathlib.Path,
) -> dict[str, list[c.Spread]]:  # fmt: skip
    """The four processes, ``runs`` times each; per process [wall, peak RSS, CPU] spreads."""
    figures: dict[str, list[list[float]]] = {  # wall seconds, peak MB, CPU seconds
        k: [] for k in ("imports", "list", "devices", "all-json")
    }
    kc = ["--kubeconfig", str(kubeconfig)]
    for _ in range(runs):
        *figure, _ = measure(IMPORTS_SCRIPT, [], workdir)
        figures["imports"].append(figure)
        *figure, text = measure(LIST_SCRIPT, list_args, workdir)
        figures["list"].append(figure)
        if int(text) != pods:
            raise c.CheckFailed(f"the bare list saw {text.strip()} pods")
        *figure, text = measure(PLUGIN_SCRIPT, ["devices", *kc], workdir)
        figures["devices"].append(figure)
        rows = text.splitlines()[1:]
        out.check(len(rows) == bad, f"devices printed {len(rows)} rows, expected {bad}")
        out.check(all(" Healthy " not in r for r in rows), "devices printed a Healthy device")
        *figure, text = measure(PLUGIN_SCRIPT, ["devices", "--all", "-o", "json", *kc], workdir)
        figures["all-json"].append(figure)
        items = json.loads(text)["items"]
        out.check(
            len(items) == pods * PER_POD and all(i["device"] for i in items),
            f"--all -o json: {len(items)} items, not all resolved",
        )
    return {k: [c.Spread.of(f[i] for f in v) for i in range(3)] for k, v in figures.items()}


LABELS = {
    "imports": "floor: imports only",
    "list": "floor: bare paged pod list (JSON)",
    "devices": "`devices` (first table)",
    "all-json": "`devices --all -o json` (every claim read)",
}


def report(
    out: c.Outcome, server: str, pods: int, runs: int, bad: int, setup: float,
    spread: dict[str, list[c.Spread]],
) -> None:  # fmt: skip
    """The table of one server variant and its two summary rows."""
    out.table(
        f"kubectl dra-health against {server}: {pods:,} pods x {PER_POD} devices "
        f"({bad:,} not Healthy), median [min-max] of {runs} runs; cluster built in {setup:.0f} s",
        ["process", "wall time to exit", "CPU (user+sys)", "peak RSS"],
        [(LABELS[k], t.fmt(" s"), u.fmt(" s"), r.fmt(" MB")) for k, (t, r, u) in spread.items()],
    )
    first, rss, cpu = spread["devices"]
    floor_t, floor_r, floor_cpu = spread["list"]
    out.notes.append(
        f"{server}: CPU of the plugin process {cpu.median:.2f} s against {floor_cpu.median:.2f} s "
        "for the bare list; the rest of the wall time is the server answering (same cores)."
    )
    scenario = f"kubectl vs {server}, {pods:,} pods x {PER_POD}"
    full = pods >= 10_000
    at = "" if full else "report (target at 10,000 pods: "
    out.summary.append(
        c.SummaryRow(
            scenario, f"{first.median:.2f} s to first table", f"{floor_t.median:.2f} s (bare list)",
            f"{first.median / floor_t.median:.2f}x", f"{at}< 3 s{')' if at else ''}",
            first.median < 3.0 if full else None,
        )
    )  # fmt: skip
    out.summary.append(
        c.SummaryRow(
            scenario, f"{rss.median:.0f} MB peak RSS", f"{floor_r.median:.0f} MB (bare list)",
            f"{rss.median / floor_r.median:.2f}x", f"{at}< 300 MB{')' if at else ''}",
            rss.median < 300 if full else None,
        )
    )  # fmt: skip


async def run(config: Config) -> c.Outcome:
    out = c.Outcome(NAME)
    with c.short_tmpdir() as workdir:
        with c.api_server() as api:
            t0 = time.perf_counter()
            bad = build(api, config.pods)
            setup = time.perf_counter() - t0
            kubeconfig = api.write_kubeconfig(workdir / "kubeconfig")
            list_args = [api.url, api.token, ""]
            spread = measure_runs(
                out, config.runs, config.pods, bad, kubeconfig, list_args, workdir
            )
        report(out, "FakeApiServer", config.pods, config.runs, bad, setup, spread)
        if config.real_pods:
            with real_server(workdir) as (server, version):
                if server is None:
                    out.notes.append(f"kube-apiserver variant skipped: {version}")
                    return out
                t0 = time.perf_counter()
                bad = build_real(server, config.real_pods)
                setup = time.perf_counter() - t0
                kubeconfig = server.kubeconfig
                list_args = [server.url, server.admin_token, str(server.ca_file)]
                spread = measure_runs(
                    out, config.runs, config.real_pods, bad, kubeconfig, list_args, workdir
                )
            report(
                out, f"kube-apiserver {version}", config.real_pods, config.runs, bad, setup, spread
            )
    return out
