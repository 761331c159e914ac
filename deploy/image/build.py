"""Build the sidecar's OCI image from Debian's packages, with no container registry.

``tox -e image`` runs this (docs/deploy.md, "The image"). It mirrors no kubelet file: the
kubelet ships no such image. The steps:

1. our wheel (``pip wheel --no-deps``) and the pinned Python distributions of
   ``requirements.txt`` as wheels from PyPI (cached; an sdist-only one is built here);
2. a root filesystem from ``mmdebstrap --variant=extract`` with the Debian packages of
   ``packages.txt`` and their dependencies, nothing else (no shell, no apt);
3. pip, run by the image's own ``/usr/bin/python3.11`` in a chroot, installs the wheels offline
   with ``--no-deps``; ``prune.txt`` paths (globs) are removed; bytecode is compiled once
   (unchecked-hash ``.pyc``: the root filesystem is read-only at run time);
4. ``umoci`` packs it as one layer into an OCI layout, with the entry point, user and
   labels of ``CONFIG`` below; every timestamp is ``SOURCE_DATE_EPOCH`` (default: the
   commit time of HEAD), so two builds of one commit give the same digest;
5. ``image-packages.json`` and ``image-packages.txt`` beside the layout say what is inside
   (Debian packages, Python distributions, sizes, digest).

``deploy/Containerfile`` builds the same content from the same three files for users with
a registry. Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import pathlib
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable, Sequence
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PACKAGES = HERE / "packages.txt"
REQUIREMENTS = HERE / "requirements.txt"
PRUNE = HERE / "prune.txt"
SUITE = "bookworm"
PYTHON = "python3.11"
INTERPRETER = f"/usr/bin/{PYTHON}"
# The image's name as this build tags it (the chart's and the DaemonSet's default).
REPOSITORY = "localhost/kubelet-dra-health"
NONROOT = 65532
# pip as a wheel, run by the image's python3 in the chroot; not left in the image.
PIP = "pip==23.2.1"
SITE = f"usr/local/lib/{PYTHON}/dist-packages"
# Shared by the Containerfile (tests/unit/test_image_files.py compares them).
CONFIG: dict[str, Any] = {
    "entrypoint": ["/usr/local/bin/kubelet-dra-health"],
    "cmd": ["run"],
    "user": f"{NONROOT}:{NONROOT}",
    "workingdir": "/",
    "env": {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "LANG": "C.UTF-8",
    },
}
# Kept from /usr/share/doc: the licences.
DPKG_OPTIONS = [
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/lintian/*",
    "path-exclude=/usr/share/bug/*",
]
TOOLS = {"mmdebstrap": "mmdebstrap", "umoci": "umoci", "skopeo": "skopeo"}
EXIT_SKIP = 77
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"


class Skip(Exception):
    """This machine cannot build the image (the message says why); exit 77."""


def log(message: str) -> None:
    print(f"image: {message}", file=sys.stderr, flush=True)


def run(argv: Sequence[str | os.PathLike[str]], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    log("$ " + shlex.join(str(a) for a in argv))
    return subprocess.run([str(a) for a in argv], check=True, text=True, **kwargs)


# -- inputs ------------------------------------------------------------------------------


def lines(path: pathlib.Path) -> list[str]:
    """The non-comment, non-blank lines of ``path``, each without its trailing comment."""
    out = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            out.append(line)
    return out


def debian_packages() -> list[str]:
    return lines(PACKAGES)


def requirements() -> dict[str, str]:
    """Normalized distribution name -> pinned version, from ``requirements.txt``."""
    pins = {}
    for line in lines(REQUIREMENTS):
        name, sep, version = line.partition("==")
        if not sep or not version:
            raise SystemExit(f"{REQUIREMENTS.name}: {line!r} is not pinned with ==")
        pins[normalize(name)] = version.strip()
    return pins


def sdist_only() -> set[str]:
    """Distributions that PyPI has only as an sdist (marked so in ``requirements.txt``)."""
    marked = set()
    for raw in REQUIREMENTS.read_text(encoding="utf-8").splitlines():
        line, _, comment = raw.partition("#")
        if "sdist only" in comment and "==" in line:
            marked.add(normalize(line.split("==")[0]))
    return marked


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project_version() -> str:
    """``kubelet_dra.__version__``, read from the source (the one place it is stated)."""
    text = (ROOT / "kubelet_dra/__init__.py").read_text(encoding="utf-8")
    match = re.search(r'^__version__ = "([^"]+)"', text, re.MULTILINE)
    if match is None:
        raise SystemExit("no __version__ in kubelet_dra/__init__.py")
    return match[1]


def source_date_epoch() -> int:
    """``$SOURCE_DATE_EPOCH``, else the commit time of HEAD, else 0."""
    if value := os.environ.get("SOURCE_DATE_EPOCH"):
        return int(value)
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "log", "-1", "--format=%ct"],
            capture_output=True,
            text=True,
            check=True,
        )
        return int(done.stdout.strip())
    except (OSError, subprocess.CalledProcessError, ValueError):
        return 0


def debian_sources() -> str | None:
    """The Debian mirror apt uses here (its deb822 file), else mmdebstrap's default."""
    for path in ("/etc/apt/sources.list.d/debian.sources",):
        if pathlib.Path(path).is_file():
            return path
    return None


# -- tools -------------------------------------------------------------------------------


def check_tools(install: bool, extra: dict[str, str] | None = None) -> None:
    """mmdebstrap, umoci, skopeo (and ``extra``: command -> Debian package) are Debian
    packages: install the missing ones if asked and apt-get is there, else Skip."""
    if os.geteuid() != 0:
        raise Skip("needs root (mmdebstrap in root mode and a chroot to run pip)")
    tools = {**TOOLS, **(extra or {})}
    missing = sorted({pkg for tool, pkg in tools.items() if shutil.which(tool) is None})
    if not missing:
        return
    if not install or shutil.which("apt-get") is None:
        raise Skip(f"missing Debian packages {' '.join(missing)} (apt-get install them)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-q"], env=env, stdout=subprocess.DEVNULL)
    run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], env=env)


# -- wheels ------------------------------------------------------------------------------


def build_our_wheel(dist: pathlib.Path, env: dict[str, str]) -> pathlib.Path:
    shutil.rmtree(dist, ignore_errors=True)
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", dist, ROOT],
        env=env,
    )
    (wheel,) = dist.glob("kubelet_dra-*.whl")
    return wheel


def wheel_files(house: pathlib.Path, pins: dict[str, str]) -> dict[str, pathlib.Path]:
    """The wheel in ``house`` for each pin that has one (name-version-... .whl)."""
    found = {}
    for path in sorted(house.glob("*.whl")):
        name, version = path.name.split("-")[:2]
        key = normalize(name)
        if pins.get(key) == version:
            found[key] = path
    return found


def platform_flags() -> list[str]:
    """pip's ``--platform`` tags for the image's glibc 2.36 (pip does not expand them)."""
    machine = platform.machine()
    tags = [f"manylinux_2_{minor}_{machine}" for minor in range(36, 16, -1)]
    tags += [f"manylinux2014_{machine}", f"manylinux2010_{machine}", f"manylinux1_{machine}"]
    flags = ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311"]
    flags += ["--abi", "abi3", "--abi", "none"]
    for tag in tags:
        flags += ["--platform", tag]
    return flags


def fetch_wheels(house: pathlib.Path, env: dict[str, str]) -> dict[str, pathlib.Path]:
    """Every pinned distribution as a wheel for the image's Python, and pip itself."""
    pins = requirements()
    pip_name, pip_version = PIP.split("==")
    wanted = {**pins, pip_name: pip_version}
    house.mkdir(parents=True, exist_ok=True)
    have = wheel_files(house, wanted)
    missing = sorted(set(wanted) - set(have))
    sdists = sdist_only()
    binary = [f"{n}=={wanted[n]}" for n in missing if n not in sdists]
    built = [f"{n}=={wanted[n]}" for n in missing if n in sdists]
    pip = [sys.executable, "-m", "pip"]
    if binary:
        run([*pip, "download", "-q", "--no-deps", "--only-binary=:all:", *platform_flags(),
             "-d", house, *binary], env=env)  # fmt: skip
    if built:
        run([*pip, "wheel", "-q", "--no-deps", "--no-binary=:all:", "-w", house, *built], env=env)
    have = wheel_files(house, wanted)
    if lost := sorted(set(wanted) - set(have)):
        raise SystemExit(f"no wheel for {', '.join(lost)} in {house}")
    return have


# -- root filesystem ---------------------------------------------------------------------


def mmdebstrap(rootfs: pathlib.Path, debs: pathlib.Path, listing: pathlib.Path) -> None:
    """Extract the packages and their dependencies into ``rootfs`` (debs cached in ``debs``)."""
    debs.mkdir(parents=True, exist_ok=True)
    archives = '"$1"/var/cache/apt/archives'
    argv: list[str | os.PathLike[str]] = [
        "mmdebstrap",
        "--variant=extract",
        "--mode=root",
        "--format=directory",
        "--include=" + ",".join(debian_packages()),
        *(f"--dpkgopt={option}" for option in DPKG_OPTIONS),
        f"--setup-hook=mkdir -p {archives} && "
        f"find {shlex.quote(str(debs))} -name '*.deb' -exec cp -t {archives} {{}} +",
        # What apt chose (the archives dir also holds the cached .debs of other builds).
        f'--extract-hook=APT_CONFIG="$MMDEBSTRAP_APT_CONFIG" apt-get install --simulate -q '
        f"{' '.join(debian_packages())} > {shlex.quote(str(listing))} && "
        f"cp -t {shlex.quote(str(debs))} {archives}/*.deb",
        SUITE,
        rootfs,
    ]
    if sources := debian_sources():
        argv.append(sources)
    run(argv)


def install_python(rootfs: pathlib.Path, wheels: Iterable[pathlib.Path], ours: pathlib.Path,
                   epoch: int) -> None:  # fmt: skip
    """pip, run by the image's own python3, installs the wheels offline, no dependencies."""
    stage = rootfs / "tmp/wheels"
    stage.mkdir(parents=True)
    for wheel in [*wheels, ours]:
        shutil.copy2(wheel, stage)
    (pip_wheel,) = stage.glob("pip-*.whl")
    install = [f"/tmp/wheels/{w.name}" for w in sorted(stage.glob("*.whl")) if w != pip_wheel]
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "SOURCE_DATE_EPOCH": str(epoch)}
    run(
        [CHROOT, rootfs, INTERPRETER, f"/tmp/wheels/{pip_wheel.name}/pip", "install",
         "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
         "--break-system-packages", "--root-user-action=ignore", "--disable-pip-version-check",
         "--no-warn-script-location", *install],
        env=env,
    )  # fmt: skip
    shutil.rmtree(stage)


def prune_targets(rootfs: pathlib.Path, rel: str) -> list[pathlib.Path]:
    """What one ``prune.txt`` line names in ``rootfs``: a path relative to the
    site-packages dir, or absolute from the image's root; a glob expands as the shell's
    (``*`` and ``?`` match no leading dot, as in the Containerfile's ``rm -r``)."""
    base = rootfs / rel.lstrip("/") if rel.startswith("/") else rootfs / SITE / rel
    return sorted(pathlib.Path(p) for p in glob.glob(str(base)))


def prune(rootfs: pathlib.Path) -> list[str]:
    """Remove the paths of ``prune.txt``; each line must match something."""
    gone = []
    for rel in lines(PRUNE) if PRUNE.exists() else []:
        targets = prune_targets(rootfs, rel)
        if not targets:
            raise SystemExit(f"{PRUNE.name}: {rel} is not in the image (remove the line)")
        for target in targets:
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        gone.append(rel)
    return gone


def compile_bytecode(rootfs: pathlib.Path, epoch: int) -> None:
    """``.pyc`` files for what the sidecar imports (``precompile.py`` says how and why)."""
    shutil.copy2(HERE / "precompile.py", rootfs / "tmp/precompile.py")
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "SOURCE_DATE_EPOCH": str(epoch),
           "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}  # fmt: skip
    run([CHROOT, rootfs, INTERPRETER, "/tmp/precompile.py"], env=env)
    (rootfs / "tmp/precompile.py").unlink()


def finish_rootfs(rootfs: pathlib.Path, epoch: int) -> None:
    """Users, empty mount points, no build leftovers; every mtime at ``epoch``."""
    etc = rootfs / "etc"
    (etc / "passwd").write_text(
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"nonroot:x:{NONROOT}:{NONROOT}:nonroot:/nonexistent:/usr/sbin/nologin\n"
    )
    (etc / "group").write_text(f"root:x:0:\nnonroot:x:{NONROOT}:\n")
    for name in ("resolv.conf", "hostname"):
        (etc / name).unlink(missing_ok=True)
    # The runtime mounts /dev, /proc, /sys; /tmp is an emptyDir in the DaemonSet.
    for name in ("dev", "proc", "sys", "tmp", "run"):
        shutil.rmtree(rootfs / name, ignore_errors=True)
        (rootfs / name).mkdir()
    (rootfs / "tmp").chmod(0o1777)
    for name in ("var/cache/apt", "var/lib/apt", "var/log"):
        shutil.rmtree(rootfs / name, ignore_errors=True)
    clamp_mtimes(rootfs, epoch)


def clamp_mtimes(rootfs: pathlib.Path, epoch: int) -> None:
    for dirpath, dirnames, filenames in os.walk(rootfs):
        for name in [*dirnames, *filenames]:
            os.utime(os.path.join(dirpath, name), (epoch, epoch), follow_symlinks=False)
    os.utime(rootfs, (epoch, epoch))


# -- image -------------------------------------------------------------------------------


def iso(epoch: int) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pack(rootfs: pathlib.Path, layout: pathlib.Path, tag: str, epoch: int,
         version: str) -> None:  # fmt: skip
    """umoci: a new image, the root filesystem as one layer, then the config."""
    shutil.rmtree(layout, ignore_errors=True)
    image = f"{layout}:{tag}"
    created = iso(epoch)
    history = ["--history.created", created, "--history.author", "kubelet-dra"]
    run(["umoci", "init", "--layout", layout])
    run(["umoci", "new", "--image", image])
    step = ["--history.created_by", "deploy/image/build.py: mmdebstrap rootfs"]
    run(["umoci", "insert", "--image", image, *history, *step, rootfs, "/"])
    config = ["--created", created, "--author", "kubelet-dra", "--os", "linux",
              "--architecture", deb_arch(), "--no-history", "--clear=config.entrypoint",
              "--clear=config.cmd"]  # fmt: skip
    config += [f"--config.entrypoint={part}" for part in CONFIG["entrypoint"]]
    config += [f"--config.cmd={part}" for part in CONFIG["cmd"]]
    config += ["--config.user", CONFIG["user"], "--config.workingdir", CONFIG["workingdir"]]
    config += [f"--config.env={k}={v}" for k, v in CONFIG["env"].items()]
    for key, value in labels(version, epoch).items():
        config += [f"--config.label={key}={value}"]
    run(["umoci", "config", "--image", image, *config])
    run(["umoci", "gc", "--layout", layout])


def labels(version: str, epoch: int) -> dict[str, str]:
    return {
        "org.opencontainers.image.title": "kubelet-dra-health",
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.created": iso(epoch),
        "org.opencontainers.image.licenses": "Apache-2.0",
        "org.opencontainers.image.description": "The kubelet's DRA device-health sidecar",
    }


def deb_arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def manifest_digest(layout: pathlib.Path, tag: str) -> str:
    index = json.loads((layout / "index.json").read_text())
    for entry in index["manifests"]:
        if entry.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
            return str(entry["digest"])
    raise SystemExit(f"no manifest tagged {tag} in {layout}")


def archive(layout: pathlib.Path, target: pathlib.Path, epoch: int) -> None:
    """The layout as one tar (``oci-archive:``), members sorted, owner and times fixed."""

    def fixed(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, 0, 0, "", ""
        return info

    with tarfile.open(target, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(layout.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(layout)), recursive=False, filter=fixed)


def load(layout: pathlib.Path, tag: str) -> str:
    """Copy the image into the local containers-storage (podman's) as REPOSITORY:tag."""
    name = f"{REPOSITORY}:{tag}"
    run(["skopeo", "copy", "-q", f"oci:{layout}:{tag}", f"containers-storage:{name}"])
    return name


# -- report ------------------------------------------------------------------------------


def debian_report(listing: pathlib.Path) -> list[dict[str, str]]:
    """(package, version) of each ``Inst`` line of ``apt-get install --simulate``."""
    out = []
    for line in listing.read_text().splitlines():
        if match := re.match(r"Inst (\S+) \((\S+) ", line):
            out.append({"package": match[1], "version": match[2]})
    if not out:
        raise SystemExit(f"no package in apt's plan ({listing})")
    return sorted(out, key=lambda d: d["package"])


def python_report(rootfs: pathlib.Path) -> list[dict[str, str]]:
    out = []
    for meta in sorted((rootfs / SITE).glob("*.dist-info/METADATA")):
        fields = dict(
            line.split(": ", 1)
            for line in meta.read_text(encoding="utf-8").split("\n\n")[0].splitlines()
            if ": " in line
        )
        out.append({"distribution": fields["Name"], "version": fields["Version"]})
    return sorted(out, key=lambda d: normalize(d["distribution"]))


def tree_size(path: pathlib.Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                total += os.path.getsize(full)
    return total


def blob_sizes(layout: pathlib.Path, digest: str) -> tuple[int, int]:
    """(compressed layer bytes, uncompressed layer bytes) of the manifest ``digest``."""
    blobs = layout / "blobs/sha256"
    manifest = json.loads((blobs / digest.split(":")[1]).read_text())
    compressed = sum(int(layer["size"]) for layer in manifest["layers"])
    uncompressed = 0
    for layer in manifest["layers"]:
        uncompressed += gunzipped_size(blobs / layer["digest"].split(":")[1])
    return compressed, uncompressed


def gunzipped_size(path: pathlib.Path) -> int:
    import gzip

    total = 0
    with gzip.open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            total += len(chunk)
    return total


def write_report(out: pathlib.Path, report: dict[str, Any]) -> None:
    (out / "image-packages.json").write_text(json.dumps(report, indent=2) + "\n")
    text = [
        f"image {report['image']}",
        f"digest {report['digest']}",
        f"SOURCE_DATE_EPOCH {report['source_date_epoch']}",
        f"size: root filesystem {mb(report['rootfs_bytes'])}, "
        f"layer {mb(report['layer_bytes'])} compressed ({mb(report['layer_uncompressed_bytes'])}"
        " as a tar)",
        f"build seconds {report['build_seconds']} "
        + " ".join(f"{k}={v}" for k, v in report["stage_seconds"].items()),
        "",
        f"Debian packages ({SUITE}), {len(report['debian'])}:",
        *(f"  {d['package']} {d['version']}" for d in report["debian"]),
        "",
        f"Python distributions, {len(report['python'])}:",
        *(f"  {p['distribution']} {p['version']}" for p in report["python"]),
        "",
        "pruned: " + (", ".join(report["pruned"]) or "nothing"),
    ]
    (out / "image-packages.txt").write_text("\n".join(text) + "\n")


def mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


# -- main --------------------------------------------------------------------------------


class Stages:
    """Seconds spent in each step of the build, for the report."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.monotonic()

    def done(self, name: str) -> None:
        now = time.monotonic()
        self.seconds[name] = round(now - self._last, 1)
        self._last = now


def build(out: pathlib.Path, cache: pathlib.Path, tag: str | None = None,
          keep: bool = False) -> dict[str, Any]:  # fmt: skip
    """Build the image into ``out``; return the report (also written into ``out``)."""
    started, stages = time.monotonic(), Stages()
    epoch = source_date_epoch()
    version = project_version()
    tag = tag or version
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PIP_FIND_LINKS", None)
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "rootfs", ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="kdh-image-", dir=out) as tmp:
        work = pathlib.Path(tmp)
        ours = build_our_wheel(work / "dist", env)
        stages.done("wheel")
        wheels = fetch_wheels(cache / "wheels", env)
        stages.done("wheels")
        rootfs, listing = work / "rootfs", work / "apt-plan.txt"
        mmdebstrap(rootfs, cache / "debs", listing)
        stages.done("mmdebstrap")
        install_python(rootfs, wheels.values(), ours, epoch)
        pruned = prune(rootfs)
        compile_bytecode(rootfs, epoch)
        finish_rootfs(rootfs, epoch)
        stages.done("python")
        layout = out / "oci"
        pack(rootfs, layout, tag, epoch, version)
        digest = manifest_digest(layout, tag)
        archive(layout, out / f"kubelet-dra-health-{tag}.oci.tar", epoch)
        stages.done("umoci")
        compressed, uncompressed = blob_sizes(layout, digest)
        report = {
            "image": f"{REPOSITORY}:{tag}",
            "digest": digest,
            "source_date_epoch": epoch,
            "rootfs_bytes": tree_size(rootfs),
            "layer_bytes": compressed,
            "layer_uncompressed_bytes": uncompressed,
            "build_seconds": round(time.monotonic() - started, 1),
            "stage_seconds": stages.seconds,
            "debian": debian_report(listing),
            "python": python_report(rootfs),
            "pruned": pruned,
        }
        if keep:
            rootfs.rename(out / "rootfs")
    write_report(out, report)
    (out / "digest").write_text(digest + "\n")
    return report


def default_cache() -> pathlib.Path:
    if value := os.environ.get("KUBELET_DRA_IMAGE_CACHE"):
        return pathlib.Path(value)
    return pathlib.Path("~/.cache/kubelet-dra/image").expanduser()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "build/image")
    parser.add_argument("--cache", type=pathlib.Path, default=default_cache(),
                        help="wheels and .debs (default $KUBELET_DRA_IMAGE_CACHE or "
                             "~/.cache/kubelet-dra/image)")  # fmt: skip
    parser.add_argument("--tag", help="the layout's tag (default: the package version)")
    parser.add_argument("--install-tools", action="store_true",
                        help="apt-get install mmdebstrap, umoci, skopeo when missing")  # fmt: skip
    parser.add_argument(
        "--load", action="store_true", help=f"copy it into podman's storage as {REPOSITORY}:TAG"
    )
    parser.add_argument("--keep-rootfs", action="store_true", help="keep it in OUT/rootfs")
    args = parser.parse_args(argv)
    try:
        check_tools(args.install_tools)
    except Skip as exc:
        log(f"SKIPPED: {exc}")
        return EXIT_SKIP
    report = build(args.out.resolve(), args.cache.resolve(), args.tag, args.keep_rootfs)
    sys.stdout.write((args.out / "image-packages.txt").read_text())
    if args.load:
        log(f"loaded as {load(args.out.resolve() / 'oci', args.tag or project_version())}")
    log(f"{report['image']} {report['digest']} in {args.out / 'oci'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
