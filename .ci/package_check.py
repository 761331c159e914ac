#!/usr/bin/env python3
"""Build the sdist and the wheel as an index gets them, and check both (``tox -e package``).

Mirrors no kubelet file: this is the project's release check (issue 23, "The wheel").

Each check prints ``ok`` or ``FAIL`` with its reason and the seconds since the previous
verdict (steps that do not depend on each other run at once, so a step's cost can show up
on the verdict before it); the run goes on after a failure where the next checks do not
depend on it, and exits 1 if any failed. The checks:

1. ``python -m build`` of a copy of the working tree (tracked and untracked files that git
   does not ignore) gives an sdist and a wheel built from that sdist; ``SOURCE_DATE_EPOCH``
   is the last commit's time (or ``--epoch``).
2. ``twine check --strict`` on both, ``check-wheel-contents`` on the wheel (its settings are
   pyproject's ``[tool.check-wheel-contents]``: exactly the files of ``kubelet_dra/``).
3. The wheel's own contents: only ``kubelet_dra/`` and its dist-info; no tests, benchmarks or
   conftest; ``py.typed``; the generated code of every ``.proto`` under ``proto/``; files with
   equal contents only among the generated code; the license; the console scripts of
   pyproject's ``[project.scripts]``; its version is ``kubelet_dra.__version__``.
4. One version: pyproject declares it dynamic, read from ``kubelet_dra/__init__.py``, and no
   other module of the package assigns ``__version__``.
5. The sdist holds the changelog, the license and the ``.proto`` sources, and no tests; a
   wheel built straight from the tree is byte-identical to the one built from the sdist.
6. A new venv (no system site-packages, started outside the repository) installs the wheel
   alone; every console script answers ``--version`` (the version, alone on its line) and
   ``--help``; every module of the installed package imports, from the venv (the pytest
   plugin after step 7, which installs pytest).
7. The test kit as an outside project meets it: the wheel's ``pytest`` extra installs into
   that venv, and ``examples/driver-tests`` (copied out of the tree, its own ``pytest.ini``,
   no conftest) passes with pytest there, the fixtures coming from the ``pytest11`` entry
   point alone (24 to 58 s with the extra's install at a load of 28 on 2 cores; 4.6 s of
   CPU, most of it importing the kubernetes client).
8. ``CHANGELOG.md`` has the Keep a Changelog form.

Usage: python .ci/package_check.py [--source DIR] [--work DIR] [--epoch N]
"""

from __future__ import annotations

import argparse
import ast
import collections
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "kubelet_dra"
DIST = "kubelet-dra"
#: Names a test or benchmark file has; the test kit (``kubelet_dra/testing``) is public API.
TEST_FILE = re.compile(r"(^|/)(test_[^/]*\.py|[^/]*_test\.py|conftest\.py)$")
KEEP_A_CHANGELOG_SECTIONS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")
#: Paths of a developer's machine have no place in a shipped text.
MACHINE_PATH = re.compile(r"(/root/|/home/\w|/work/|/tmp/)")


class Checks:
    """Named checks: each prints its verdict at once; ``failed`` lists the ones that failed."""

    def __init__(self) -> None:
        self.failed: list[str] = []
        self._last = time.monotonic()

    def _took(self) -> str:
        """Seconds since the previous verdict: what this check (and its build) cost."""
        now = time.monotonic()
        took, self._last = now - self._last, now
        return f"{took:5.1f} s"

    def check(self, name: str, problems: Iterable[str]) -> bool:
        found = list(problems)
        if found:
            self.failed.append(name)
            print(f"FAIL {self._took()}  {name}", flush=True)
            for problem in found:
                print(f"     - {problem}", flush=True)
            return False
        print(f"ok   {self._took()}  {name}", flush=True)
        return True


def run(args: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=600
    )
    return proc.returncode, proc.stdout + proc.stderr


def source_version(source: Path) -> str:
    """``__version__`` of ``kubelet_dra/__init__.py``, read as setuptools reads it (no import)."""
    tree = ast.parse((source / PACKAGE / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets
        ):
            return str(ast.literal_eval(node.value))
    raise SystemExit(f"no __version__ in {PACKAGE}/__init__.py")


def pyproject(source: Path) -> dict[str, object]:
    return tomllib.loads((source / "pyproject.toml").read_text())


def project_scripts(source: Path) -> dict[str, str]:
    project = pyproject(source)["project"]
    assert isinstance(project, dict)
    return dict(project.get("scripts", {}))


def copy_tree(source: Path, target: Path) -> None:
    """The files a fresh checkout plus the developer's new files would have.

    With the modes of a checkout under umask 022 (0644, 0755 when executable): build unpacks
    the sdist with tarfile's "data" filter, which drops group and other write bits, so a
    group-writable tree (umask 002, or ``git archive``) would give a wheel from the tree
    whose modes differ from the sdist's.
    """
    code, out = run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=source
    )
    if code != 0:  # not a git checkout (an unpacked sdist): everything but build output
        shutil.copytree(
            source,
            target,
            ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", ".*", "__pycache__"),
            dirs_exist_ok=True,
        )
    else:
        for name in filter(None, out.split("\0")):
            path = source / name
            if path.is_file():  # a deleted file is still listed until the deletion is staged
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target / name)
    for path in target.rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(0o755 if path.stat().st_mode & 0o111 else 0o644)


def epoch_of(source: Path) -> str:
    code, out = run(["git", "log", "-1", "--format=%ct"], cwd=source)
    # Zip stores no date before 1980; 315532800 is its first day.
    return out.strip() if code == 0 and out.strip().isdigit() else "315532800"


def build(src: Path, outdir: Path, env: dict[str, str], *flags: str) -> tuple[int, str]:
    """``python -m build`` with the backend this env pins (``tox -e package``: setuptools).

    Without isolation: an isolated build installs the newest setuptools three times per run
    (30 to 70 s here), and a pinned backend is what makes "byte-identical" hold from one run
    and machine to the next. build still checks that the env satisfies pyproject's
    ``[build-system] requires`` and fails if it does not. ``--isolated`` builds as pip does.
    """
    isolation = [] if env.get("PACKAGE_CHECK_ISOLATED") else ["--no-isolation"]
    return run(
        [sys.executable, "-m", "build", *isolation, *flags, "--outdir", str(outdir), str(src)],
        cwd=src,
        env=env,
    )


def one(directory: Path, pattern: str) -> Path | None:
    found = sorted(directory.glob(pattern))
    return found[0] if len(found) == 1 else None


# -- the wheel's contents ------------------------------------------------------------------


def wheel_problems(wheel: Path, source: Path, version: str) -> dict[str, list[str]]:
    with zipfile.ZipFile(wheel) as zf:
        names = [i.filename for i in zf.infolist() if not i.is_dir()]
        data = {name: zf.read(name) for name in names}
    info = f"{PACKAGE}-{version}.dist-info"
    problems: dict[str, list[str]] = {}
    problems["wheel: only the package and its dist-info"] = [
        f"{n}: outside {PACKAGE}/ and {info}/"
        for n in names
        if n.split("/")[0] not in (PACKAGE, info)
    ]
    problems["wheel: no tests or benchmarks"] = [
        f"{n}: a test or benchmark file"
        for n in names
        if TEST_FILE.search(n)
        or n.split("/")[0] in ("tests", "benchmarks")
        or "/tests/" in n
        or "/benchmarks/" in n
    ]
    problems["wheel: py.typed"] = (
        [] if f"{PACKAGE}/py.typed" in names else [f"{PACKAGE}/py.typed is missing"]
    )
    problems["wheel: the generated protobuf and gRPC code of every .proto"] = [
        f"{want} is missing" for want in generated_files(source) if want not in names
    ]
    problems["wheel: equal contents only in the generated code"] = duplicates(data)
    metadata = data.get(f"{info}/METADATA", b"").decode()
    problems["wheel: METADATA version and license"] = [
        *([] if f"\nVersion: {version}\n" in metadata else [f"METADATA Version is not {version}"]),
        *(
            []
            if "\nLicense-Expression: Apache-2.0\n" in metadata
            else ["METADATA has no License-Expression: Apache-2.0"]
        ),
        *([] if f"{info}/licenses/LICENSE" in names else [f"{info}/licenses/LICENSE missing"]),
    ]
    entry_points = data.get(f"{info}/entry_points.txt", b"").decode()
    problems["wheel: console scripts of [project.scripts]"] = [
        f"console script {name} = {target} missing from entry_points.txt"
        for name, target in project_scripts(source).items()
        if f"{name} = {target}" not in entry_points
    ]
    problems["wheel: pytest plugin of [project.entry-points.pytest11]"] = [
        f"pytest11 entry point {name} = {target} missing from entry_points.txt"
        for name, target in entry_point_group(source, "pytest11").items()
        if f"[pytest11]\n{name} = {target}\n" not in entry_points
    ] or ([] if entry_point_group(source, "pytest11") else ["pyproject declares no pytest11"])
    return problems


def entry_point_group(source: Path, group: str) -> dict[str, str]:
    project = pyproject(source)["project"]
    assert isinstance(project, dict)
    return dict(project.get("entry-points", {}).get(group, {}))


def generated_files(source: Path) -> list[str]:
    """What protoc writes for each ``proto/kubelet_dra/_proto/**/X.proto`` (proto/generate.py)."""
    protos = sorted((source / "proto").glob(f"{PACKAGE}/_proto/**/*.proto"))
    out = []
    for proto in protos:
        stem = proto.relative_to(source / "proto").with_suffix("").as_posix()
        out += [f"{stem}_pb2.py", f"{stem}_pb2.pyi", f"{stem}_pb2_grpc.py"]
    return out or ["no .proto files found under proto/ (the check has nothing to compare)"]


def duplicates(data: dict[str, bytes]) -> list[str]:
    by_hash: dict[str, list[str]] = collections.defaultdict(list)
    for name, content in data.items():
        if content.strip() and ".dist-info/" not in name:
            by_hash[hashlib.sha256(content).hexdigest()].append(name)
    return [
        f"equal contents: {', '.join(group)}"
        for group in by_hash.values()
        if len(group) > 1 and not all(n.startswith(f"{PACKAGE}/_proto/") for n in group)
    ]


def sdist_problems(sdist: Path, source: Path, version: str) -> list[str]:
    with tarfile.open(sdist) as tf:
        names = {m.name.split("/", 1)[1] for m in tf.getmembers() if "/" in m.name}
    wanted = ["CHANGELOG.md", "LICENSE", "README.md", "pyproject.toml", f"{PACKAGE}/py.typed"]
    wanted += [p.relative_to(source).as_posix() for p in (source / "proto").rglob("*.proto")]
    problems = [f"{want} missing from the sdist" for want in wanted if want not in names]
    problems += [f"{n}: a test in the sdist" for n in sorted(names) if n.startswith("tests/")]
    if not sdist.name.startswith(f"kubelet_dra-{version}."):
        problems.append(f"{sdist.name}: not version {version}")
    return problems


def same_wheel(a: Path, b: Path) -> list[str]:
    """Byte-identical; else what differs (names, then contents), to say why."""
    if a.read_bytes() == b.read_bytes():
        return []
    with zipfile.ZipFile(a) as za, zipfile.ZipFile(b) as zb:
        ia = {i.filename: i for i in za.infolist()}
        ib = {i.filename: i for i in zb.infolist()}
        out = [f"only in the sdist's wheel: {n}" for n in sorted(set(ia) - set(ib))]
        out += [f"only in the tree's wheel: {n}" for n in sorted(set(ib) - set(ia))]
        for name in sorted(set(ia) & set(ib)):
            x, y = ia[name], ib[name]
            if za.read(name) != zb.read(name):
                out.append(f"{name}: contents differ")
            elif (x.date_time, x.external_attr) != (y.date_time, y.external_attr):
                out.append(
                    f"{name}: date or mode differs ({x.date_time} {x.external_attr:o}"
                    f" vs {y.date_time} {y.external_attr:o})"
                )
        return out or ["the archives differ in their zip headers or order only"]


# -- the installed wheel -------------------------------------------------------------------

#: A module that needs an extra, imported by the check of that extra instead.
PYTEST_PLUGIN = "kubelet_dra.testing.pytest_plugin"
#: The outside project's test tree, run from the installed wheel (step 7).
DRIVER_TESTS = Path("examples/driver-tests")

IMPORT_ALL = """
import importlib, importlib.metadata, importlib.util, pkgutil, sys, kubelet_dra
bad = []
for m in pkgutil.walk_packages(kubelet_dra.__path__, "kubelet_dra."):
    if m.name.endswith(".__main__") or m.name == sys.argv[1]:  # the command line; pytest
        continue
    try:
        importlib.import_module(m.name)
    except Exception as exc:
        bad.append(f"{m.name}: {type(exc).__name__}: {exc}")
print(kubelet_dra.__file__)
print(importlib.metadata.version("kubelet-dra"))
print(kubelet_dra.__version__)
print([t for t in ("build", "twine", "check_wheel_contents") if importlib.util.find_spec(t)])
print("\\n".join(bad))
"""


def install_into_new_venv(wheel: Path, venv: Path) -> list[str]:
    """A venv of its own with the wheel and its dependencies from the index, nothing else.

    uv when the env has it (``tox -e package`` pins it): pip took 100 to 200 s here for the
    same install at a load of 20 to 30, most of it compiling the kubernetes client.
    """
    cwd, env = venv.parent / "cwd", venv_env(venv)
    cwd.mkdir(exist_ok=True)
    uv = shutil.which("uv", path=str(Path(sys.executable).parent))
    if uv:
        steps = [
            [uv, "venv", "-q", "--python", sys.executable, str(venv)],
            [uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), str(wheel)],
        ]
    else:
        steps = [
            [sys.executable, "-m", "venv", str(venv)],
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
        ]
    for step in steps:
        code, out = run(step, cwd=cwd, env=env)
        if code != 0:
            return [f"{' '.join(step[:3])} ... exited {code}: {out.strip()[-2000:]}"]
    return []


def venv_env(venv: Path) -> dict[str, str]:
    """No PYTHONPATH and the venv first on PATH: only the venv can supply the package."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def script_problems(script: str, flag: str, venv: Path, cwd: Path, version: str) -> list[str]:
    code, out = run([str(venv / "bin" / script), flag], cwd=cwd, env=venv_env(venv))
    if code != 0:
        return [f"{script} {flag} exited {code}: {out.strip()[-500:]}"]
    if flag == "--version" and out != f"{version}\n":
        return [f"{script} --version printed {out!r}, not {version!r} on a line"]
    if flag == "--help" and not out.startswith("usage: "):
        return [f"{script} --help printed no usage: {out[:200]!r}"]
    return []


def import_problems(venv: Path, cwd: Path, version: str) -> list[str]:
    code, out = run(
        [str(venv / "bin" / "python"), "-c", IMPORT_ALL, PYTEST_PLUGIN], cwd=cwd, env=venv_env(venv)
    )
    if code != 0:
        return [out.strip()[-1000:]]
    where, meta, attr, tools, *broken = out.splitlines()
    found = [b for b in broken if b]
    if not Path(where).resolve().is_relative_to(venv.resolve()):
        found.append(f"kubelet_dra imported from {where}, not from the venv")
    if meta != version or attr != version:
        found.append(f"installed metadata {meta!r}, __version__ {attr!r}, want {version!r}")
    if tools != "[]":
        found.append(f"the venv sees the check's own tools {tools}: not a venv of its own")
    return found


def check_venv(checks: Checks, pool: Executor, venv: Path, source: Path, version: str) -> None:
    """Every module first (which writes their bytecode once), then the scripts at once.

    uv installs without bytecode: scripts started together before that each compiled the
    same modules (45 s for the five at a load of 30, against 30 s one after another).
    """
    cwd = venv.parent / "cwd"  # empty: nothing of the repository beside the process
    checks.check(
        "venv: every module imports from the installed wheel", import_problems(venv, cwd, version)
    )
    jobs = {
        f"venv: {script} {flag}": pool.submit(script_problems, script, flag, venv, cwd, version)
        for script in project_scripts(source)
        for flag in ("--version", "--help")
    }
    for name, job in jobs.items():
        checks.check(name, job.result())
    if checks.check("venv: the wheel's pytest extra installs", install_extra(venv, "pytest")):
        checks.check(
            f"venv: {DRIVER_TESTS} passes on the installed plugin, outside the tree",
            driver_test_problems(venv, source),
        )


def install_extra(venv: Path, extra: str) -> list[str]:
    """The installed wheel's ``extra`` (its requirements only: the wheel stays as it is)."""
    python = str(venv / "bin" / "python")
    code, out = run(
        [python, "-c", REQUIREMENTS_OF_EXTRA, extra], cwd=venv.parent / "cwd", env=venv_env(venv)
    )
    requirements = out.split()
    if code != 0 or not requirements:
        return [f"no requirements of extra {extra!r} in the installed metadata: {out.strip()}"]
    uv = shutil.which("uv", path=str(Path(sys.executable).parent))
    step = (
        [uv, "pip", "install", "-q", "--python", python, *requirements]
        if uv
        else [python, "-m", "pip", "install", "-q", *requirements]
    )
    code, out = run(step, cwd=venv.parent / "cwd", env=venv_env(venv))
    return [] if code == 0 else [f"installing {requirements} exited {code}: {out.strip()[-2000:]}"]


REQUIREMENTS_OF_EXTRA = """
import importlib.metadata, sys
wanted = 'extra=="%s"' % sys.argv[1]
for req in importlib.metadata.requires("kubelet-dra") or []:
    name, _, marker = req.partition(";")
    if marker.replace(" ", "").replace("'", '"') == wanted:
        print(name.replace(" ", ""))
"""


def driver_test_problems(venv: Path, source: Path) -> list[str]:
    """pytest on a copy of the example tree: no option names the plugin, no conftest helps."""
    tree = venv.parent / "driver-tests"
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(source / DRIVER_TESTS, tree, ignore=shutil.ignore_patterns("__pycache__"))
    problems = [f"{p.name}: a conftest in the example tree" for p in tree.rglob("conftest.py")]
    python = str(venv / "bin" / "python")
    code, out = run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE"],
        cwd=tree,
        env=venv_env(venv),
    )
    if code != 0:
        problems.append(f"pytest exited {code}: {out.strip()[-3000:]}")
    elif " passed" not in out or " skipped" in out:
        problems.append(f"pytest passed without running every test: {out.strip()[-500:]}")
    return problems


# -- version and changelog -----------------------------------------------------------------


def version_problems(source: Path) -> list[str]:
    project = pyproject(source)["project"]
    tool = pyproject(source).get("tool", {})
    assert isinstance(project, dict) and isinstance(tool, dict)
    out = []
    if "version" in project or "version" not in project.get("dynamic", []):
        out.append("pyproject.toml states a version: it should be dynamic")
    dynamic = tool.get("setuptools", {}).get("dynamic", {}).get("version", {})
    if dynamic != {"attr": f"{PACKAGE}.__version__"}:
        out.append(f"[tool.setuptools.dynamic] version is {dynamic!r}, not {PACKAGE}.__version__")
    for path in sorted((source / PACKAGE).rglob("*.py")):
        if path.name == "__init__.py" and path.parent == source / PACKAGE:
            continue
        if re.search(r"^__version__\s*=", path.read_text(), re.M):
            out.append(f"{path.relative_to(source)} assigns __version__ a second time")
    return out


def changelog_problems(source: Path, version: str) -> list[str]:
    path = source / "CHANGELOG.md"
    if not path.exists():
        return ["CHANGELOG.md is missing"]
    text = path.read_text()
    out = []
    if not text.startswith("# Changelog\n"):
        out.append("the first line is not '# Changelog'")
    if "keepachangelog.com" not in text or "semver.org" not in text:
        out.append("no link to Keep a Changelog and Semantic Versioning")
    releases = re.findall(r"^## (.*)$", text, re.M)
    if not releases:
        out.append("no release sections (## [Unreleased] or ## [X.Y.Z] - YYYY-MM-DD)")
    for heading in releases:
        if heading != "[Unreleased]" and not re.fullmatch(
            r"\[\d+\.\d+\.\d+[^\]]*\] - \d{4}-\d{2}-\d{2}", heading
        ):
            out.append(f"## {heading}: not [Unreleased] nor [X.Y.Z] - YYYY-MM-DD")
    if (
        releases
        and releases[0] not in ("[Unreleased]",)
        and not releases[0].startswith(f"[{version}]")
    ):
        out.append(f"the newest section is {releases[0]}, but the package is {version}")
    out += [
        f"### {kind}: not one of {', '.join(KEEP_A_CHANGELOG_SECTIONS)}"
        for kind in re.findall(r"^### (.*)$", text, re.M)
        if kind not in KEEP_A_CHANGELOG_SECTIONS
    ]
    out += [f"a machine path: {m.group(0)}" for m in MACHINE_PATH.finditer(text)]
    return out


# -- the run -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=ROOT, help="the tree to build")
    parser.add_argument("--work", type=Path, help="keep the builds here (default: a temp dir)")
    parser.add_argument("--epoch", help="SOURCE_DATE_EPOCH (default: the last commit's time)")
    parser.add_argument(
        "--isolated",
        action="store_true",
        help="build in isolated envs with the newest backend, as pip does",
    )
    ns = parser.parse_args(argv)
    if ns.isolated:
        os.environ["PACKAGE_CHECK_ISOLATED"] = "1"
    source = ns.source.resolve()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="package-check-") as tmp:
        work = ns.work.resolve() if ns.work else Path(tmp)
        failed = check_all(Checks(), source, work, ns.epoch or epoch_of(source))
    print(
        f"{time.monotonic() - started:.0f} s; "
        + (f"{len(failed)} failed: {', '.join(failed)}" if failed else "every check passed")
    )
    return 1 if failed else 0


def check_all(checks: Checks, source: Path, work: Path, epoch: str) -> list[str]:
    version = source_version(source)
    print(f"kubelet-dra {version}, SOURCE_DATE_EPOCH={epoch}", flush=True)
    checks.check(
        "one version: kubelet_dra.__version__, dynamic in pyproject", version_problems(source)
    )
    checks.check("CHANGELOG.md: Keep a Changelog", changelog_problems(source, version))
    src, dist, tree = work / "src", work / "dist", work / "tree"
    shutil.rmtree(work / "venv", ignore_errors=True)
    for d in (src, dist, tree, work / "cwd"):
        shutil.rmtree(d, ignore_errors=True)
    src.mkdir(parents=True)
    copy_tree(source, src)
    env = {**os.environ, "SOURCE_DATE_EPOCH": epoch}
    code, out = build(src, dist, env)
    sdist, wheel = one(dist, "*.tar.gz"), one(dist, "*.whl")
    if not checks.check(
        "python -m build: an sdist and a wheel from it",
        [] if code == 0 and sdist and wheel else [out.strip()[-3000:]],
    ):
        return checks.failed
    assert sdist is not None and wheel is not None
    print(f"     {sdist.name} {sdist.stat().st_size} B, {wheel.name} {wheel.stat().st_size} B")
    tool: Callable[[str], str] = lambda name: str(Path(sys.executable).parent / name)  # noqa: E731
    # What does not depend on each other runs at once: the tools, the second build and the
    # venv's install (mostly waiting on the index) share the two cores.
    with ThreadPoolExecutor(max_workers=6) as pool:
        twine = pool.submit(
            run, [tool("twine"), "check", "--strict", str(sdist), str(wheel)], cwd=work
        )
        cwc = pool.submit(
            run,
            [tool("check-wheel-contents"), "--config", str(src / "pyproject.toml"), str(wheel)],
            cwd=src,
        )
        rebuilt = pool.submit(build, src, tree, env, "--wheel")
        installed = pool.submit(install_into_new_venv, wheel, work / "venv")
        code, out = twine.result()
        checks.check("twine check --strict (sdist and wheel)", [] if code == 0 else [out.strip()])
        code, out = cwc.result()
        checks.check("check-wheel-contents", [] if code == 0 else [out.strip()])
        for name, problems in wheel_problems(wheel, source, version).items():
            checks.check(name, problems)
        checks.check(
            "sdist: changelog, license, .proto sources; no tests",
            sdist_problems(sdist, source, version),
        )
        code, out = rebuilt.result()
        tree_wheel = one(tree, "*.whl")
        if checks.check(
            "python -m build --wheel from the tree",
            [] if code == 0 and tree_wheel else [out.strip()[-3000:]],
        ):
            assert tree_wheel is not None
            checks.check(
                "the sdist rebuilds the same wheel (byte-identical)", same_wheel(wheel, tree_wheel)
            )
        if checks.check("venv: a new venv installs the wheel alone", installed.result()):
            check_venv(checks, pool, work / "venv", source, version)
    return checks.failed


if __name__ == "__main__":
    sys.exit(main())
