"""One node with a real kubelet: the fake container runtime, the kubelet, its DRA driver.

The e2e tier runs the unmodified upstream kubelet (``tests/e2e/kubelet/<line>``, built from
the module proxy by ``tests/interop/_build.py``) against the interop suite's real
kube-apiserver and etcd. What it takes on a machine without a container runtime or a spare
host (docs/e2e.md has the recipe and the reasons):

- **Runtime**: ``fakecri`` serves the upstream in-memory fake CRI; containers "run" at once
  and exit only when a test asks (:meth:`Kubelet.exit_container`).
- **Mount namespace**: the kubelet runs inside ``unshare -m -n --propagation private``,
  where files holding the values it insists on are bind-mounted over the six ``/proc/sys``
  entries it checks (``protectKernelDefaults: true`` then only reads them), and tmpfs covers
  ``/var/lib`` and ``/var/log`` (the device-plugin socket and ``/var/log/containers`` are
  hard-coded).
- **Network namespace**: the same ``unshare`` gives it a network of its own, so the iptables
  chains and DROP rule that kubelet 1.37's ``initNetworkUtil`` adds wherever ``iptables``
  exists land there, not on the host (``test_e2e_host.py`` compares the host's tables). Its
  loopback carries :data:`NODE_IP` (its node IP: it refuses a loopback one) and a relay
  (``_relay.py``) on the server's own ``127.0.0.1`` port, joined to a relay on the host by a
  unix socket, so its kubeconfig is unchanged. Every other socket it uses is a unix socket.
  Nothing on the host changes.
- **Identity**: a static token user ``system:node:<node>`` in ``system:nodes``, so the Node
  authorizer applies to the kubelet as in a cluster.

:class:`Kubelet` starts, stops, SIGKILLs and restarts one kubelet with a given line and
feature gates; :class:`Audit` reads the kube-apiserver's audit log, which is where the tests
count who wrote each pod's status (never our own metrics).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kubelet_dra.status.podjson import MutableObj as Obj
from tests.e2e import _api
from tests.interop._apiserver import KubeApiServer, free_port

#: What the kubelet's kernel-tunable check wants (pkg/kubelet/cm: setupKernelTunables).
SYSCTLS: Mapping[str, int] = {
    "vm/overcommit_memory": 1,
    "vm/panic_on_oom": 0,
    "kernel/panic": 10,
    "kernel/panic_on_oops": 1,
    "kernel/keys/root_maxkeys": 1000000,
    "kernel/keys/root_maxbytes": 25000000,
}

#: The kubelet's node IP, on its network namespace's loopback device. Nothing is sent to it:
#: the kubelet only checks that an interface has it and puts it in the Node's addresses.
NODE_IP = "198.18.0.2"
#: The relay between the kubelet's network namespace and the host's (run by path).
RELAY = Path(__file__).resolve().with_name("_relay.py")

#: The audit policy: every write of a pod's status with its body, nothing else.
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Request
  verbs: ["patch", "update"]
  resources:
  - group: ""
    resources: ["pods/status"]
- level: None
"""


def unavailable_reason() -> str | None:
    """Why a kubelet cannot run here, or None."""
    if os.geteuid() != 0:
        return "the e2e kubelet needs root (a private mount namespace and bind mounts)"
    for tool in ("unshare", "mount", "ip"):
        if shutil.which(tool) is None:
            return f"the {tool} command is needed to run the e2e kubelet"
    probe = subprocess.run(
        ["unshare", "-m", "-n", "--propagation", "private", "ip", "link", "set", "lo", "up"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        return f"cannot make a private mount and network namespace: {probe.stderr.strip()}"
    return None


def audit_args(workdir: Path) -> tuple[str, ...]:
    """kube-apiserver flags that write the audit log the tests read."""
    workdir.mkdir(parents=True, exist_ok=True)
    policy = workdir / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    return (
        f"--audit-policy-file={policy}",
        f"--audit-log-path={workdir / 'audit.log'}",
        "--audit-log-format=json",
        "--audit-log-mode=blocking",
    )


@dataclasses.dataclass(frozen=True)
class StatusWrite:
    """One write of a pod's status, as the audit log recorded it."""

    user: str
    verb: str
    namespace: str
    name: str
    code: int
    at: float  # Unix seconds (the stage timestamp)
    body: Any

    def sets_field(self) -> bool:
        """Whether the request body carries ``allocatedResourcesStatus`` anywhere."""
        return "allocatedResourcesStatus" in json.dumps(self.body)


class Audit:
    """The kube-apiserver's audit log of pod status writes."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def writes(self, namespace: str | None = None, name: str | None = None) -> list[StatusWrite]:
        if not self.path.exists():
            return []
        found = []
        for line in self.path.read_text(errors="replace").splitlines():
            write = _status_write(line)
            if write is None or (namespace and write.namespace != namespace):
                continue
            if name and write.name != name:
                continue
            found.append(write)
        return found


def _status_write(line: str) -> StatusWrite | None:
    try:
        event = json.loads(line)
    except ValueError:
        return None  # a line being written
    ref = event.get("objectRef") or {}
    if ref.get("resource") != "pods" or ref.get("subresource") != "status":
        return None
    stamp = str(event.get("stageTimestamp", ""))
    return StatusWrite(
        user=str((event.get("user") or {}).get("username", "")),
        verb=str(event.get("verb", "")),
        namespace=str(ref.get("namespace", "")),
        name=str(ref.get("name", "")),
        code=int((event.get("responseStatus") or {}).get("code", 0)),
        at=_rfc3339(stamp),
        body=event.get("requestObject"),
    )


def _rfc3339(stamp: str) -> float:
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


class _Process:
    """A process in a session of its own, its output in a log file."""

    def __init__(self, name: str, argv: list[str], log: Path) -> None:
        self.name, self.log = name, log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 15.0) -> None:
        if self.alive():
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait(timeout)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(15)

    def tail(self, limit: int = 4000) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return text[-limit:]


@dataclasses.dataclass
class KubeletSpec:
    """What a kubelet is started with."""

    line: str  # "1.37", the key of tests/interop/_build.KUBELET_LINES
    gates: Mapping[str, bool]
    node: str = "e2e-node"


class Kubelet:
    """A real kubelet (and its fake runtime) for one node; see the module docstring."""

    def __init__(
        self,
        *,
        kubelet_bin: Path,
        fakecri_bin: Path,
        server: KubeApiServer,
        workdir: Path,
        spec: KubeletSpec,
    ) -> None:
        self.bin, self.fakecri_bin, self.server, self.spec = kubelet_bin, fakecri_bin, server, spec
        self.workdir = workdir
        self.root = workdir / "root"
        self.exit_dir = workdir / "exit-requests"
        self.cri_socket = workdir / "fakecri.sock"
        self.api_socket = workdir / "api-relay.sock"
        self._kubelet: _Process | None = None
        self._cri: _Process | None = None
        self._relay: _Process | None = None
        for path in (self.root, self.exit_dir, workdir / "pod-logs", workdir / "sysctl"):
            path.mkdir(parents=True, exist_ok=True)
        user = f"system:node:{spec.node}"
        self.kubeconfig = server.write_kubeconfig(
            workdir / "kubelet.kubeconfig", server.tokens[user], user
        )
        self.config = self._write_config()
        self.api = _api.Api(server)

    @property
    def node(self) -> str:
        return self.spec.node

    @property
    def registry(self) -> Path:
        """The plugins registry a DRA driver registers in (``<root dir>/plugins_registry``)."""
        return self.root / "plugins_registry"

    def plugin_dir(self, driver: str) -> Path:
        return self.root / "plugins" / driver

    @property
    def log_path(self) -> Path:
        """The kubelet's log, every start's output appended."""
        return self.workdir / "kubelet.log"

    @property
    def log(self) -> str:
        return self._kubelet.tail(200_000) if self._kubelet is not None else ""

    def _write_config(self) -> Path:
        endpoint = f"unix://{self.cri_socket}"
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "containerRuntimeEndpoint": endpoint,
            "imageServiceEndpoint": endpoint,
            # A cgroup v1 host: 1.35+ refuse to start on v1 unless told otherwise.
            "failCgroupV1": False,
            "failSwapOn": False,
            "cgroupDriver": "cgroupfs",
            # No pod or QoS cgroups and no node-allocatable enforcement: the kubelet
            # writes nothing into the host's cgroupfs.
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [],
            # The sysctls it checks are faked in its mount namespace: it only reads them.
            "protectKernelDefaults": True,
            "address": "127.0.0.1",
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "podLogsDir": str(self.workdir / "pod-logs"),
            "registerNode": True,
            "nodeStatusUpdateFrequency": "10s",
            "syncFrequency": "10s",
            "evictionHard": {"memory.available": "1Mi"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "resolvConf": "/etc/resolv.conf",
            "serializeImagePulls": False,
            "featureGates": dict(self.spec.gates),
            "maxPods": 30,
        }
        path = self.workdir / "kubelet-config.json"
        path.write_text(json.dumps(config, indent=2) + "\n")
        return path

    def _shell(self) -> str:
        mounts = []
        for key, value in SYSCTLS.items():
            faked = self.workdir / "sysctl" / key.replace("/", ".")
            faked.write_text(f"{value}\n")
            mounts.append(f"mount --bind {faked} /proc/sys/{key}")
        mounts += [
            "mount -t tmpfs -o size=64m e2e-varlib /var/lib",
            "mount -t tmpfs -o size=64m e2e-varlog /var/log",
        ]
        argv = [
            str(self.bin), f"--config={self.config}", f"--kubeconfig={self.kubeconfig}",
            f"--root-dir={self.root}", f"--cert-dir={self.workdir / 'pki'}",
            f"--hostname-override={self.node}", f"--node-ip={NODE_IP}", "--v=2",
        ]  # fmt: skip
        return " && ".join([*mounts, *self._network(), "exec " + " ".join(argv)])

    def _network(self) -> list[str]:
        """Shell steps in the new network namespace: loopback up with the node IP, and the
        relay to the kube-apiserver on its own address (the module docstring)."""
        api = urlsplit(self.server.url)
        ready = self.workdir / "api-relay-netns.ready"
        relay = [
            sys.executable, str(RELAY), f"--listen=tcp:{api.hostname}:{api.port}",
            f"--connect=unix:{self.api_socket}", f"--ready={ready}",
        ]  # fmt: skip
        return [
            "ip link set lo up",
            f"ip addr add {NODE_IP}/32 dev lo",
            f"rm -f {ready}",
            "{ " + " ".join(relay) + " & }",
            f"while [ ! -e {ready} ]; do sleep 0.05; done",
        ]

    def _start_relay(self) -> None:
        """The host's half of the relay: the unix socket to the kube-apiserver's port."""
        if self._relay is not None and self._relay.alive():
            return
        api = urlsplit(self.server.url)
        self.api_socket.unlink(missing_ok=True)
        self._relay = _Process(
            "api-relay",
            [sys.executable, str(RELAY), f"--listen=unix:{self.api_socket}",
             f"--connect=tcp:{api.hostname}:{api.port}"],
            self.workdir / "api-relay.log",
        )  # fmt: skip
        self._wait(self.api_socket.exists, 30, "the API relay's socket")

    @property
    def pid(self) -> int:
        """The kubelet's process (``unshare`` execs the shell, which execs the kubelet)."""
        assert self._kubelet is not None
        return self._kubelet.proc.pid

    def start(self, timeout: float = 120.0) -> None:
        """Start the runtime (if needed) and the kubelet; wait until the Node is Ready."""
        if self._cri is None or not self._cri.alive():
            self._cri = _Process(
                "fakecri",
                [str(self.fakecri_bin), f"--listen={self.cri_socket}",
                 f"--exit-dir={self.exit_dir}"],
                self.workdir / "fakecri.log",
            )  # fmt: skip
            self._wait(self.cri_socket.exists, 30, "the fake CRI socket")
        self._start_relay()
        started = time.time()
        self._kubelet = _Process(
            "kubelet",
            ["unshare", "-m", "-n", "--propagation", "private", "sh", "-c", self._shell()],
            self.log_path,
        )
        self._wait(lambda: self._ready_since(started), timeout, "the Node to be Ready")

    def _ready_since(self, started: float) -> bool:
        assert self._kubelet is not None
        if not self._kubelet.alive():
            raise AssertionError(f"the kubelet exited:\n{self._kubelet.tail()}")
        node = self.api.maybe(f"/api/v1/nodes/{self.node}")
        for cond in ((node or {}).get("status") or {}).get("conditions") or ():
            if cond.get("type") == "Ready" and cond.get("status") == "True":
                heartbeat = _rfc3339(str(cond.get("lastHeartbeatTime", "")))
                return heartbeat >= int(started)
        return False

    def server_json(self, path: str) -> Obj | None:
        api = self.server.api_client()
        try:
            answer = api.call_api(
                path, "GET", auth_settings=["BearerToken"], _preload_content=False,
                response_type=None,
            )  # fmt: skip
            data: Obj = json.loads(answer[0].data)
            return data
        except Exception:
            return None
        finally:
            api.close()

    def kill(self) -> None:
        """SIGKILL the kubelet (the runtime keeps its containers, as a real one would)."""
        if self._kubelet is not None:
            self._kubelet.kill()

    def restart(self, timeout: float = 120.0) -> None:
        self.kill()
        self.start(timeout)

    def stop(self) -> None:
        for proc in (self._kubelet, self._cri, self._relay):
            if proc is not None:
                proc.stop()

    def exit_container(self, namespace: str, pod: str, container: str, code: int = 1) -> None:
        """Make a running container exit with ``code`` (the fake runtime then reports it)."""
        tmp = self.workdir / "exit-request.tmp"
        tmp.write_text(f"{code}\n")
        os.replace(tmp, self.exit_dir / f"{namespace}.{pod}.{container}")

    def _wait(self, predicate: Callable[[], Any], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.2)
        raise AssertionError(
            f"timed out after {timeout:.0f}s waiting for {what}\n"
            f"kubelet log:\n{self._kubelet.tail() if self._kubelet else ''}"
        )
