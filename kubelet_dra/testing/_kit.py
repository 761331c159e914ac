"""The test kit's set-up helpers: a short socket directory, ``Settings`` in it, a node agent's pods.

No kubelet counterpart: these stand in for what a node provides (``/var/lib/kubelet``,
the plugin registry) and for the kubelet's status manager, which receives the DRA
manager's updates (``pkg/kubelet/cm/dra/manager.go``'s ``Updates()``) and merges them
into the pod status it writes. The pytest plugin (``pytest_plugin``) builds its
fixtures from them; code without pytest can use them directly.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from typing import Any

from kubelet_dra.agentpods import PodHealthUpdate
from kubelet_dra.settings import Settings
from kubelet_dra.status.podstatus import merge as merge_pod_status
from kubelet_dra.testing._podhealth import PodDeviceHealth, pod_device_health

__all__ = ["PodStore", "make_settings", "socket_dir"]

#: ``sun_path`` holds 108 bytes with its terminating NUL.
SOCKET_PATH_MAX = 107
#: Room a directory must leave: ``reg/<63-byte driver name>-reg.sock`` and
#: ``plugins/<name>/dra.sock`` below it, plus the random part of the name.
_ROOM = len("/plugins/") + 63 + len("/dra.sock") + len("/kdXXXXXXXX")


def socket_dir(
    parent: str | os.PathLike[str] | None = None,
) -> contextlib.AbstractContextManager[pathlib.Path]:
    """A new short directory for unix sockets, removed with everything in it on exit.

    Under ``parent``, else the system's temporary directory when it is short enough for
    the longest socket path a driver name allows, else ``/tmp`` (macOS's ``$TMPDIR`` and
    pytest's ``tmp_path`` are too long).
    """
    return _socket_dir(pathlib.Path(parent) if parent is not None else _short_parent())


def _short_parent() -> pathlib.Path:
    default = pathlib.Path(tempfile.gettempdir())
    if len(os.fsencode(default)) + _ROOM <= SOCKET_PATH_MAX:
        return default
    return pathlib.Path("/tmp")


@contextlib.contextmanager
def _socket_dir(parent: pathlib.Path) -> Iterator[pathlib.Path]:
    path = pathlib.Path(tempfile.mkdtemp(prefix="kd", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def make_settings(root: str | os.PathLike[str], **overrides: Any) -> Settings:
    """:class:`~kubelet_dra.Settings` for a test, every path under ``root``.

    ``plugins_registry`` is ``<root>/reg`` (created), ``state_dir`` ``<root>/state``; the
    kubelet's PodResources API and root dir are not read (``pod_resources_socket=None``,
    ``kubelet_root_dir=None``: a :class:`FakePodResources` socket is an override), ``node_name`` is
    ``node-1`` and the registry is polled every 0.1 s. Every other field keeps its
    default, and none is read from the environment (a developer's ``KUBECONFIG`` or
    ``KUBELET_DRA_*`` does not reach a test). ``overrides`` are fields by name.
    """
    root = pathlib.Path(root)
    values: dict[str, Any] = {
        name: field.get_default(call_default_factory=True)
        for name, field in Settings.model_fields.items()
    }
    values.update(
        plugins_registry=root / "reg",
        state_dir=root / "state",
        kubelet_root_dir=None,
        pod_resources_socket=None,
        node_name="node-1",
        registry_poll_interval=0.1,
    )
    values.update(overrides)
    # Every field is given: an argument wins over its environment variable.
    settings = Settings(**values)
    settings.plugins_registry.mkdir(parents=True, exist_ok=True)
    return settings


class PodStore:
    """A node agent's own pods, with each :class:`~kubelet_dra.PodHealthUpdate` merged in.

    Pass :meth:`on_status` as the manager's callback; :meth:`health` reads what a
    kubelet would have written into the pod's status.
    """

    def __init__(self, *, condition_type: str = "DeviceHealthy") -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.updates: list[PodHealthUpdate] = []
        """Every update received, in order."""
        self.condition_type = condition_type

    def add(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        """Keep a copy of ``pod`` (a uid ``uid-<name>`` is given if it has none); return it."""
        copy = dict(pod)
        metadata = copy["metadata"] = dict(copy.get("metadata") or {})
        metadata.setdefault("uid", f"uid-{metadata.get('name', len(self.pods))}")
        self.pods[metadata["uid"]] = copy
        return copy

    def on_status(self, update: PodHealthUpdate) -> None:
        """The manager's ``on_status`` callback: merge the desired status into the pod."""
        self.updates.append(update)
        pod = self.pods.get(update.pod_uid)
        if pod is not None:
            pod["status"], _ = merge_pod_status(pod.get("status"), update.desired, now=time.time())

    def health(self, uid: str) -> PodDeviceHealth:
        """The device health in pod ``uid``'s status (:func:`pod_device_health`)."""
        return pod_device_health(self.pods[uid], condition_type=self.condition_type)
