"""One version, stated in ``kubelet_dra/__init__.py``, and the copies a file format forces.

Mirrors no kubelet file. pyproject.toml reads the version from ``kubelet_dra.__version__``
(``[tool.setuptools.dynamic]``); the Helm chart's ``appVersion`` and the DaemonSet's image
tag cannot read it, so they are compared with it here. Both console scripts print it alone
on a line (the ``--version`` contract). ``tox -e package`` checks the same against the built
and installed wheel.
"""

from __future__ import annotations

import pathlib
import re
import tomllib

import pytest
import yaml

import kubelet_dra
from kubelet_dra import cli
from kubelet_dra.kubectl import _cli as kubectl_cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
SEMVER = re.compile(r"\d+\.\d+\.\d+(?:[-.]?(?:a|b|rc|dev|post)\d+)?")


def test_the_version_is_a_release_number() -> None:
    assert SEMVER.fullmatch(kubelet_dra.__version__), kubelet_dra.__version__


def test_pyproject_reads_the_version_from_the_package() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"]
    assert "version" in pyproject["project"]["dynamic"]
    dynamic = pyproject["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "kubelet_dra.__version__"}


def test_the_chart_app_version_is_the_package_version() -> None:
    chart = yaml.safe_load((ROOT / "deploy/helm/kubelet-dra-health/Chart.yaml").read_text())
    assert str(chart["appVersion"]) == kubelet_dra.__version__


def test_the_daemonset_image_tag_is_the_package_version() -> None:
    docs = yaml.safe_load_all((ROOT / "deploy/daemonset.yaml").read_text())
    daemonset = next(d for d in docs if d and d.get("kind") == "DaemonSet")
    images = [c["image"] for c in daemonset["spec"]["template"]["spec"]["containers"]]
    assert [i.rsplit(":", 1)[-1] for i in images] == [kubelet_dra.__version__] * len(images)


@pytest.mark.parametrize(
    "main", [cli.main, kubectl_cli.main], ids=["kubelet-dra-health", "kubectl-dra_health"]
)
def test_version_prints_the_package_version_alone(main, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"{kubelet_dra.__version__}\n"
