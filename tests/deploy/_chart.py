"""Render the Helm chart in ``deploy/helm/kubelet-dra-health`` with the real ``helm``.

Shared by the chart's tests and the interop test that applies a rendering to a real
kube-apiserver. Values are passed as a YAML file (``-f``), so their types reach the
templates as written, and the Kubernetes version as ``--kube-version``: without a cluster,
a Helm 3 built from source assumes Kubernetes 1.20 and refuses the chart's ``kubeVersion``
(the chart's README says so).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from kubelet_dra.status.podjson import MutableObj as Obj
from tests.interop import _build

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "kubelet-dra-health"
DEPLOY = ROOT / "deploy"
MONITORING = DEPLOY / "monitoring"
RELEASE = NAMESPACE = "kubelet-dra-health"
#: The Kubernetes version ``helm template`` and ``helm lint`` render for: the kube-apiserver
#: and kubelet the project tests against.
KUBE_VERSION = "1.37.2"
#: The Helm builds of ``tests/interop/_build.py`` the chart's tests run with, and the
#: version ``helm version --short`` prints for each.
HELMS = {"helm": _build.HELM_VERSION, "helm3": _build.HELM3_VERSION}
#: Labels the chart adds to every object's metadata, and nothing else differs from deploy/.
HELM_LABELS = {
    "app.kubernetes.io/instance": RELEASE,
    "app.kubernetes.io/managed-by": "Helm",
    "app.kubernetes.io/version": "0.1.0",
    "helm.sh/chart": "kubelet-dra-health-0.1.0",
}


class HelmError(Exception):
    """helm exited non-zero; the message is its stderr."""


def run_helm(helm: Path, *args: str, timeout: float = 120, kubeconfig: Path | None = None) -> str:
    # A home of its own: no repository, plugin or registry configuration of the user's
    # leaks in, and nothing is left behind. No cluster unless ``kubeconfig`` names one.
    with tempfile.TemporaryDirectory(prefix="helm-home-") as home:
        env = {"HOME": home, "PATH": "/usr/bin:/bin"}
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        proc = subprocess.run(
            [str(helm), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=env,
        )
    if proc.returncode != 0:
        raise HelmError(proc.stderr.strip() or proc.stdout.strip())
    return proc.stdout


def render(
    helm: Path,
    values: Mapping[str, Any] | None = None,
    *,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
) -> list[Obj]:
    """``helm template`` with ``values``; the parsed objects in rendering order."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
        json.dump(dict(values or {}), file)
        file.flush()
        text = run_helm(
            helm,
            "template",
            release,
            str(CHART),
            "--namespace",
            namespace,
            "--kube-version",
            KUBE_VERSION,
            "-f",
            file.name,
        )
    return [d for d in yaml.safe_load_all(text) if d is not None]


def by_kind(objects: list[Obj]) -> dict[str, list[Obj]]:
    out: dict[str, list[Obj]] = {}
    for obj in objects:
        out.setdefault(obj["kind"], []).append(obj)
    return out


def one(objects: list[Obj], kind: str) -> Obj:
    found = by_kind(objects).get(kind, [])
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def deploy_objects() -> list[Obj]:
    """The objects of ``deploy/``, in the kustomization's order."""
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text(encoding="utf-8"))
    objects: list[Obj] = []
    for name in kustomization["resources"]:
        text = (DEPLOY / name).read_text(encoding="utf-8")
        objects += [d for d in yaml.safe_load_all(text) if d is not None]
    return objects
