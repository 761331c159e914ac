"""The image's inputs agree: deploy/image/build.py, deploy/Containerfile, the chart, the DaemonSet.

Both ways of building the image (``tox -e image`` without a registry, the Containerfile with
one) read deploy/image/packages.txt, requirements.txt, prune.txt and precompile.py; these
tests check that the Containerfile uses each of them and nothing else, with the same user,
entry point and environment as build.py's ``CONFIG``; that requirements.txt is the whole
closure of the wheel's requirements but for what prune.txt's removal leaves unused; and that
the chart and the DaemonSet name the image the build tags. No build here (tests/image).
"""

from __future__ import annotations

import ast
import functools
import glob
import importlib
import importlib.metadata
import json
import os
import pathlib
import re
import subprocess
import sys
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
    # prune.txt's lines: relative to site-packages or absolute, globs expanded by the shell
    # (build.prune_targets does the same).
    assert f"cd /usr/local/lib/{build.PYTHON}/dist-packages \\\n" in CONTAINERFILE
    assert "for p in $(sed 's/#.*//' /tmp/image/prune.txt); do rm -r $p; done" in CONTAINERFILE
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
    assert build.lines(build.PRUNE)[0] == "kubernetes/aio"


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


# -- what prune.txt removes from the image is never imported ----------------------------------


def _site_packages() -> pathlib.Path:
    return pathlib.Path(importlib.import_module("kubernetes").__file__ or "").parents[1]


@functools.cache
def _prune_hits() -> tuple[tuple[str, str], ...]:
    """(path here, prune.txt line) for every path that a line of prune.txt matches."""
    site = _site_packages()
    hits = []
    for rel in build.lines(build.PRUNE):
        # The image's standard library is Debian's; here it is this interpreter's.
        here = str(pathlib.Path(os.__file__).parent / pathlib.Path(rel).name)
        for hit in glob.glob(here if rel.startswith("/") else str(site / rel)):
            hits.append((hit, rel))
    return tuple(hits)


def _pruned(path: str) -> str | None:
    """The prune.txt line that removes ``path`` (a file of this venv) from the image."""
    for hit, rel in _prune_hits():
        if path == hit or path.startswith(hit + "/"):
            return rel
    return None


def test_every_prune_line_matches_here_and_spares_the_name_tables() -> None:
    site = _site_packages()
    for rel in build.lines(build.PRUNE):
        if not rel.startswith("/"):
            assert glob.glob(str(site / rel)), rel
    for kept in ("kubernetes/client/api/__init__.py", "kubernetes/client/models/__init__.py"):
        assert _pruned(str(site / kept)) is None, kept


def test_no_module_the_package_imports_is_pruned() -> None:
    """Every module of the package, imported in a fresh interpreter (as tests/image does in
    the image), pulls in nothing that prune.txt removes."""
    code = (
        "import importlib, pkgutil, sys, kubelet_dra\n"
        "for m in pkgutil.walk_packages(kubelet_dra.__path__, 'kubelet_dra.'):\n"
        "    if not m.name.endswith('.__main__'): importlib.import_module(m.name)\n"
        "print('\\n'.join(f for m in list(sys.modules.values())"
        " if (f := getattr(m, '__file__', None))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    files = done.stdout.split()
    assert any("/kubernetes/client/" in f for f in files)
    hits = {f: rule for f in files if (rule := _pruned(f))}
    assert not hits, hits


def _generated_names() -> set[str]:
    """kubernetes.client's names that live in the generated api and models modules."""
    client = importlib.import_module("kubernetes.client")
    exports: dict[str, str] = client._exports
    return {n for n, mod in exports.items() if mod.startswith((".api.", ".models."))}


def test_the_package_names_no_generated_api_class_or_model() -> None:
    """Why the generated modules can go: the package reaches the API through
    ApiClient.param_serialize and call_api and decodes JSON itself. A name such as
    ``kubernetes.client.V1Pod`` or ``CoreV1Api``, an import from the api or models
    packages, or a call of the client's (de)serializers that look classes up by name would
    need them (ApiClient.deserialize does getattr(kubernetes.client.models, name))."""
    names = _generated_names()
    assert {"V1Pod", "CoreV1Api", "ResourceV1Api"} <= names
    found = []
    for path in sorted((ROOT / "kubelet_dra").rglob("*.py")):
        if "_proto" in path.parts:  # generated gRPC code: no kubernetes in it
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            found += [f"{where} {what}" for what in _needs_generated(node, names)]
    assert not found, found


def _needs_generated(node: ast.AST, names: set[str]) -> list[str]:
    """What in ``node`` would need a generated api or models module."""
    if isinstance(node, ast.Attribute) and (node.attr in names or node.attr in _BY_NAME):
        return [f".{node.attr}"]
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kubernetes"):
        module = node.module or ""
        out = (
            [f"from {module}"] if module in _GENERATED or module.startswith(_GENERATED_DOT) else []
        )
        return out + [f"import {a.name}" for a in node.names if a.name in names]
    off = isinstance(node, ast.keyword) and ast.unparse(node.value) == "False"
    if isinstance(node, ast.keyword) and node.arg == "_preload_content" and not off:
        return [f"_preload_content={ast.unparse(node.value)}"]
    return []


_GENERATED = ("kubernetes.client.api", "kubernetes.client.models")
_GENERATED_DOT = tuple(f"{m}." for m in _GENERATED)
# ApiClient methods that map a response to a model class found by its name.
_BY_NAME = {"deserialize", "response_deserialize", "_ApiClient__deserialize"}
