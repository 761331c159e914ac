"""The Prometheus Operator's real CRDs (ServiceMonitor, PrometheusRule), fetched at test time.

Mirrors no kubelet file. The interop API server has no ``monitoring.coreos.com`` group; to
validate the chart's ServiceMonitor and PrometheusRule (and ``deploy/monitoring``'s
PrometheusRule) against the schemas users' clusters really have, the tests install the
operator's own CRDs. They are third-party files, so they are not committed: the Go module
``github.com/prometheus-operator/prometheus-operator`` at a pinned release ships them under
``example/prometheus-operator-crd/``, and ``go mod download`` fetches that module through the
module proxy into Go's module cache (so a second run reads the cache; the zip's hash is
checked against :data:`MODULE_SUM`, the ``h1:`` sum of go.sum).

Without Go or the proxy, :func:`operator_crds` raises :class:`_build.BuildUnavailable` with a
reason meant for ``pytest.skip``.
"""

from __future__ import annotations

import functools
import json
import subprocess
import tempfile
from pathlib import Path

import yaml

from kubelet_dra.status.podjson import MutableObj as Obj

from . import _build

MODULE = "github.com/prometheus-operator/prometheus-operator"
VERSION = "v0.85.0"
#: go.sum's hash of the module zip at VERSION: a changed upstream file is an error.
MODULE_SUM = "h1:M5xLCLEoaW2IJfnuCwFzzpL+jSVQu3KGT84Pye+fW8s="
CRD_DIR = "example/prometheus-operator-crd"
#: kind -> file in CRD_DIR.
CRD_FILES = {
    "ServiceMonitor": "monitoring.coreos.com_servicemonitors.yaml",
    "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml",
}


def _download() -> Path:
    """The module's directory in Go's module cache (downloading it through the proxy)."""
    reason = _build.go_unavailable_reason()
    if reason is not None:
        raise _build.BuildUnavailable(reason)
    # Outside any module (a fresh directory), so no go.mod or go.work takes part.
    with tempfile.TemporaryDirectory(prefix="kdh-crds-") as cwd:
        try:
            proc = subprocess.run(
                ["go", "mod", "download", "-json", f"{MODULE}@{VERSION}"],
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=_build.DOWNLOAD_TIMEOUT,
                env=_build._go_env(),
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise _build.BuildUnavailable(
                f"downloading {MODULE}@{VERSION} timed out (is the Go module proxy reachable?)"
            ) from None
    # On failure `go mod download -json` still prints JSON, with an "Error" field.
    try:
        info = json.loads(proc.stdout)
    except json.JSONDecodeError:
        info = {"Error": proc.stderr.strip()[-600:]}
    if proc.returncode != 0 or info.get("Error"):
        raise _build.BuildUnavailable(
            f"cannot download {MODULE}@{VERSION} (is the Go module proxy reachable?): "
            f"{info.get('Error') or proc.stderr.strip()[-600:]}"
        )
    if info.get("Sum") != MODULE_SUM:
        raise AssertionError(f"{MODULE}@{VERSION}: sum {info.get('Sum')!r}, want {MODULE_SUM!r}")
    return Path(info["Dir"])


@functools.cache
def operator_crds() -> dict[str, Obj]:
    """kind -> the CustomResourceDefinition object (parsed), of the pinned release."""
    directory = _download() / CRD_DIR
    crds: dict[str, Obj] = {}
    for kind, name in CRD_FILES.items():
        crd = yaml.safe_load((directory / name).read_text())
        if crd.get("kind") != "CustomResourceDefinition" or crd["spec"]["names"]["kind"] != kind:
            raise AssertionError(f"{name} of {MODULE}@{VERSION} is not the {kind} CRD")
        crds[kind] = crd
    return crds
