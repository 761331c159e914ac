"""The image's inputs agree: deploy/image/build.py, deploy/Containerfile, the chart, the DaemonSet.

Both ways of building the image (``tox -e image`` without a registry, the Containerfile with
one) read deploy/image/packages.txt, requirements.txt, prune.txt and precompile.py; these
tests check that the Containerfile uses each of them and nothing else, with the same user,
entry point and environment as build.py's ``CONFIG``; that requirements.txt is the whole
closure of the wheel's requirements but for what prune.txt's removal leaves unused; and that
the chart and the DaemonSet name the image the build tags. No build here (tests/image).
"""

from __future__ import annotations

import importlib.metadata
import json
import pathlib
import re
import tomllib

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

import kubelet_dra
from tests.image._build import ROOT, load_build

build = load_build()
CONTAINERFILE = (ROOT / "deploy/Containerfile").read_text(encoding="utf-8")
# Required by kubernetes but imported only by kubernetes.aio, which prune.txt removes.
ASYNC_ONLY = {
    "aiohttp",
    "aiohttp-retry",
    "aiohappyeyeballs",
    "aiosignal",
    "attrs",
    "frozenlist",
    "multidict",
    "propcache",
    "yarl",
}


def _instruction(name: str) -> list[str]:
    return re.findall(rf"^{name} (.+)$", CONTAINERFILE, re.MULTILINE)


def test_containerfile_reads_the_same_inputs() -> None:
    copied = " ".join(_instruction("COPY"))
    for name in ("packages.txt", "requirements.txt", "prune.txt", "precompile.py"):
        assert f"deploy/image/{name}" in copied, name
    assert (
        "apt-get install -y --no-install-recommends $(sed 's/#.*//' /tmp/image/packages.txt)"
        in (CONTAINERFILE)
    )
    assert "pip wheel --no-deps -w /wheels -r /wheels/requirements.txt" in CONTAINERFILE
    assert "install --no-index --no-deps --no-compile" in CONTAINERFILE
    assert "$(sed 's/#.*//' /tmp/image/prune.txt)" in CONTAINERFILE
    assert f"/usr/local/lib/{build.PYTHON}/dist-packages/$p" in CONTAINERFILE
    assert f"usr/local/lib/{build.PYTHON}/dist-packages" == build.SITE
    assert "PYTHONHASHSEED=0 PYTHONDONTWRITEBYTECODE=1 python3.11 /tmp/image/precompile.py" in (
        CONTAINERFILE
    )
    # The same Debian release and interpreter, and the same pip.
    assert all(f":{build.SUITE}-slim" in line for line in _instruction("FROM"))
    assert build.PYTHON == "python3.11" and build.PYTHON in build.debian_packages()
    assert build.PIP in CONTAINERFILE and build.PIP.replace("==", "-") in CONTAINERFILE


def test_containerfile_has_the_same_config() -> None:
    config = build.CONFIG
    assert _instruction("ENTRYPOINT") == [json.dumps(config["entrypoint"])]
    assert _instruction("CMD") == [json.dumps(config["cmd"])]
    assert _instruction("USER") == [config["user"]]
    assert _instruction("WORKDIR")[-1] == config["workingdir"]
    env = dict(re.findall(r"^(?:ENV )?\s*(\w+)=(\S+?)(?: \\)?$", CONTAINERFILE, re.MULTILINE))
    assert {k: env.get(k) for k in config["env"]} == config["env"]
    uid, gid = config["user"].split(":")
    assert f"nonroot:x:{uid}:{gid}:" in CONTAINERFILE and f"nonroot:x:{gid}:" in CONTAINERFILE
    assert int(uid) == build.NONROOT


def test_every_line_is_pinned_and_known() -> None:
    pins = build.requirements()
    assert all(re.fullmatch(r"[0-9][0-9a-z.+]*", v) for v in pins.values()), pins
    assert build.sdist_only() == {"sqlitedict"}
    assert build.lines(build.PRUNE) == ["kubernetes/aio"]


def _requires(name: str) -> list[Requirement]:
    """``name``'s runtime requirements: ours from pyproject.toml (the installed metadata of
    an editable install can be older), the others' from their installed metadata."""
    if name == "kubelet-dra":
        with (ROOT / "pyproject.toml").open("rb") as f:
            texts = tomllib.load(f)["project"]["dependencies"]
    else:
        texts = importlib.metadata.requires(name) or []
    out = []
    for text in texts:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": "", "python_version": "3.11"}):
            out.append(req)
    return out


def test_requirements_are_the_closure_of_the_wheel() -> None:
    """Each pin satisfies every requirement on it; nothing needed is missing, nothing extra."""
    pins = build.requirements()
    reached, todo = set(), ["kubelet-dra"]
    while todo:
        name = todo.pop()
        for req in _requires(name):
            key = build.normalize(req.name)
            if key in ASYNC_ONLY:
                continue
            assert key in pins, f"{name} needs {req}, not in requirements.txt"
            assert Version(pins[key]) in req.specifier, f"{key}=={pins[key]} breaks {name}: {req}"
            if key not in reached:
                reached.add(key)
                todo.append(key)
    assert reached == set(pins)
    assert not ASYNC_ONLY & set(pins)


def test_only_the_pruned_async_client_imports_what_is_left_out() -> None:
    kubernetes = pathlib.Path(importlib.import_module("kubernetes").__file__ or "").parent
    pattern = re.compile(r"^\s*(?:import|from)\s+(aiohttp|aiohttp_retry|yarl|multidict)\b", re.M)
    users = [
        str(path.relative_to(kubernetes.parent))
        for path in kubernetes.rglob("*.py")
        if pattern.search(path.read_text(encoding="utf-8", errors="replace"))
    ]
    assert users and all(u.startswith("kubernetes/aio/") for u in users), users
    assert (kubernetes / "aio").is_dir()


def test_chart_and_daemonset_name_the_image_the_build_tags() -> None:
    tagged = f"{build.REPOSITORY}:{build.project_version()}"
    assert build.project_version() == kubelet_dra.__version__
    daemonset = yaml.safe_load((ROOT / "deploy/daemonset.yaml").read_text())
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert container["image"] == tagged
    chart = ROOT / "deploy/helm/kubelet-dra-health"
    values = yaml.safe_load((chart / "values.yaml").read_text())
    app_version = yaml.safe_load((chart / "Chart.yaml").read_text())["appVersion"]
    assert f"{values['image']['repository']}:{values['image']['tag'] or app_version}" == tagged


@pytest.mark.parametrize("name", ["packages.txt", "requirements.txt", "prune.txt"])
def test_inputs_have_no_stray_whitespace(name: str) -> None:
    for line in (ROOT / "deploy/image" / name).read_text().splitlines():
        assert line == line.rstrip(), (name, line)
