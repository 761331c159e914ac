"""The krew plugin ``dra-health``: its launcher archive and the manifest's checksum.

``deploy/krew/dra-health.yaml`` is a krew plugin manifest (hand-written). krew installs a
plugin from an archive per platform; ``kubectl dra-health`` is a Python program, so the
archive holds a launcher, not the program: ``deploy/krew/kubectl-dra_health`` (a POSIX sh
script that runs ``python3 -m kubelet_dra.kubectl``) and ``deploy/krew/LICENSE``. The same
archive serves every platform that has a POSIX shell (linux, darwin); the package comes
from pip (the manifest's caveats say so).

The archive is built byte for byte the same every time (sorted members, fixed owner, mode
and mtime, a gzip header without time or name), so the manifest's ``sha256`` is the
checksum of what this module builds. ``python -m tests.deploy.krew_plugin DIR`` writes the
archive into DIR (to upload to the manifest's ``uri``) and prints its sha256;
``tests/deploy/test_krew_manifest.py`` fails when the manifest's sha256, version or uri
does not match.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import sys
import tarfile
from pathlib import Path

import kubelet_dra

ROOT = Path(__file__).resolve().parents[2]
KREW = ROOT / "deploy" / "krew"
MANIFEST = KREW / "dra-health.yaml"
LAUNCHER = "kubectl-dra_health"
#: archive member -> file mode.
MEMBERS = {"LICENSE": 0o644, LAUNCHER: 0o755}
#: 2026-01-01T00:00:00Z: the members' mtime (any fixed value keeps the checksum stable).
MTIME = 1767225600


def version() -> str:
    """The package's version (``kubelet_dra.__version__``, its one place), as the manifest
    writes it (``v0.1.0``)."""
    return "v" + kubelet_dra.__version__


def archive_name() -> str:
    return f"kubectl-dra_health-{version()}.tar.gz"


def archive_bytes(source: Path = KREW) -> bytes:
    """The launcher archive of ``source`` (deploy/krew), reproducibly."""
    tar_buffer = io.BytesIO()
    with tarfile.open(fileobj=tar_buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, mode in sorted(MEMBERS.items()):
            data = (source / name).read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, MTIME
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            tar.addfile(info, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0) as gz:
        gz.write(tar_buffer.getvalue())
    return out.getvalue()


def sha256() -> str:
    return hashlib.sha256(archive_bytes()).hexdigest()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.deploy.krew_plugin DIR", file=sys.stderr)
        return 2
    target = Path(argv[0]) / archive_name()
    target.write_bytes(archive_bytes())
    print(f"{target}  sha256 {sha256()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
