"""Where ``kubectl dra-health`` connects: kubeconfig files as kubectl merges them, or in-cluster.

Follows client-go's loading rules (``clientcmd.ClientConfigLoadingRules``), which the Python
client's own merger does not (it lets the last file's ``current-context`` win).
:func:`connect` has the order of the sources and how the namespace is chosen.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Mapping
from typing import Any

import kubernetes.client
import kubernetes.config
import yaml
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.incluster_config import InClusterConfigLoader

from kubelet_dra.kubectl._api import ToolError
from kubelet_dra.status import podjson

SERVICE_ACCOUNT_DIR = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount")
_CLUSTER_PATHS = ("certificate-authority",)
_USER_PATHS = ("client-certificate", "client-key", "tokenFile")


@dataclasses.dataclass
class Connection:
    client: kubernetes.client.ApiClient
    namespace: str  # the context's (or the pod's) namespace
    source: str  # what configured it, for messages


def connect(
    kubeconfig: str | None,
    context: str | None,
    *,
    environ: Mapping[str, str] = os.environ,
    serviceaccount_dir: pathlib.Path = SERVICE_ACCOUNT_DIR,
) -> Connection:
    """The API server and credentials to use, in client-go's order of sources:

    - ``--kubeconfig FILE``: that file only (it must exist);
    - else ``KUBECONFIG``, a list separated by ``os.pathsep``: files that exist are merged, the
      first file to define a cluster, user or context name wins it, and the first
      ``current-context`` set wins; relative certificate, key and token file paths are resolved
      against the directory of the file that names them;
    - else ``~/.kube/config`` if it exists;
    - when that gives no configuration: the in-cluster service account (``KUBERNETES_SERVICE_HOST``
      and the token mounted in the pod); else an error.

    ``--context`` picks another context. The namespace is ``-n``, else the context's, else (in a
    cluster) ``POD_NAMESPACE`` or the service account's namespace file, else ``default``.
    """
    files = _config_files(kubeconfig, environ)
    merged = merge_files(files)
    if _is_empty(merged) and context is None:
        if environ.get("KUBERNETES_SERVICE_HOST"):
            return _in_cluster(environ, serviceaccount_dir)
        raise ToolError(
            "no configuration: pass --kubeconfig, set KUBECONFIG, create ~/.kube/config "
            "or run in a pod"
        )
    config = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_kube_config_from_dict(  # type: ignore[no-untyped-call]
            merged, context=context, client_configuration=config, persist_config=False
        )
    except (ConfigException, KeyError, TypeError, ValueError) as exc:
        where = ", ".join(str(f) for f in files)
        raise ToolError(f"kubeconfig {where}: {exc}") from exc
    return Connection(
        _client(config), _context_namespace(merged, context), ", ".join(str(f) for f in files)
    )


def _client(config: kubernetes.client.Configuration) -> kubernetes.client.ApiClient:
    client = kubernetes.client.ApiClient(config)
    client.user_agent = "kubectl-dra_health"
    return client


def _config_files(kubeconfig: str | None, environ: Mapping[str, str]) -> list[pathlib.Path]:
    if kubeconfig:
        path = pathlib.Path(kubeconfig).expanduser()
        if not path.is_file():
            raise ToolError(f"kubeconfig {kubeconfig}: no such file")
        return [path]
    listed = environ.get("KUBECONFIG", "")
    if listed:
        paths = [pathlib.Path(p).expanduser() for p in listed.split(os.pathsep) if p]
        return list(dict.fromkeys(p for p in paths if p.is_file()))
    home = pathlib.Path(environ.get("HOME") or pathlib.Path.home()) / ".kube" / "config"
    return [home] if home.is_file() else []


def merge_files(files: list[pathlib.Path]) -> dict[str, Any]:
    """client-go's merge: the first definition of every name, the first current-context."""
    merged: dict[str, Any] = {"apiVersion": "v1", "kind": "Config"}
    named: dict[str, dict[str, Any]] = {"clusters": {}, "users": {}, "contexts": {}}
    for path in files:
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ToolError(f"kubeconfig {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise ToolError(f"kubeconfig {path}: not a mapping")
        if data.get("current-context") and not merged.get("current-context"):
            merged["current-context"] = data["current-context"]
        for section, inner, keys in (
            ("clusters", "cluster", _CLUSTER_PATHS),
            ("users", "user", _USER_PATHS),
            ("contexts", "context", ()),
        ):
            for item in data.get(section) or ():
                if isinstance(item, dict) and item.get("name") not in named[section]:
                    named[section][str(item.get("name"))] = _absolute(item, inner, keys, path)
    for section, items in named.items():
        merged[section] = list(items.values())
    return merged


def _absolute(
    item: dict[str, Any], inner: str, keys: tuple[str, ...], path: pathlib.Path
) -> dict[str, Any]:
    body = dict(podjson.child(item, inner))
    for key in keys:
        value = body.get(key)
        if isinstance(value, str) and value and not os.path.isabs(value):
            body[key] = str((path.parent / value).resolve())
    return {**item, inner: body}


def _is_empty(merged: Mapping[str, Any]) -> bool:
    return not (merged.get("clusters") or merged.get("contexts") or merged.get("users"))


def _context_namespace(merged: Mapping[str, Any], context: str | None) -> str:
    name = context or merged.get("current-context")
    for item in merged.get("contexts") or ():
        if item.get("name") == name:
            return str(podjson.child(item, "context").get("namespace") or "default")
    return "default"


def _in_cluster(environ: Mapping[str, str], directory: pathlib.Path) -> Connection:
    config = kubernetes.client.Configuration()
    try:
        InClusterConfigLoader(  # type: ignore[no-untyped-call]
            token_filename=str(directory / "token"),
            cert_filename=str(directory / "ca.crt"),
            environ=environ,
        ).load_and_set(config)
    except ConfigException as exc:
        raise ToolError(f"in-cluster configuration: {exc}") from exc
    namespace = environ.get("POD_NAMESPACE", "")
    if not namespace:
        try:
            namespace = (directory / "namespace").read_text().strip()
        except OSError:
            namespace = ""
    return Connection(_client(config), namespace or "default", "in-cluster service account")
