"""The node tier's two images, built here from no registry: a pause image and a busybox one.

- **pause**: the static sandbox process of ``tests/node/pause`` (built by
  ``tests/interop/_build.py`` like every Go binary) as ``/pause``.
- **busybox**: Debian's ``busybox-static`` (``apt-get download``, unpacked with ``dpkg-deb``),
  ``/bin/busybox`` with a link for each of its applets, so ``sh -c '...'`` runs.

Each is one uncompressed layer in an OCI layout written here (hashlib and tarfile: no image
tool is needed for two files), archived as ``oci-archive`` by ``deploy/image/build.py``'s
``archive`` (members sorted, owners and times fixed), so one input always gives one digest.
An archive is cached under ``<cache>/node-images/<name>-<key>/`` where the key hashes this
file and the input (the pause binary's bytes, the Debian package's version): a warm run
builds nothing and downloads nothing. :func:`ensure_images` returns both; containerd's
``ctr images import`` reads the archive's ``io.containerd.image.name`` annotation.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tests.image._build import load_build
from tests.interop import _build

#: The image names the pods use (``imagePullPolicy: Never``: the kubelet never pulls them).
REPOSITORY = "localhost/kubelet-dra"
BUSYBOX_PACKAGE = "busybox-static"
#: Every member of every layer has this mtime, so the digest depends on content only.
EPOCH = 0
LAYER_MEDIA = "application/vnd.oci.image.layer.v1.tar"
CONFIG_MEDIA = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA = "application/vnd.oci.image.manifest.v1+json"


class ImageUnavailable(Exception):
    """An image cannot be built here (no Debian package, no Go); ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class Image:
    """One built image: the name pods use and its ``oci-archive`` file."""

    name: str
    archive: Path
    build_seconds: float = 0.0


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One member of a layer: a file (``data``), a directory, or a symlink (``link``)."""

    path: str
    mode: int = 0o755
    data: bytes | None = None
    link: str | None = None


def cache_root() -> Path:
    return _build.cache_root().parent / "node-images"


def _builder_hash() -> bytes:
    return Path(__file__).read_bytes()


def ensure_images() -> tuple[Image, Image]:
    """(pause, busybox), each built once per input and cached."""
    return ensure_pause(), ensure_busybox()


def ensure_pause() -> Image:
    try:
        binary = _build.ensure("node-pause")
    except _build.BuildUnavailable as exc:
        raise ImageUnavailable(f"the pause binary cannot be built: {exc.reason}") from None
    data = binary.read_bytes()
    key = _key(b"pause", data)
    entries = [_Entry("pause", 0o755, data=data), *_dirs("dev", "proc", "sys", "etc")]
    config: dict[str, object] = {"Entrypoint": ["/pause"], "Env": ["PATH=/"]}
    return _cached("pause", key, lambda: (entries, config))


def ensure_busybox() -> Image:
    version = _candidate_version(BUSYBOX_PACKAGE)
    key = _key(b"busybox", version.encode())

    def content() -> tuple[list[_Entry], dict[str, object]]:
        busybox = _busybox_binary(version)
        entries = [_Entry("bin/busybox", 0o755, data=busybox)]
        entries += [_Entry(applet, link="/bin/busybox") for applet in _applets(busybox)]
        entries += _dirs("bin", "dev", "proc", "sys", "etc", "tmp", "usr", "usr/bin", "sbin")
        entries += _dirs("usr/sbin")
        config: dict[str, object] = {"Cmd": ["sh"], "Env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]}
        return entries, config

    return _cached("busybox", key, content)


def _key(kind: bytes, data: bytes) -> str:
    digest = hashlib.sha256(kind + b"\0" + _builder_hash() + b"\0" + data)
    return digest.hexdigest()[:16]


def _dirs(*names: str) -> list[_Entry]:
    return [_Entry(name) for name in names]


_Content = Callable[[], tuple[list["_Entry"], dict[str, object]]]


def _cached(name: str, key: str, content: _Content) -> Image:
    image_name = f"{REPOSITORY}/{name}:{key[:12]}"
    target = cache_root() / f"{name}-{key}" / "image.oci.tar"
    if target.exists():
        return Image(image_name, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            return Image(image_name, target)
        start = time.monotonic()
        entries, config = content()
        with tempfile.TemporaryDirectory(prefix=f"node-image-{name}-") as tmp:
            layout = Path(tmp) / "layout"
            _write_layout(layout, image_name, entries, config)
            partial = target.with_name(f"image.oci.tar.tmp{os.getpid()}")
            load_build().archive(layout, partial, EPOCH)
            partial.replace(target)
        seconds = round(time.monotonic() - start, 1)
        (target.parent / "build-info.json").write_text(
            json.dumps({"name": image_name, "build_seconds": seconds}, indent=2) + "\n"
        )
        return Image(image_name, target, seconds)


def _layer(entries: list[_Entry]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in sorted(entries, key=lambda e: e.path):
            info = tarfile.TarInfo(entry.path)
            info.mtime, info.mode, info.uid, info.gid = EPOCH, entry.mode, 0, 0
            if entry.link is not None:
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, entry.link, 0o777
                tar.addfile(info)
            elif entry.data is not None:
                info.size = len(entry.data)
                tar.addfile(info, io.BytesIO(entry.data))
            else:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
    return buffer.getvalue()


def _blob(layout: Path, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    path = layout / "blobs" / "sha256" / digest.split(":", 1)[1]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return digest


def _write_layout(
    layout: Path, image_name: str, entries: list[_Entry], config: dict[str, object]
) -> None:
    """An OCI image layout (index.json, oci-layout, blobs) holding one single-layer image."""
    layer = _layer(entries)
    layer_digest = _blob(layout, layer)
    arch = load_build().deb_arch()
    image_config = {
        "architecture": arch,
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    }
    config_bytes = _json(image_config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA,
        "config": {"mediaType": CONFIG_MEDIA, "digest": _blob(layout, config_bytes),
                   "size": len(config_bytes)},
        "layers": [{"mediaType": LAYER_MEDIA, "digest": layer_digest, "size": len(layer)}],
    }  # fmt: skip
    manifest_bytes = _json(manifest)
    tag = image_name.rsplit(":", 1)[1]
    index = {
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": MANIFEST_MEDIA, "digest": _blob(layout, manifest_bytes),
            "size": len(manifest_bytes), "platform": {"architecture": arch, "os": "linux"},
            "annotations": {"io.containerd.image.name": image_name,
                            "org.opencontainers.image.ref.name": tag},
        }],
    }  # fmt: skip
    (layout / "index.json").write_bytes(_json(index))
    (layout / "oci-layout").write_bytes(_json({"imageLayoutVersion": "1.0.0"}))


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _candidate_version(package: str) -> str:
    """The version apt would install (no download: this is the cache key)."""
    if shutil.which("apt-cache") is None:
        raise ImageUnavailable(f"no apt-cache here to find Debian's {package}")
    done = subprocess.run(
        ["apt-cache", "policy", package], capture_output=True, text=True, check=False
    )
    for line in done.stdout.splitlines():
        label, _, value = line.strip().partition(":")
        if label == "Candidate" and value.strip() not in ("", "(none)"):
            return value.strip()
    raise ImageUnavailable(f"Debian's {package} is not known to apt here (apt-get update?)")


def _busybox_binary(version: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="node-busybox-") as tmp:
        fetched = subprocess.run(
            ["apt-get", "download", "-q", f"{BUSYBOX_PACKAGE}={version}"],
            cwd=tmp, capture_output=True, text=True, check=False,
        )  # fmt: skip
        debs = sorted(Path(tmp).glob("*.deb"))
        if fetched.returncode != 0 or not debs:
            raise ImageUnavailable(f"apt-get download {BUSYBOX_PACKAGE}: {fetched.stderr[-500:]}")
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), f"{tmp}/root"], check=True)
        return (Path(tmp) / "root" / "bin" / "busybox").read_bytes()


def _applets(busybox: bytes) -> list[str]:
    """The applets' paths (``bin/sh``, ``usr/bin/env``...), as the binary itself lists them."""
    with tempfile.TemporaryDirectory(prefix="node-busybox-") as tmp:
        path = Path(tmp) / "busybox"
        path.write_bytes(busybox)
        path.chmod(0o755)
        listed = subprocess.run(
            [str(path), "--list-full"], capture_output=True, text=True, check=True
        )
    return sorted(p for p in listed.stdout.split() if p and p != "bin/busybox")
