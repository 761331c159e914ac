"""FakeApiServer: an in-process stand-in for the kube-apiserver, spoken to over real HTTP.

It serves the parts of the Kubernetes API that a node-level DRA health reporter uses to the
official ``kubernetes`` Python client, and follows the real kube-apiserver where client code
can observe it; on top it offers what a test needs and a real server cannot give: fault
injection, a "kubelet" that rewrites container statuses, and a log of every request.
:class:`FakeApiServer` lists what it serves and how. Usage::

    with FakeApiServer() as api:
        api.create_pod(make_pod("p", "node-1", claims=["gpu"]))
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Self

import kubernetes.client

from kubelet_dra.status.podjson import MutableObj
from kubelet_dra.testing.fakeapi import _builders as builders
from kubelet_dra.testing.fakeapi import _cluster as cluster
from kubelet_dra.testing.fakeapi import _faults as faults
from kubelet_dra.testing.fakeapi import _generic as generic
from kubelet_dra.testing.fakeapi import _http as http
from kubelet_dra.testing.fakeapi import _ops as ops
from kubelet_dra.testing.fakeapi import _store as storage
from kubelet_dra.testing.fakeapi._builders import (
    Container,
    PodClaim,
    container_status,
    fresh_container_statuses,
    make_claim,
    make_pod,
)
from kubelet_dra.testing.fakeapi._faults import Fault, RequestRecord
from kubelet_dra.testing.fakeapi._status import ApiError

__all__ = [
    "ApiError",
    "Container",
    "FakeApiServer",
    "Fault",
    "KubeletWriter",
    "PodClaim",
    "RequestRecord",
    "container_status",
    "fresh_container_statuses",
    "make_claim",
    "make_pod",
]

StatusComputer = Callable[[MutableObj], list[MutableObj]]
_STATUS_PATH = re.compile(r"/namespaces/([^/]+)/pods/([^/]+)/status$")


class KubeletWriter:
    """A background thread rewriting container statuses every ``period`` seconds."""

    def __init__(
        self,
        api: FakeApiServer,
        period: float,
        pods: Callable[[], Iterable[tuple[str, str]]],
        compute: StatusComputer,
    ) -> None:
        self.writes = 0
        self._api, self._period, self._pods, self._compute = api, period, pods, compute
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fakeapi-kubelet", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            for namespace, name in list(self._pods()):
                try:
                    self._api.kubelet_write(namespace, name, self._compute)
                except ApiError:
                    continue  # the pod went away between listing and writing
                self.writes += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class FakeApiServer:
    """A kube-apiserver stand-in on 127.0.0.1 with a random port; start it with ``with``.

    It serves the parts of the Kubernetes API that a node-level DRA health reporter uses, to the
    official ``kubernetes`` Python client: pods (list, watch, get, create, delete and the ``status``
    subresource with PUT and all three PATCH flavours), resource.k8s.io/v1 ResourceClaims, and
    core/v1 plus events.k8s.io/v1 Events. Behaviour follows the real kube-apiserver where client
    code can observe it: one global resourceVersion, optimistic concurrency (409), strategic merge
    rules of pod status (conditions merged by type, containerStatuses replaced whole), the KEP-4680
    ``allocatedResourcesStatus`` validation (422), watch semantics including field-selector
    transitions, bookmarks and "410 Expired", and the feature gates ``ResourceHealthStatus`` and
    ``ResourceHealthStatusMessage``. Cluster-scoped resource.k8s.io DeviceTaintRules (``v1``,
    ``v1beta2``, ``v1alpha3``, one storage, validated and defaulted as by ``_fakeapi_cluster``)
    and any type a test serves (``serve_resource``) are entries of one type registry
    (``_fakeapi_generic``), which also answers discovery; all share the store, verbs and watches.

    On top it offers what a test needs and a real server cannot give: fault injection (errors,
    429 with Retry-After, delays, dropped connections, a conflict on each pod's first status
    write), a "kubelet" that rewrites container statuses like the kubelet's status manager, and a
    log of every request.
    """

    def __init__(
        self,
        *,
        token: str | None = "fake-token",
        history_limit: int = 1000,
        bookmark_interval: float = 60.0,
        max_watch_seconds: float | None = None,
    ) -> None:
        self.token = token
        self._store = storage.Store(history_limit=history_limit)
        self._backend = ops.Backend(self._store)
        self._faults = faults.Faults()
        self._log = faults.RequestLog()
        self._types = generic.Types()
        self._context = http.Context(
            backend=self._backend,
            faults=self._faults,
            log=self._log,
            token=token,
            bookmark_interval=bookmark_interval,
            max_watch_seconds=max_watch_seconds,
            types=self._types,
        )
        self._server: http.Server | None = None
        self._thread: threading.Thread | None = None
        self._kubelets: list[KubeletWriter] = []

    # lifecycle

    def start(self) -> Self:
        self._server = http.Server(self._context)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            name="fakeapi",
            kwargs={"poll_interval": 0.05},
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        for writer in self._kubelets:
            writer.stop()
        self._context.stopped.set()
        self._store.end_watches()
        if self._server is not None and self._thread is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()
        self._server = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("FakeApiServer is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    # clients

    def write_kubeconfig(self, path: str | os.PathLike[str]) -> Path:
        """A kubeconfig for ``kubernetes.config.load_kube_config`` (JSON is valid YAML)."""
        user: MutableObj = {"token": self.token} if self.token else {}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fakeapi", "cluster": {"server": self.url}}],
            "users": [{"name": "fakeapi", "user": user}],
            "contexts": [
                {
                    "name": "fakeapi",
                    "context": {"cluster": "fakeapi", "user": "fakeapi", "namespace": "default"},
                }
            ],
            "current-context": "fakeapi",
        }
        target = Path(path)
        target.write_text(json.dumps(config, indent=2))
        return target

    def api_client(self) -> kubernetes.client.ApiClient:
        """A client for this server; close it (or use ``with``) when done."""
        config = kubernetes.client.Configuration()
        config.host = self.url
        if self.token:
            config.api_key = {"authorization": self.token}
            config.api_key_prefix = {"authorization": "Bearer"}
        return kubernetes.client.ApiClient(config)

    # objects, written as trusted setup (kubelet/controller-like, no faults, not logged)

    def create_pod(self, pod: MutableObj) -> MutableObj:
        """Store a pod including its status (a test's shortcut for create + kubelet status)."""
        namespace = (pod.get("metadata") or {}).get("namespace") or "default"
        return self._backend.create(storage.PODS, namespace, pod, keep_status=True)

    def get_pod(self, namespace: str, name: str) -> MutableObj:
        return self._store.get(storage.PODS, namespace, name)

    def list_pods(self, namespace: str | None = None) -> list[MutableObj]:
        return self._store.select(storage.PODS, namespace, storage.Selector(storage.PODS))[0]

    def delete_pod(self, namespace: str, name: str) -> MutableObj:
        return self._store.delete(storage.PODS, namespace, name)

    def set_pod_status(self, namespace: str, name: str, status: MutableObj) -> MutableObj:
        """Replace a pod's status as the kubelet would (gates and validation apply)."""
        return self._backend.set_status(storage.PODS, namespace, name, status)

    def update_pod(
        self, namespace: str, name: str, mutate: Callable[[MutableObj], MutableObj]
    ) -> MutableObj:
        """Rewrite a pod freely (no validation), e.g. to make it stop matching a selector."""
        return self._store.update(storage.PODS, namespace, name, mutate)

    def create_claim(self, claim: MutableObj) -> MutableObj:
        namespace = (claim.get("metadata") or {}).get("namespace") or "default"
        return self._backend.create(storage.CLAIMS, namespace, claim, keep_status=True)

    def get_claim(self, namespace: str, name: str) -> MutableObj:
        return self._store.get(storage.CLAIMS, namespace, name)

    def delete_claim(self, namespace: str, name: str) -> MutableObj:
        return self._store.delete(storage.CLAIMS, namespace, name)

    def set_claim_status(self, namespace: str, name: str, status: MutableObj) -> MutableObj:
        return self._backend.set_status(storage.CLAIMS, namespace, name, status)

    # DeviceTaintRules (cluster-scoped; _fakeapi_cluster)

    def create_device_taint_rule(self, rule: MutableObj) -> MutableObj:
        """Store a rule as someone else would (validated and defaulted, never faulted)."""
        return self._backend.create(cluster.DEVICE_TAINT_RULES["v1"], "", rule)

    def device_taint_rules(self, label_selector: str = "") -> list[MutableObj]:
        res = cluster.DEVICE_TAINT_RULES["v1"]
        return self._store.select(res, "", storage.Selector(res, "", label_selector))[0]

    def delete_device_taint_rule(self, name: str) -> MutableObj:
        return self._store.delete(cluster.DEVICE_TAINT_RULES["v1"], "", name)

    @property
    def device_taint_versions(self) -> tuple[str, ...]:
        """Versions of resource.k8s.io serving devicetaintrules (all three by default)."""
        return self._types.taint_versions

    @device_taint_versions.setter
    def device_taint_versions(self, versions: Iterable[str]) -> None:
        self._types.taint_versions = tuple(versions)

    def events(self, namespace: str | None = None) -> list[MutableObj]:
        """Stored events, core/v1 first, then events.k8s.io/v1."""
        everything = storage.Selector(storage.EVENTS)
        core = self._store.select(storage.EVENTS, namespace, everything)[0]
        return core + self._store.select(storage.EVENTS_V1, namespace, everything)[0]

    # any served type, by group/version and plural (DeviceTaintRules too)

    def serve_resource(
        self, group_version: str, plural: str, kind: str, *, namespaced: bool = False
    ) -> None:
        """Serve another type, e.g. ``("example.com/v1", "widgets", "Widget")``, stored as
        given; until then its URLs answer 404 as on a server without it. For a DeviceTaintRule
        version this switches that version on (see ``device_taint_versions``)."""
        self._types.serve(group_version, plural, kind, namespaced=namespaced)

    def create_object(self, group_version: str, plural: str, obj: MutableObj) -> MutableObj:
        """Store an object as someone else would (the type's write rules, never faulted)."""
        res = self._types.get(group_version, plural)
        namespace = (obj.get("metadata") or {}).get("namespace") or "default"
        return self._backend.create(res, namespace if res.namespaced else "", obj)

    def delete_object(
        self, group_version: str, plural: str, name: str, namespace: str = ""
    ) -> MutableObj:
        res = self._types.get(group_version, plural)
        return self._store.delete(res, namespace if res.namespaced else "", name)

    def objects(
        self, group_version: str, plural: str, label_selector: str = ""
    ) -> list[MutableObj]:
        """The stored objects of a served type, in every namespace, by namespace and name."""
        res = self._types.get(group_version, plural)
        return self._store.select(res, None, storage.Selector(res, "", label_selector))[0]

    @property
    def resource_version(self) -> int:
        return self._store.rv

    # watch control

    def expire_history(self) -> None:
        """Compact: a watch from any resourceVersion before now gets 410 Expired."""
        self._store.expire_history()

    def end_watches(self) -> None:
        """End every open watch now, as a restarting apiserver or a timeout would."""
        self._store.end_watches()

    def send_bookmarks(self) -> None:
        """Make every open watch that allows bookmarks send one now."""
        self._store.request_bookmarks()

    @property
    def max_watch_seconds(self) -> float | None:
        """Upper bound on watch duration (None: the client's timeoutSeconds or 1800 s)."""
        return self._context.max_watch_seconds

    @max_watch_seconds.setter
    def max_watch_seconds(self, seconds: float | None) -> None:
        self._context.max_watch_seconds = seconds

    # feature gates and write behaviour

    @property
    def health_gate(self) -> bool:
        """ResourceHealthStatus; off drops allocatedResourcesStatus from status writes."""
        return self._backend.health_gate

    @health_gate.setter
    def health_gate(self, enabled: bool) -> None:
        # A 1.37 server does not start with ResourceHealthStatusMessage on and
        # ResourceHealthStatus off (gate dependencies): turning this off turns both off.
        self._backend.health_gate = enabled
        if not enabled:
            self._backend.message_gate = False

    @property
    def message_gate(self) -> bool:
        """ResourceHealthStatusMessage; off drops ``message`` from resource health entries."""
        return self._backend.message_gate

    @message_gate.setter
    def message_gate(self, enabled: bool) -> None:
        if enabled and not self._backend.health_gate:
            raise ValueError(
                "ResourceHealthStatusMessage depends on ResourceHealthStatus, which is off"
            )
        self._backend.message_gate = enabled

    @property
    def conflict_first_write(self) -> bool:
        """When on, each pod's first status write (PUT or PATCH) is answered 409 Conflict."""
        return self._backend.conflict_first_write

    @conflict_first_write.setter
    def conflict_first_write(self, enabled: bool) -> None:
        self._backend.conflict_first_write = enabled

    # faults: ``path`` is a regex searched in the URL path; ``method`` None matches any

    def fail(
        self,
        method: str | None,
        path: str,
        *,
        code: int = 500,
        times: int | None = 1,
        retry_after: int | None = None,
        watch: bool | None = None,
    ) -> Fault:
        """Answer matching requests with ``code`` (``times`` None: until cleared)."""
        return self._faults.add(
            Fault(
                "fail",
                method,
                re.compile(path),
                code=code,
                retry_after=retry_after,
                remaining=times,
                watch=watch,
            )
        )

    def delay(
        self,
        method: str | None,
        path: str,
        seconds: float,
        *,
        times: int | None = None,
        watch: bool | None = None,
    ) -> Fault:
        return self._faults.add(
            Fault("delay", method, re.compile(path), seconds=seconds, remaining=times, watch=watch)
        )

    def drop_connection(
        self, method: str | None, path: str, *, times: int | None = 1, watch: bool | None = None
    ) -> Fault:
        """Close the connection without answering matching requests."""
        return self._faults.add(
            Fault("drop", method, re.compile(path), remaining=times, watch=watch)
        )

    def lose_answer(
        self, method: str | None, path: str, *, times: int | None = 1, watch: bool | None = None
    ) -> Fault:
        """Carry out matching requests, then close the connection without the answer.

        What a reset or a stalled connection after the server applied a write looks
        like to its client: the write took effect, the client cannot know it.
        """
        return self._faults.add(
            Fault("lose", method, re.compile(path), remaining=times, watch=watch)
        )

    def clear_fault(self, fault: Fault) -> None:
        self._faults.remove(fault)

    def clear_faults(self) -> None:
        self._faults.clear()

    # the kubelet's status manager

    def kubelet_write(
        self, namespace: str, name: str, compute: StatusComputer | None = None
    ) -> MutableObj:
        """Replace the pod's containerStatuses whole with ``compute(pod)``; always a new RV.

        The default computes what a kubelet unaware of device health writes: the current
        statuses without ``allocatedResourcesStatus``.
        """
        return self._backend.kubelet_write(
            namespace, name, compute or builders.fresh_container_statuses
        )

    def start_kubelet(
        self,
        period: float,
        *,
        pods: Iterable[tuple[str, str]] | None = None,
        compute: StatusComputer | None = None,
    ) -> KubeletWriter:
        """Run :meth:`kubelet_write` every ``period`` seconds (default: on every pod)."""
        chosen = list(pods) if pods is not None else None

        def targets() -> Iterable[tuple[str, str]]:
            if chosen is not None:
                return chosen
            return [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in self.list_pods()]

        writer = KubeletWriter(self, period, targets, compute or builders.fresh_container_statuses)
        self._kubelets.append(writer)
        return writer

    # request log

    @property
    def requests(self) -> list[RequestRecord]:
        return self._log.snapshot()

    def reset_log(self) -> None:
        self._log.clear()

    def count(
        self, method: str | None = None, path: str | None = None, *, code: int | None = None
    ) -> int:
        """Requests matching a method, a path regex and an answer code."""
        pattern = re.compile(path) if path is not None else None
        return sum(
            1
            for r in self.requests
            if (method is None or r.method == method.upper())
            and (pattern is None or pattern.search(r.path))
            and (code is None or r.status == code)
        )

    def status_writes(
        self, namespace: str | None = None, name: str | None = None
    ) -> list[RequestRecord]:
        """PUT and PATCH requests on pods/<name>/status, optionally for one pod."""
        found = []
        for record in self.requests:
            match = _STATUS_PATH.search(record.path)
            if record.method not in ("PUT", "PATCH") or match is None:
                continue
            if namespace in (None, match[1]) and name in (None, match[2]):
                found.append(record)
        return found

    def wait_for(self, predicate: Callable[[], bool], *, timeout: float = 5.0) -> None:
        """Poll ``predicate`` until true; AssertionError at the deadline (no blind sleeps)."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() >= deadline:
                raise AssertionError(f"condition not met within {timeout} s")
            time.sleep(0.01)
