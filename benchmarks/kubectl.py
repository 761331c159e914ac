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
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import resource
import subprocess
import sys
import time

from benchmarks import _common as c

NAME = "kubectl"
PER_POD = 8
NAMESPACES, NODES = 10, 100


@dataclasses.dataclass(frozen=True)
class Config:
    pods: int
    runs: int


FULL = Config(pods=10_000, runs=3)
QUICK = Config(pods=10_000, runs=1)
SMOKE = Config(pods=200, runs=1)

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
url, token = sys.argv[1:3]
config = kubernetes.client.Configuration()
config.host = url
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


def build(api: object, pods: int) -> int:
    """The cluster; returns how many devices are not Healthy."""
    from kubelet_dra.testing import make_claim, make_pod

    bad = 0
    for p in range(pods):
        namespace, node = f"team-{p % NAMESPACES}", f"node-{p % NODES:03d}"
        devices = [p * PER_POD + k for k in range(PER_POD)]
        claim = f"claim-{p:05d}"
        api.create_claim(  # type: ignore[attr-defined]
            make_claim(
                claim, namespace,
                [(c.DRIVER, node, c.device_name(d), "gpus") for d in devices], node=node,
            )
        )  # fmt: skip
        pod = make_pod(f"pod-{p:05d}", node, namespace=namespace, claims=[claim])
        resources = []
        for d in devices:
            entry = {"resourceID": f"{c.DRIVER}/{node}/{c.device_name(d)}", "health": health_of(d)}
            if entry["health"] == "Unhealthy":
                entry["message"] = f"ECC uncorrectable error count exceeded on {c.device_name(d)}"
            resources.append(entry)
            bad += health_of(d) != "Healthy"
        pod["status"]["containerStatuses"][0]["allocatedResourcesStatus"] = [
            {"name": f"claim:{claim}", "resources": resources}
        ]
        api.create_pod(pod)  # type: ignore[attr-defined]
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


async def run(config: Config) -> c.Outcome:
    out = c.Outcome(NAME)
    figures: dict[str, list[list[float]]] = {  # wall seconds, peak MB, CPU seconds
        k: [] for k in ("imports", "list", "devices", "all-json")
    }
    with c.short_tmpdir() as workdir, c.api_server() as api:
        t0 = time.perf_counter()
        bad = build(api, config.pods)
        setup = time.perf_counter() - t0
        kc = ["--kubeconfig", str(api.write_kubeconfig(workdir / "kubeconfig"))]
        for _ in range(config.runs):
            *figure, _ = measure(IMPORTS_SCRIPT, [], workdir)
            figures["imports"].append(figure)
            *figure, text = measure(LIST_SCRIPT, [api.url, api.token], workdir)
            figures["list"].append(figure)
            if int(text) != config.pods:
                raise c.CheckFailed(f"the bare list saw {text.strip()} pods")
            *figure, text = measure(PLUGIN_SCRIPT, ["devices", *kc], workdir)
            figures["devices"].append(figure)
            rows = text.splitlines()[1:]
            out.check(len(rows) == bad, f"devices printed {len(rows)} rows, expected {bad}")
            out.check(all(" Healthy " not in r for r in rows), "devices printed a Healthy device")
            args = ["devices", "--all", "-o", "json", *kc]
            *figure, text = measure(PLUGIN_SCRIPT, args, workdir)
            figures["all-json"].append(figure)
            items = json.loads(text)["items"]
            out.check(
                len(items) == config.pods * PER_POD and all(i["device"] for i in items),
                f"--all -o json: {len(items)} items, not all resolved",
            )
    spread = {k: [c.Spread.of(f[i] for f in v) for i in range(3)] for k, v in figures.items()}
    labels = {
        "imports": "floor: imports only",
        "list": "floor: bare paged pod list (JSON)",
        "devices": "`devices` (first table)",
        "all-json": "`devices --all -o json` (every claim read)",
    }
    out.table(
        f"kubectl dra-health: {config.pods:,} pods x {PER_POD} devices ({bad:,} not Healthy), "
        f"median [min-max] of {config.runs} runs; cluster built in {setup:.0f} s",
        ["process", "wall time to exit", "CPU (user+sys)", "peak RSS"],
        [(labels[k], t.fmt(" s"), u.fmt(" s"), r.fmt(" MB")) for k, (t, r, u) in spread.items()],
    )
    first, rss, cpu = spread["devices"]
    floor_t, floor_r, floor_cpu = spread["list"]
    out.notes.append(
        f"CPU of the plugin process: {cpu.median:.2f} s against {floor_cpu.median:.2f} s for the "
        "bare list; the rest of the wall time is the API stand-in answering (same 2 cores)."
    )
    out.summary.append(
        c.SummaryRow(
            f"kubectl, {config.pods:,} pods x {PER_POD}",
            f"{first.median:.2f} s to first table",
            f"{floor_t.median:.2f} s (bare list)",
            f"{first.median / floor_t.median:.2f}x",
            "< 3 s",
            first.median < 3.0 if config.pods >= 10_000 else None,
        )
    )
    out.summary.append(
        c.SummaryRow(
            f"kubectl, {config.pods:,} pods x {PER_POD}",
            f"{rss.median:.0f} MB peak RSS",
            f"{floor_r.median:.0f} MB (bare list)",
            f"{rss.median / floor_r.median:.2f}x",
            "< 300 MB",
            rss.median < 300 if config.pods >= 10_000 else None,
        )
    )
    return out
