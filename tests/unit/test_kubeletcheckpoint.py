"""The kubelet's DRA checkpoint: every line's format, bad files, the watcher."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import threading
import zlib
from typing import Any

import pytest

from kubelet_dra import clock
from kubelet_dra.state import kubeletcheckpoint
from kubelet_dra.state.kubeletcheckpoint import CheckpointError
from kubelet_dra.status import claims
from kubelet_dra.testing import eventually
from tests.unit import _kubelet_checkpoint_files as files

C = kubeletcheckpoint


def _file(line: str) -> bytes:
    return (files.DIR / f"v{line}.json").read_bytes()


def _reason(blob: bytes) -> str:
    with pytest.raises(CheckpointError) as caught:
        C.parse(blob)
    return caught.value.reason


def _with_data(data: object, *, checksum: int | None = None) -> bytes:
    text = files.go_json(data) if not isinstance(data, str) else data
    crc = zlib.crc32(text.encode()) if checksum is None else checksum
    return files.go_json({"Data": text, "Checksum": crc}).encode()


def test_the_stored_fixtures_are_what_the_encoder_writes() -> None:
    for line in files.LINES:
        assert _file(line) == files.file_of(line), line
    assert (files.DIR / "empty.json").read_bytes() == files.EMPTY


@pytest.mark.parametrize("line", files.LINES)
def test_every_line_reads_the_same_claims(line: str) -> None:
    found = {c.name: c for c in C.parse(_file(line))}
    assert sorted(found) == ["gpu-claim", "nic-claim", "tpu-claim"]
    gpu = found["gpu-claim"]
    assert (gpu.namespace, gpu.uid, gpu.pod_uids) == ("default", "uid-gpu", frozenset({"pod-1"}))
    assert [(d.driver, d.pool, d.device, d.request_names, d.cdi_ids) for d in gpu.devices] == [
        (files.GPU, "node-a", "gpu-0", ("gpu",), ("vendor.com/gpu=gpu0",)),
        (files.GPU, "node-a", "gpu-1", ("gpu",), ("vendor.com/gpu=gpu1",)),
    ]
    # ShareID exists from 1.35 on; 1.34 has none.
    share = None if line == "1.34" else "aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa"
    assert [d.share_id for d in gpu.devices] == [share, None]
    assert [d.resource_id for d in gpu.devices] == ["vendor.com/gpu=gpu0", "vendor.com/gpu=gpu1"]
    assert found["tpu-claim"].pod_uids == {"pod-2", "pod-3"}
    nic = found["nic-claim"].devices[0]
    # nil RequestNames, CDIDeviceIDs and PodUIDs; skipNodeOperations (1.37+) ignored.
    assert (nic.request_names, nic.cdi_ids) == ((), ())
    assert found["nic-claim"].pod_uids == frozenset()
    assert nic.resource_id == "nic.example.com/node-a/nic-0"


@pytest.mark.parametrize("line", files.LINES)
def test_chips_sharing_a_first_cdi_id_get_their_own(line: str) -> None:
    (tpu,) = [c for c in C.parse(_file(line)) if c.name == "tpu-claim"]
    assert [d.kubelet_id for d in tpu.devices] == ["google.com/tpu=common"] * 4
    assert [d.resource_id for d in tpu.devices] == [f"google.com/tpu={i}" for i in range(4)]


def test_a_new_kubelets_empty_checkpoint_has_no_claims() -> None:
    assert C.parse(files.EMPTY) == ()  # NewCheckpoint(nil): "ClaimInfoStateList":null


def test_null_maps_and_lists_read_as_empty() -> None:
    claim = files.claim("u", "c", None, {"d": {"Devices": None}})
    data = files.checkpoint_data([claim, files.claim("v", "e", [], None)])
    found = C.parse(_with_data(data))
    assert [(c.name, c.devices, c.pod_uids) for c in found] == [
        ("c", (), frozenset()),
        ("e", (), frozenset()),
    ]


def test_a_bad_checksum_is_refused() -> None:
    blob = _file("1.37").replace(b"gpu-claim", b"gpu-clain")
    assert _reason(blob) == C.REASON_CHECKSUM


@pytest.mark.parametrize("cut", [1, 40, 0.5, -2])
def test_a_torn_file_is_refused(cut: float) -> None:
    blob = _file("1.36")
    end = int(len(blob) * cut) if isinstance(cut, float) else cut
    assert _reason(blob[:end]) == C.REASON_JSON


def test_data_that_is_not_json_is_refused_even_with_its_checksum() -> None:
    assert _reason(_with_data('{"kind":')) == C.REASON_JSON


@pytest.mark.parametrize(
    ("field", "value"),
    [("kind", "CPUManagerCheckpoint"), ("apiVersion", "checkpoint.dra.kubelet.k8s.io/v2")],
)
def test_another_kind_or_version_is_refused(field: str, value: str) -> None:
    data = {**files.checkpoint_data([]), field: value}
    assert _reason(_with_data(data)) == C.REASON_KIND


@pytest.mark.parametrize(
    "blob",
    [
        b"[]",
        b"null",
        b'{"Data": "{}"}',
        b'{"Data": 1, "Checksum": 1}',
        b'{"Data": "{}", "Checksum": true}',
        b'{"Data": "{}", "Checksum": -1}',
    ],
)
def test_a_file_of_another_shape_is_refused(blob: bytes) -> None:
    assert _reason(blob) == C.REASON_SHAPE


@pytest.mark.parametrize(
    "claim",
    [
        "not a claim",
        {"ClaimName": 7},
        {"ClaimName": "c", "DriverState": []},
        {"ClaimName": "c", "DriverState": {"d": {"Devices": {}}}},
        {"ClaimName": "c", "DriverState": {"d": {"Devices": [{"CDIDeviceIDs": [1]}]}}},
        {"ClaimName": "c", "DriverState": {"d": {"Devices": [{"ShareID": 5}]}}},
    ],
)
def test_a_claim_of_another_shape_is_refused(claim: Any) -> None:
    with pytest.raises(CheckpointError) as error:
        C.parse(_with_data(files.checkpoint_data([claim])))
    assert error.value.reason == C.REASON_SHAPE
    assert "ClaimInfoStateList[0]" in str(error.value)


def test_read_of_a_missing_file_is_none(tmp_path: pathlib.Path) -> None:
    assert C.read(tmp_path / C.FILE_NAME) is None


def test_read_leaves_the_file_and_its_directory_as_they_were(tmp_path: pathlib.Path) -> None:
    path = tmp_path / C.FILE_NAME
    path.write_bytes(_file("1.38"))
    path.chmod(0o444)
    before = (path.read_bytes(), os.stat(path).st_mtime_ns, sorted(tmp_path.iterdir()))
    assert len(C.read(path) or ()) == 3
    assert (path.read_bytes(), os.stat(path).st_mtime_ns, sorted(tmp_path.iterdir())) == before


# -- the watcher ---------------------------------------------------------------------


class _Applied:
    def __init__(self) -> None:
        self.calls: list[tuple[kubeletcheckpoint.PreparedClaim, ...]] = []

    def __call__(self, found: tuple[kubeletcheckpoint.PreparedClaim, ...]) -> None:
        self.calls.append(found)

    @property
    def names(self) -> list[list[str]]:
        return [sorted(c.name for c in call) for call in self.calls]


def _replace(path: pathlib.Path, blob: bytes) -> None:
    """As the kubelet writes it: a temporary file renamed over the old one."""
    tmp = path.with_name(".tmp-" + path.name)
    tmp.write_bytes(blob)
    tmp.rename(path)


def _watcher(root: pathlib.Path) -> tuple[kubeletcheckpoint.CheckpointWatcher, _Applied]:
    applied = _Applied()
    watcher = C.CheckpointWatcher(root, apply=applied, clock=clock.FakeClock(0.0))
    return watcher, applied


def test_watcher_applies_each_new_file_once(tmp_path: pathlib.Path) -> None:
    watcher, applied = _watcher(tmp_path)
    path = tmp_path / C.FILE_NAME
    assert watcher.poll() is True  # missing: no claims (the API's view)
    assert watcher.poll() is False
    _replace(path, _file("1.35"))
    watcher.poll()
    watcher.poll()
    one = files.envelope(files.checkpoint_data(files.claims_of("1.35")[:1]))
    _replace(path, one)
    watcher.poll()
    path.unlink()
    watcher.poll()
    assert applied.names == [[], ["gpu-claim", "nic-claim", "tpu-claim"], ["gpu-claim"], []]
    assert sum(watcher.refused.values()) == 0


def test_watcher_counts_a_refused_file_once_and_keeps_what_it_had(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    watcher, applied = _watcher(tmp_path)
    path = tmp_path / C.FILE_NAME
    _replace(path, _file("1.37"))
    watcher.poll()
    _replace(path, _file("1.37")[:-10])
    for _ in range(3):
        watcher.poll()
    assert watcher.refused[C.REASON_JSON] == 1
    assert len(applied.calls) == 1  # the claims read before stay
    assert "refused (json" in caplog.text
    _replace(path, _file("1.37").replace(b"tpu-claim", b"tpu-clain"))
    watcher.poll()
    assert watcher.refused[C.REASON_CHECKSUM] == 1
    _replace(path, _file("1.38"))
    watcher.poll()
    assert len(applied.calls) == 2 and watcher.last_error == ""


async def test_watcher_polls_on_the_injected_clock(tmp_path: pathlib.Path) -> None:
    fake = clock.FakeClock(0.0)
    applied = _Applied()
    watcher = C.CheckpointWatcher(tmp_path, apply=applied, clock=fake, interval=2.0)
    task = asyncio.create_task(watcher.run())
    try:
        await eventually(lambda: watcher.reads == 1 and fake.sleepers == 1)
        _replace(tmp_path / C.FILE_NAME, _file("1.34"))
        fake.advance(2.0)
        await eventually(lambda: watcher.reads == 2)
        assert applied.names[-1] == ["gpu-claim", "nic-claim", "tpu-claim"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_watcher_is_not_caught_up_while_a_read_waits_to_be_applied(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A look records the file's identity in its thread before the loop applies what it
    read: until then a caller on the loop (a sync point waiting for the sidecar) must not
    see "caught up" with the claims missing from the index."""
    fake = clock.FakeClock(0.0)
    applied = _Applied()
    watcher = C.CheckpointWatcher(tmp_path, apply=applied, clock=fake, interval=2.0)
    entered, release = threading.Event(), threading.Event()
    real_read = C.read

    def slow_read(path: pathlib.Path) -> Any:
        entered.set()
        release.wait(10)
        return real_read(path)

    monkeypatch.setattr(C, "read", slow_read)
    task = asyncio.create_task(watcher.run())
    try:
        await eventually(lambda: watcher.reads == 1 and fake.sleepers == 1)  # missing file
        assert watcher.caught_up
        _replace(tmp_path / C.FILE_NAME, _file("1.37"))
        assert not watcher.caught_up  # a new file
        fake.advance(2.0)
        await asyncio.to_thread(entered.wait, 10)
        assert not watcher.caught_up  # its identity is seen, its claims not yet applied
        release.set()
        await eventually(lambda: watcher.reads == 2)
        assert watcher.caught_up and applied.names[-1] == ["gpu-claim", "nic-claim", "tpu-claim"]
    finally:
        release.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_prepared_claim_key_and_devices_fit_the_index() -> None:
    (gpu, *_) = C.parse(_file("1.37"))
    index = claims.ClaimIndex()
    delta = index.add_prepared_claim(
        namespace=gpu.namespace, name=gpu.name, devices=gpu.devices, pod_uids=gpu.pod_uids
    )
    assert delta.pods == {"pod-1"}
    assert index.claim(gpu.key) is not None
    assert json.loads(_file("1.37"))["Checksum"] == zlib.crc32(
        json.loads(_file("1.37"))["Data"].encode()
    )
