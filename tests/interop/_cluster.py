"""One interface over the real kube-apiserver and the FakeApiServer, and our sidecar process.

:class:`RealCluster` writes objects the way the control plane would without a scheduler or a
kubelet: a pod is created with ``spec.nodeName`` set and its initial status is then written
with a status update (as a kubelet would), a ResourceClaim is created and its allocation
written with a status update. :class:`FakeCluster` does the same on a ``FakeApiServer``, so a
test can run one assertion against both. Objects are plain dicts from the test kit's builders
(``make_pod``, ``make_claim``), read back as the server's JSON.

:class:`SidecarProcess` runs ``python -m kubelet_dra run`` against either, with the driver's
registry, a state dir and a metrics port, and reads its log and metrics.
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kubelet_dra.status.podjson import MutableObj as Obj
from kubelet_dra.testing import FakeApiServer, eventually_sync
from kubelet_dra.testing._eventually import describe
from tests.integration._sidecar_process import SidecarExited

from ._apiserver import KubeApiServer

ROOT = Path(__file__).resolve().parents[2]
SMP = "application/strategic-merge-patch+json"
FAST_ENV = {
    "KUBELET_DRA_REGISTRY_POLL_INTERVAL": "0.05",
    "KUBELET_DRA_REGISTRATION_BACKOFF_INITIAL": "0.05",
    "KUBELET_DRA_STREAM_BACKOFF_INITIAL": "0.05",
    "KUBELET_DRA_STREAM_BACKOFF_MAX": "0.2",
    "KUBELET_DRA_WRITE_WINDOW": "0.02",
    "KUBELET_DRA_STORE_FLUSH_INTERVAL": "0.05",
}
_ADDRESS = re.compile(r"metrics, /healthz and /readyz on http://(\S+)")


def poll(predicate: Callable[[], Any], timeout: float, what: str, on_fail: str = "") -> Any:
    """:func:`eventually_sync` with text to add to its failure; returns the truthy value."""
    try:
        return eventually_sync(predicate, what=what or None, timeout=timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{on_fail}".rstrip()) from None


class Cluster(Protocol):
    """What the sidecar tests need of an API server."""

    name: str

    def write_kubeconfig(self, path: Path, token: str | None = None) -> Path: ...
    def create_pod(self, pod: Obj) -> Obj: ...
    def create_claim(self, claim: Obj) -> Obj: ...
    def get_pod(self, namespace: str, name: str) -> Obj: ...
    def patch_status(
        self, namespace: str, name: str, body: Obj, content_type: str = SMP
    ) -> Obj: ...
    def events(self, namespace: str) -> list[Obj]: ...
    def ensure_namespace(self, namespace: str) -> None: ...


class RealCluster:
    """The real kube-apiserver through the admin client (raw JSON in and out)."""

    name = "kube-apiserver"

    def __init__(self, server: KubeApiServer) -> None:
        self.server = server
        self.api = server.api_client()
        self.core = client.CoreV1Api(self.api)
        self.resource = client.ResourceV1Api(self.api)

    def close(self) -> None:
        self.api.close()

    def write_kubeconfig(self, path: Path, token: str | None = None) -> Path:
        return self.server.write_kubeconfig(path, token or self.server.admin_token)

    def ensure_namespace(self, namespace: str) -> None:
        try:
            self.core.create_namespace({"metadata": {"name": namespace}})
        except ApiException as exc:
            if exc.status != 409:
                raise

    def create_pod(self, pod: Obj) -> Obj:
        """Create, then write the initial status as the kubelet would (status update)."""
        pod = copy.deepcopy(pod)
        namespace = pod["metadata"].get("namespace") or "default"
        self.ensure_namespace(namespace)
        initial = pod.pop("status", None)
        created = _json(self.core.create_namespaced_pod(namespace, pod, _preload_content=False))
        if initial is None:
            return created
        created["status"] = initial
        return _json(
            self.core.replace_namespaced_pod_status(
                created["metadata"]["name"], namespace, created, _preload_content=False
            )
        )

    def create_claim(self, claim: Obj) -> Obj:
        """Create, then write ``status.allocation`` (and reservedFor) with a status update."""
        claim = copy.deepcopy(claim)
        namespace = claim["metadata"].get("namespace") or "default"
        self.ensure_namespace(namespace)
        status = claim.pop("status", None)
        created = _json(
            self.resource.create_namespaced_resource_claim(namespace, claim, _preload_content=False)
        )
        if status is None:
            return created
        created["status"] = status
        return _json(
            self.resource.replace_namespaced_resource_claim_status(
                created["metadata"]["name"], namespace, created, _preload_content=False
            )
        )

    def get_pod(self, namespace: str, name: str) -> Obj:
        return _json(self.core.read_namespaced_pod(name, namespace, _preload_content=False))

    def patch_status(self, namespace: str, name: str, body: Obj, content_type: str = SMP) -> Obj:
        return _json(
            self.core.patch_namespaced_pod_status(
                name, namespace, body, _content_type=content_type, _preload_content=False
            )
        )

    def events(self, namespace: str) -> list[Obj]:
        items: list[Obj] = _json(
            self.core.list_namespaced_event(namespace, _preload_content=False)
        )["items"]
        return items


class FakeCluster:
    """The same operations on a ``FakeApiServer`` (pods are stored with their status)."""

    name = "FakeApiServer"

    def __init__(self, server: FakeApiServer) -> None:
        self.server = server
        self.api = server.api_client()
        self.core = client.CoreV1Api(self.api)

    def close(self) -> None:
        self.api.close()

    def write_kubeconfig(self, path: Path, token: str | None = None) -> Path:
        return self.server.write_kubeconfig(path)

    def ensure_namespace(self, namespace: str) -> None:
        """The stand-in has no namespace objects."""

    def create_pod(self, pod: Obj) -> Obj:
        return self.server.create_pod(copy.deepcopy(pod))

    def create_claim(self, claim: Obj) -> Obj:
        return self.server.create_claim(copy.deepcopy(claim))

    def get_pod(self, namespace: str, name: str) -> Obj:
        return self.server.get_pod(namespace, name)

    def patch_status(self, namespace: str, name: str, body: Obj, content_type: str = SMP) -> Obj:
        return _json(
            self.core.patch_namespaced_pod_status(
                name, namespace, body, _content_type=content_type, _preload_content=False
            )
        )

    def events(self, namespace: str) -> list[Obj]:
        return self.server.events(namespace)


def _json(response: Any) -> Obj:
    data: Obj = json.loads(response.data)
    return data


def error_body(exc: ApiException) -> Obj:
    body: Obj = json.loads(exc.body or "{}")
    return body


# -- the sidecar ---------------------------------------------------------------------------


def sidecar_env(**extra: str) -> dict[str, str]:
    """The caller's environment without its KUBELET_DRA_*/NODE_NAME/KUBECONFIG, the package
    importable from the repository root, and fast polling for tests."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("KUBELET_DRA_") and k not in ("NODE_NAME", "KUBECONFIG")
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(FAST_ENV)
    env.update(extra)
    return env


class SidecarProcess:
    """``python -m kubelet_dra run`` as a subprocess; its stderr is collected line by line."""

    def __init__(
        self,
        *,
        node: str,
        kubeconfig: Path,
        registry: Path,
        state_dir: Path,
        flags: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.argv = [
            sys.executable, "-m", "kubelet_dra", "run", "--node-name", node,
            "--kubeconfig", str(kubeconfig), "--plugins-registry", str(registry),
            "--state-dir", str(state_dir), "--metrics-address", "127.0.0.1:0",
            "--pod-resources-socket", "", *flags,  # not the host's kubelet; a test's flag wins
        ]  # fmt: skip
        self.env = sidecar_env(**(env or {}))
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> SidecarProcess:
        self.proc = subprocess.Popen(
            self.argv, cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        self._reader = threading.Thread(target=self._read, name="sidecar-log", daemon=True)
        self._reader.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.stop()
        if exc_type is not None:
            # A plain assert in the test says nothing of why: the log goes to the
            # captured stdout pytest prints with the failure.
            print(f"sidecar log (last 6000 characters):\n{self.log[-6000:]}")

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for raw in self.proc.stderr:
            with self._lock:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    @property
    def log(self) -> str:
        with self._lock:
            return "\n".join(self.lines)

    def grep(self, pattern: str) -> list[str]:
        found = re.compile(pattern)
        with self._lock:
            return [line for line in self.lines if found.search(line)]

    def check_running(self) -> None:
        assert self.proc is not None
        code = self.proc.poll()
        if code is not None:
            raise SidecarExited(f"sidecar exited with {code}:\n{self.log[-6000:]}")

    def until(
        self,
        predicate: Callable[[], Any],
        timeout: float = 15.0,
        what: str = "",
        detail: Callable[[], str] | None = None,
    ) -> Any:
        """Poll ``predicate`` while the sidecar runs; fail with its log (and ``detail()``)
        at the deadline."""

        def check() -> Any:
            self.check_running()
            return predicate()

        try:
            return poll(check, timeout, what or describe(predicate))
        except AssertionError as exc:
            extra = f"\n{detail()}" if detail is not None else ""
            raise AssertionError(f"{exc}{extra}\nsidecar log:\n{self.log[-6000:]}") from None

    def metrics_url(self) -> str:
        line = self.until(lambda: self.grep(_ADDRESS.pattern), 15, "the metrics address")[0]
        found = _ADDRESS.search(line)
        assert found is not None
        return f"http://{found[1]}/metrics"

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics: ``name{labels}`` -> value."""
        with urllib.request.urlopen(self.metrics_url(), timeout=5) as answer:
            text = answer.read().decode()
        samples: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples

    def metric(self, name: str) -> float:
        return self.metrics().get(name, 0.0)

    def stop(self) -> int | None:
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._reader is not None:
            self._reader.join(5)
        if proc.stderr is not None:
            proc.stderr.close()
        return proc.returncode


def container_status(pod: Obj, name: str) -> Obj:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == name:
            found: Obj = cs
            return found
    raise KeyError(name)


def health_entries(pod: Obj, container: str = "main") -> dict[str, list[tuple[str, str, str]]]:
    """allocatedResourcesStatus of one container: name -> [(resourceID, health, message)]."""
    try:
        cs = container_status(pod, container)
    except KeyError:
        return {}
    return {
        entry["name"]: [
            (r.get("resourceID", ""), r.get("health", ""), r.get("message", ""))
            for r in entry.get("resources") or []
        ]
        for entry in cs.get("allocatedResourcesStatus") or []
    }


def condition(pod: Obj, kind: str) -> Obj | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            found: Obj = cond
            return found
    return None


def iter_pods(cluster: Cluster, namespace: str, names: list[str]) -> Iterator[Obj]:
    for name in names:
        yield cluster.get_pod(namespace, name)
