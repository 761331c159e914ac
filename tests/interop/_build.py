"""Build the Go binaries of the interop tests once per version into a cache directory.

Each artifact is a small Go module under ``tests/interop`` (the two scripted test drivers,
kube-apiserver, etcd, and kube-scheduler plus kube-controller-manager for the taint proofs)
or elsewhere (``root``: the kubelet twins of ``tests/conformance``, the tools of
``tests/tools``), all built through :func:`ensure_artifact`. A binary is stored under
``<cache>/<name>-<upstream version>/<source hash>/<binary>``, where ``<cache>`` is
``$KUBELET_DRA_INTEROP_CACHE`` or ``~/.cache/kubelet-dra/interop`` and the source hash covers
the module's go.mod, go.sum and Go files plus the Go version (and any extra build
environment, e.g. ``GOTOOLCHAIN``), so a second run reuses the
binary and an edit of the driver rebuilds it. The Go module and build caches stay wherever
``go env`` puts them (never inside the repository).

If ``go`` is missing, or the modules cannot be downloaded for want of the network or the
proxy (:func:`is_network_error`), ``ensure`` raises :class:`BuildUnavailable` with a reason
meant for ``pytest.skip`` (which fails under CI unless ``tests/allowed-skips.toml`` allows
it); any other ``go list`` failure (a broken go.sum, a wrong pin) and a compile error raise
:class:`BuildFailed`, which fails the run.

The command-line tools of the deploy tests (helm, promtool; :data:`TOOL_ARTIFACTS`) are
built the same way from modules under ``tests/tools`` that pin an upstream command.

containerd, ``ctr``, the runc shim, runc and a pause binary of the node tier
(:data:`NODE_ARTIFACTS`) come from modules under ``tests/node`` in the same way.

Run ``python tests/interop/_build.py [name ...]`` to prebuild and print the build times.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

INTEROP_DIR = Path(__file__).resolve().parent
#: Modules of command-line tools the deploy tests run (helm, promtool).
TOOLS_DIR = INTEROP_DIR.parent / "tools"
CACHE_ENV = "KUBELET_DRA_INTEROP_CACHE"
#: Seconds allowed for downloading modules and for one build (kube-apiserver is large).
DOWNLOAD_TIMEOUT = 900.0
BUILD_TIMEOUT = 3600.0

_K8S_VERSION_PKG = "k8s.io/component-base/version"


class BuildUnavailable(Exception):
    """The binary cannot be built here (no Go, no module proxy); ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class BuildFailed(Exception):
    """Go was available but the build itself failed."""


@dataclasses.dataclass(frozen=True)
class GoArtifact:
    """One Go binary built from a module directory below ``root`` (``tests/interop``)."""

    name: str
    version: str
    module: str
    binary: str
    #: Other module directories (relative to tests/interop) whose sources the build uses.
    extra_sources: tuple[str, ...] = ()
    ldflags: str = "-s -w"
    #: The directory ``module`` and ``extra_sources`` are relative to.
    root: Path = INTEROP_DIR
    #: The package to build: the module's own main package, or an upstream command that the
    #: module requires (a ``tool`` line in its go.mod), e.g. ``helm.sh/helm/v4/cmd/helm``.
    package: str = "."
    #: Build tags (``go build -tags``), e.g. to leave out parts of a large command.
    tags: str = ""
    #: Extra environment for every go command (e.g. ``GOTOOLCHAIN``); part of the cache key.
    env: tuple[tuple[str, str], ...] = ()

    @property
    def module_dir(self) -> Path:
        return self.root / self.module


def _k8s_ldflags(version: str) -> str:
    major, minor = version.lstrip("v").split(".")[:2]
    pkg = _K8S_VERSION_PKG
    return (
        f"-s -w -X {pkg}.gitMajor={major} -X {pkg}.gitMinor={minor} "
        f"-X {pkg}.gitVersion={version} -X {pkg}.gitTreeState=clean"
    )


ARTIFACTS: dict[str, GoArtifact] = {
    a.name: a
    for a in (
        GoArtifact(
            "driver-current",
            "v0.37.2",
            "driver/current",
            "interop-driver",
            extra_sources=("driver/common",),
        ),
        GoArtifact(
            "driver-v035",
            "v0.35.10",
            "driver/v035",
            "interop-driver-v035",
            extra_sources=("driver/common",),
        ),
        GoArtifact(
            "kube-apiserver",
            "v1.37.2",
            "apiserver",
            "kube-apiserver",
            ldflags=_k8s_ldflags("v1.37.2"),
        ),
        GoArtifact("etcd", "v3.7.3", "etcd", "etcd"),
        GoArtifact(
            "kube-scheduler",
            "v1.37.2",
            "scheduler",
            "kube-scheduler",
            ldflags=_k8s_ldflags("v1.37.2"),
        ),
        GoArtifact(
            "kube-controller-manager",
            "v1.37.2",
            "controllermanager",
            "kube-controller-manager",
            ldflags=_k8s_ldflags("v1.37.2"),
        ),
    )
}

#: Command-line tools, built from ``tests/tools/<name>`` (a go.mod that pins the upstream
#: release with a ``tool`` line, and its go.sum): Helm for the chart in deploy/helm and
#: promtool for the alerting rules in deploy/monitoring.
HELM_VERSION = "v4.3.2"
#: Helm 3, which most clusters are still driven by. Built like a user's ``go install``: the
#: version is linked in, the Kubernetes version is not (its release Makefile links
#: ``pkg/chartutil.k8sVersionMinor``), so it assumes Kubernetes 1.20 unless given
#: ``--kube-version`` (the chart needs 1.30).
HELM3_VERSION = "v3.22.0"
PROMETHEUS_VERSION = "v0.316.0"  # the Go module version of Prometheus 3.16.0
#: Grafana's dashboard types (generated from the dashboard schema Grafana publishes), read
#: by a small checker of ours in tests/tools/grafana-dashboard.
GRAFANA_SDK_VERSION = "v0.0.22"
#: kubectl, for the plugin's lookup through a real kubectl (k8s.io/kubectl's command).
KUBECTL_VERSION = "v1.37.2"
#: krew's manifest validator (the one release the module proxy serves).
KREW_VERSION = "v0.4.3"
TOOL_ARTIFACTS: dict[str, GoArtifact] = {
    a.name: a
    for a in (
        GoArtifact(
            "helm",
            HELM_VERSION,
            "helm",
            "helm",
            root=TOOLS_DIR,
            package="helm.sh/helm/v4/cmd/helm",
            ldflags=(
                f"-s -w -X helm.sh/helm/v4/internal/version.version={HELM_VERSION} "
                "-X helm.sh/helm/v4/internal/version.gitTreeState=clean"
            ),
        ),
        GoArtifact(
            "helm3",
            HELM3_VERSION,
            "helm3",
            "helm",
            root=TOOLS_DIR,
            package="helm.sh/helm/v3/cmd/helm",
            ldflags=(
                f"-s -w -X helm.sh/helm/v3/internal/version.version={HELM3_VERSION} "
                "-X helm.sh/helm/v3/internal/version.gitTreeState=clean"
            ),
        ),
        GoArtifact(
            "promtool",
            PROMETHEUS_VERSION,
            "promtool",
            "promtool",
            root=TOOLS_DIR,
            package="github.com/prometheus/prometheus/cmd/promtool",
            # Without the service discovery plugins (cloud SDKs): `check rules` and
            # `test rules` need none of them, and the build is several times smaller.
            tags="remove_all_sd",
            ldflags=(
                "-s -w -X github.com/prometheus/common/version.Version=3.16.0 "
                "-X github.com/prometheus/common/version.Branch=release"
            ),
        ),
        GoArtifact(
            "grafana-dashboard-check",
            GRAFANA_SDK_VERSION,
            "grafana-dashboard",
            "grafana-dashboard-check",
            root=TOOLS_DIR,
        ),
        GoArtifact(
            "kubectl",
            KUBECTL_VERSION,
            "kubectl",
            "kubectl",
            root=TOOLS_DIR,
            ldflags=_k8s_ldflags(KUBECTL_VERSION),
        ),
        GoArtifact(
            "validate-krew-manifest",
            KREW_VERSION,
            "krew",
            "validate-krew-manifest",
            root=TOOLS_DIR,
            package="sigs.k8s.io/krew/cmd/validate-krew-manifest",
        ),
    )
}
ARTIFACTS.update(TOOL_ARTIFACTS)

#: The e2e tier's real kubelet, one module per line under ``tests/e2e/kubelet`` (written by
#: its ``gomod.py``), and the in-memory fake container runtime it runs pods on.
E2E_DIR = INTEROP_DIR.parent / "e2e"
KUBELET_LINES: dict[str, tuple[str, str, tuple[tuple[str, str], ...]]] = {
    # line: (module directory, version, extra go environment)
    "1.35": ("v135", "v1.35.5", ()),
    "1.37": ("v137", "v1.37.2", ()),
    "1.38": ("v138", "v1.38.0-beta.0", (("GOTOOLCHAIN", "go1.27.3"),)),
}
E2E_ARTIFACTS: dict[str, GoArtifact] = {
    f"kubelet-{line}": GoArtifact(
        f"kubelet-{line}",
        version,
        f"kubelet/{module}",
        "kubelet",
        root=E2E_DIR,
        ldflags=_k8s_ldflags(version),
        env=env,
    )
    for line, (module, version, env) in KUBELET_LINES.items()
}
E2E_ARTIFACTS["fakecri"] = GoArtifact("fakecri", "v0.37.2", "fakecri", "fakecri", root=E2E_DIR)
ARTIFACTS.update(E2E_ARTIFACTS)

#: The node tier's container runtime, built from ``tests/node/containerd`` (a go.mod whose
#: ``tool`` lines pin containerd's commands), with the tags and link flags of containerd's
#: own Makefile; the shim is static (no cgo) and without gRPC, as upstream ships it. The
#: pause image's static sandbox process is a module of ours beside it.
NODE_DIR = INTEROP_DIR.parent / "node"
CONTAINERD_VERSION = "v2.4.2"
RUNC_VERSION = "v1.5.3"
_CONTAINERD_PKG = "github.com/containerd/containerd/v2"
_CONTAINERD_LDFLAGS = (
    f"-s -w -X {_CONTAINERD_PKG}/version.Version={CONTAINERD_VERSION} "
    f"-X {_CONTAINERD_PKG}/version.Package={_CONTAINERD_PKG}"
)
NODE_ARTIFACTS: dict[str, GoArtifact] = {
    a.name: a
    for a in (
        GoArtifact(
            "containerd",
            CONTAINERD_VERSION,
            "containerd",
            "containerd",
            root=NODE_DIR,
            package=f"{_CONTAINERD_PKG}/cmd/containerd",
            tags="urfave_cli_no_docs",
            ldflags=_CONTAINERD_LDFLAGS,
        ),
        GoArtifact(
            "ctr",
            CONTAINERD_VERSION,
            "containerd",
            "ctr",
            root=NODE_DIR,
            package=f"{_CONTAINERD_PKG}/cmd/ctr",
            tags="urfave_cli_no_docs",
            ldflags=_CONTAINERD_LDFLAGS,
        ),
        GoArtifact(
            "containerd-shim-runc-v2",
            CONTAINERD_VERSION,
            "containerd",
            "containerd-shim-runc-v2",
            root=NODE_DIR,
            package=f"{_CONTAINERD_PKG}/cmd/containerd-shim-runc-v2",
            tags="urfave_cli_no_docs no_grpc",
            ldflags=_CONTAINERD_LDFLAGS,
            env=(("CGO_ENABLED", "0"),),
        ),
        # runc as its Makefile builds it, without libpathrs (a Rust library Debian does not
        # ship); cgo with Debian's libseccomp-dev for the seccomp profiles.
        GoArtifact(
            "runc",
            RUNC_VERSION,
            "runc",
            "runc",
            root=NODE_DIR,
            package="github.com/opencontainers/runc",
            tags="seccomp urfave_cli_no_docs",
            ldflags=f"-s -w -X main.gitCommit={RUNC_VERSION}",
        ),
        # The sandbox process of the node tier's pause image (tests/node/_images.py).
        GoArtifact(
            "node-pause",
            "v0.1.0",
            "pause",
            "pause",
            root=NODE_DIR,
            env=(("CGO_ENABLED", "0"),),
        ),
    )
}
ARTIFACTS.update(NODE_ARTIFACTS)

#: Names accepted for the two driver builds (helper release, Kubernetes minor, short name).
DRIVER_ALIASES: dict[str, str] = {
    "current": "driver-current",
    "new": "driver-current",
    "v0.37.2": "driver-current",
    "1.37": "driver-current",
    "v035": "driver-v035",
    "old": "driver-v035",
    "v0.35.10": "driver-v035",
    "1.35": "driver-v035",
}


def cache_root() -> Path:
    """The cache directory: ``$KUBELET_DRA_INTEROP_CACHE`` or ``~/.cache/kubelet-dra/interop``."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    return Path("~/.cache/kubelet-dra/interop").expanduser()


def _go_env(extra: Sequence[tuple[str, str]] = ()) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    env["GOWORK"] = "off"
    flags = env.get("GOFLAGS", "")
    if "-mod=" not in flags:
        env["GOFLAGS"] = (flags + " -mod=readonly").strip()
    return env


def go_unavailable_reason() -> str | None:
    """Why Go cannot be used here, or None if a ``go`` command runs."""
    go = shutil.which("go")
    if go is None:
        return "Go toolchain not found on PATH (the interop tests build Go binaries)"
    try:
        proc = subprocess.run(
            [go, "env", "GOVERSION"],
            capture_output=True,
            text=True,
            timeout=60,
            env=_go_env(),
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`go env` failed: {exc}"
    if proc.returncode != 0:
        return f"`go env` failed: {proc.stderr.strip()[-500:]}"
    return None


#: What the go command prints when the module proxy (or the network to it) is not there, or
#: refuses a module outright (403: this proxy's policy, e.g. sigs.k8s.io/iptables-wrappers).
#: Anything else from ``go list`` (a checksum mismatch, an unknown revision, a missing go.sum
#: line, a toolchain too old) is the repository's to fix and fails the build.
NETWORK_ERRORS = (
    "dial tcp",
    "no such host",
    "connection refused",
    "connection reset",
    "network is unreachable",
    "i/o timeout",
    "TLS handshake timeout",
    "proxyconnect",
    "server misbehaving",
    "unexpected EOF",
    "403 Forbidden",
    "429 Too Many Requests",
    "500 Internal Server Error",
    "502 Bad Gateway",
    "503 Service Unavailable",
    "504 Gateway Timeout",
)
#: Lines that are the repository's fault even when the network also failed for something.
_OUR_ERRORS = ("checksum mismatch", "SECURITY ERROR", "missing go.sum entry", "unknown revision",
               "invalid version", "requires go >=")  # fmt: skip


#: Modules this proxy refuses by policy (403 for every version), so that no go.sum of ours can
#: hold them: a missing go.sum entry for one of them is the proxy's, not the repository's.
REFUSED_MODULES = ("sigs.k8s.io/iptables-wrappers",)


def is_network_error(stderr: str) -> bool:
    """Whether a failed go command's output blames the network or the proxy, not us."""
    missing = [line for line in stderr.splitlines() if "missing go.sum entry" in line]
    if missing and all(any(m in line for m in REFUSED_MODULES) for line in missing):
        return True
    if any(marker in stderr for marker in _OUR_ERRORS):
        return False
    return any(marker in stderr for marker in NETWORK_ERRORS)


def _go_version(extra: Sequence[tuple[str, str]] = ()) -> str:
    # Under GOTOOLCHAIN=<version> this fetches that toolchain: one the network cannot bring
    # is an environment problem (unavailable); a toolchain that does not exist is a pin of
    # ours to fix (failed).
    try:
        proc = subprocess.run(
            ["go", "env", "GOVERSION"],
            capture_output=True,
            text=True,
            timeout=DOWNLOAD_TIMEOUT,
            env=_go_env(extra),
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise BuildUnavailable(f"`go env GOVERSION` with {dict(extra)} timed out") from None
    if proc.returncode != 0:
        message = f"`go env GOVERSION` with {dict(extra)} failed: {_tail(proc.stderr, 600)}"
        if is_network_error(proc.stderr):
            raise BuildUnavailable(message)
        raise BuildFailed(message)
    return proc.stdout.strip()


def _source_files(artifact: GoArtifact) -> list[Path]:
    files: list[Path] = []
    for rel in (artifact.module, *artifact.extra_sources):
        base = artifact.root / rel
        for path in sorted(base.rglob("*")):
            if path.is_file() and (
                path.suffix in (".go", ".s") or path.name in ("go.mod", "go.sum")
            ):
                files.append(path)
    return files


def source_key(artifact: GoArtifact, go_version: str) -> str:
    """Hash of everything that decides the binary: sources, Go version, link flags."""
    digest = hashlib.sha256()
    digest.update(f"{go_version}\0{artifact.ldflags}\0".encode())
    if artifact.tags:
        digest.update(f"tags={artifact.tags}\0".encode())
    for key, value in artifact.env:
        digest.update(f"env {key}={value}\0".encode())
    for path in _source_files(artifact):
        digest.update(str(path.relative_to(artifact.root)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def binary_path(artifact: GoArtifact, go_version: str) -> Path:
    return (
        cache_root()
        / f"{artifact.name}-{artifact.version}"
        / source_key(artifact, go_version)
        / artifact.binary
    )


def build_info(path: Path) -> dict[str, object]:
    """The build record stored next to a cached binary (build seconds, Go version, ...)."""
    info = path.with_name("build-info.json")
    if not info.exists():
        return {}
    loaded = json.loads(info.read_text())
    return loaded if isinstance(loaded, dict) else {}


def _run(
    cmd: Sequence[str], cwd: Path, timeout: float, extra: Sequence[tuple[str, str]] = ()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(cmd),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_go_env(extra),
        check=False,
    )


def _tag_args(artifact: GoArtifact) -> list[str]:
    return ["-tags", artifact.tags] if artifact.tags else []


def _tail(text: str, limit: int = 1500) -> str:
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]


def ensure(name: str, *, log: bool = True) -> Path:
    """Return the cached binary for artifact ``name``, building it first if needed."""
    return ensure_artifact(ARTIFACTS[DRIVER_ALIASES.get(name, name)], log=log)


def ensure_artifact(artifact: GoArtifact, *, log: bool = True) -> Path:
    """Return the cached binary of ``artifact``, building it first if needed."""
    reason = go_unavailable_reason()
    if reason is not None:
        raise BuildUnavailable(reason)
    go_version = _go_version(artifact.env)
    target = binary_path(artifact, go_version)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent.parent / ".lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():  # built by a concurrent process while we waited
            return target
        if log:
            print(
                f"[interop] building {artifact.name} {artifact.version} (cold builds take minutes)",
                file=sys.stderr,
                flush=True,
            )
        start = time.monotonic()
        # Step 1: resolve and download only what the build needs. A failure here is an
        # environment problem (no module proxy), not a bug: report it as unavailable.
        try:
            listed = _run(
                ["go", "list", "-deps", *_tag_args(artifact), artifact.package],
                artifact.module_dir,
                DOWNLOAD_TIMEOUT,
                artifact.env,
            )
        except subprocess.TimeoutExpired:
            raise BuildUnavailable(
                f"downloading Go modules for {artifact.name} timed out "
                "(is the Go module proxy reachable?)"
            ) from None
        if listed.returncode != 0:
            if is_network_error(listed.stderr):
                raise BuildUnavailable(
                    f"cannot download Go modules for {artifact.name} {artifact.version} "
                    f"(is the Go module proxy reachable?): {_tail(listed.stderr, 600)}"
                )
            raise BuildFailed(
                f"`go list -deps` of {artifact.name} {artifact.version} failed, and not for "
                f"want of the network (a go.mod, go.sum or pin to fix):\n{_tail(listed.stderr)}"
            )
        downloaded = time.monotonic()
        tmp = target.with_name(target.name + f".tmp{os.getpid()}")
        try:
            built = _run(
                [
                    "go",
                    "build",
                    "-trimpath",
                    *_tag_args(artifact),
                    "-ldflags",
                    artifact.ldflags,
                    "-o",
                    str(tmp),
                    artifact.package,
                ],
                artifact.module_dir,
                BUILD_TIMEOUT,
                artifact.env,
            )
        except subprocess.TimeoutExpired:
            tmp.unlink(missing_ok=True)
            raise BuildFailed(f"go build of {artifact.name} timed out") from None
        if built.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise BuildFailed(f"go build of {artifact.name} failed:\n{_tail(built.stderr)}")
        end = time.monotonic()
        info = {
            "name": artifact.name,
            "version": artifact.version,
            "go": go_version,
            "download_seconds": round(downloaded - start, 1),
            "build_seconds": round(end - downloaded, 1),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        target.with_name("build-info.json").write_text(json.dumps(info, indent=2) + "\n")
        tmp.replace(target)
        if log:
            print(
                f"[interop] built {artifact.name} in {end - start:.0f}s",
                file=sys.stderr,
                flush=True,
            )
    return target


def main(argv: Iterable[str]) -> int:
    """Prebuild the named artifacts (all by default) and print where they are."""
    names = list(argv) or list(ARTIFACTS)
    status = 0
    for name in names:
        start = time.monotonic()
        try:
            path = ensure(name)
        except BuildUnavailable as exc:
            print(f"{name}: unavailable: {exc.reason}")
            status = 2
            continue
        except BuildFailed as exc:
            print(f"{name}: FAILED: {exc}")
            status = 1
            continue
        print(
            f"{name}: {path} (this call {time.monotonic() - start:.1f}s; "
            f"recorded build {build_info(path)})"
        )
    return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
