"""The krew plugin manifest ``deploy/krew/dra-health.yaml``, checked with krew's own
``validate-krew-manifest`` (sigs.k8s.io/krew v0.4.3, built from the Go module proxy; the
test skips without Go), and its launcher archive (``tests/deploy/krew_plugin.py``).

The validator runs with ``-skip-install``: its install step downloads the manifest's uri,
where nothing is published yet. What the install would check of the archive (its sha256,
the ``files`` and ``bin`` it names, a LICENSE) is checked here against the archive that
``krew_plugin`` builds.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from . import krew_plugin


def _validate(validator: Path, manifest: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(validator), "-manifest", str(manifest), "-skip-install"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(manifest.parent)},
    )


def _manifest() -> dict[str, object]:
    loaded: dict[str, object] = yaml.safe_load(krew_plugin.MANIFEST.read_text(encoding="utf-8"))
    return loaded


def test_manifest_passes_validate_krew_manifest(validate_krew_manifest_bin: Path) -> None:
    proc = _validate(validate_krew_manifest_bin, krew_plugin.MANIFEST)
    assert proc.returncode == 0, proc.stderr
    assert "structural validation OK" in proc.stderr
    assert "no overlapping spec.platform[].selector" in proc.stderr


def _platform(doc: dict[str, object]) -> dict[str, object]:
    spec = doc["spec"]
    assert isinstance(spec, dict)
    platform: dict[str, object] = spec["platforms"][0]
    return platform


def _bad_sha(doc: dict[str, object]) -> None:
    _platform(doc)["sha256"] = "not-a-checksum"


def _no_platform_matches(doc: dict[str, object]) -> None:
    _platform(doc)["selector"] = {"matchLabels": {"os": "plan9"}}


def _overlapping(doc: dict[str, object]) -> None:
    spec = doc["spec"]
    assert isinstance(spec, dict)
    spec["platforms"].append(dict(_platform(doc), selector={"matchLabels": {"os": "linux"}}))


def _other_name(doc: dict[str, object]) -> None:
    doc["metadata"] = {"name": "dra_health"}


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (_bad_sha, "`sha256` value not-a-checksum is not valid"),
        (_no_platform_matches, "doesn't match any supported platforms"),
        (_overlapping, "overlapping selectors"),
        (_other_name, 'plugin should be named "dra-health"'),
    ],
    ids=["sha256", "no-platform", "overlap", "name"],
)
def test_validator_refuses_a_spoiled_manifest(
    validate_krew_manifest_bin: Path, tmp_path: Path, spoil: object, message: str
) -> None:
    """The check can fail: each spoiled copy is refused, with krew's reason."""
    doc = _manifest()
    assert callable(spoil)
    spoil(doc)
    copy = tmp_path / "dra-health.yaml"
    copy.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    proc = _validate(validate_krew_manifest_bin, copy)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_manifest_names_the_archive_this_repository_builds() -> None:
    doc = _manifest()
    spec = doc["spec"]
    assert isinstance(spec, dict)
    assert spec["version"] == krew_plugin.version()
    (platform,) = spec["platforms"]
    assert platform["sha256"] == krew_plugin.sha256(), (
        "the launcher archive changed: put its sha256 (python -m tests.deploy.krew_plugin DIR) "
        "in deploy/krew/dra-health.yaml"
    )
    assert platform["uri"].endswith(f"/{krew_plugin.version()}/{krew_plugin.archive_name()}")
    assert platform["bin"] == krew_plugin.LAUNCHER
    with tarfile.open(fileobj=io.BytesIO(krew_plugin.archive_bytes())) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert {f["from"] for f in platform["files"]} == set(members) == set(krew_plugin.MEMBERS)
    assert members[krew_plugin.LAUNCHER].mode & 0o111


def test_archive_is_reproducible() -> None:
    first = hashlib.sha256(krew_plugin.archive_bytes()).hexdigest()
    assert first == hashlib.sha256(krew_plugin.archive_bytes()).hexdigest()


def _unpack(tmp_path: Path) -> Path:
    with tarfile.open(fileobj=io.BytesIO(krew_plugin.archive_bytes())) as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path / krew_plugin.LAUNCHER


def test_launcher_runs_the_plugin(tmp_path: Path) -> None:
    launcher = _unpack(tmp_path)
    env = {
        "PATH": "/usr/bin:/bin",
        "KUBECTL_DRA_HEALTH_PYTHON": sys.executable,
        "PYTHONPATH": str(krew_plugin.ROOT),
    }
    proc = subprocess.run(
        [str(launcher), "--help"], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: kubectl dra-health"), proc.stdout


def test_launcher_without_the_package_says_what_to_install(tmp_path: Path) -> None:
    launcher = _unpack(tmp_path)
    # A python without site-packages (-I -S): kubelet_dra is not importable there.
    bare = tmp_path / "bare-python"
    bare.write_text(f'#!/bin/sh\nexec "{sys.executable}" -I -S "$@"\n', encoding="utf-8")
    bare.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KUBECTL_DRA_HEALTH_PYTHON": str(bare)}
    proc = subprocess.run(
        [str(launcher), "devices"], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert proc.returncode == 127
    assert "pip install kubelet-dra" in proc.stderr
    assert f"not importable by {bare}" in proc.stderr
