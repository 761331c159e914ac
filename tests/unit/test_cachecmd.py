"""``cache show``: our store and a real kubelet's dra_health_state, offline."""

from __future__ import annotations

import json
import pathlib
import time

import pytest

from kubelet_dra import cli, models
from kubelet_dra.state import healthinfo, store


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["cache", "show", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_shows_our_store_as_json(tmp_path: pathlib.Path, capsys) -> None:
    db = store.HealthStore.open(tmp_path)
    cache = healthinfo.HealthCache(sink=db)
    now = time.time()
    reports = [
        models.DeviceReport("pool", "fresh", models.HealthStatus.UNHEALTHY, "ECC", 600),
        models.DeviceReport("pool", "stale", models.HealthStatus.HEALTHY, "", 1),
    ]
    cache.update("gpu.example.com", reports, now=now - 10, endpoint="/x/dra.sock")
    db.close()
    code, out, _ = run(capsys, "--state-dir", str(tmp_path), "--output", "json")
    assert code == 0
    rows = {row["device"]: row for row in json.loads(out)}
    assert rows["fresh"]["visible"] == "Unhealthy"
    assert rows["fresh"]["message"] == "ECC"
    assert rows["stale"]["stored"] == "Healthy"
    assert rows["stale"]["visible"] == "Unknown"  # its 1 s lease ran out 9 s ago


def test_table_output_lists_each_device(tmp_path: pathlib.Path, capsys) -> None:
    db = store.HealthStore.open(tmp_path)
    healthinfo.HealthCache(sink=db).update(
        "drv", [models.DeviceReport("p", "d0", models.HealthStatus.HEALTHY)], now=time.time()
    )
    db.close()
    code, out, _ = run(capsys, "--state-dir", str(tmp_path))
    assert code == 0
    header, row, footer = out.splitlines()
    assert header.split()[:5] == ["DRIVER", "POOL", "DEVICE", "STORED", "VISIBLE"]
    assert row.split()[:5] == ["drv", "p", "d0", "Healthy", "Healthy"]
    assert footer == "1 devices"


def test_missing_state_dir_is_a_clear_error(tmp_path: pathlib.Path, capsys) -> None:
    code, _, err = run(capsys, "--state-dir", str(tmp_path / "nope"))
    assert code == 1
    assert "no health cache" in err


KUBELET_STATE = {
    "gpu.example.com": {
        "Devices": {
            "pool-a/gpu-0": {
                "PoolName": "pool-a",
                "DeviceName": "gpu-0",
                "Health": "Unhealthy",
                "LastUpdated": "REPLACED",
                "HealthCheckTimeout": 600_000_000_000,
                "Message": "critical XID 79",
            },
            "pool-a/gpu-1": {
                "PoolName": "pool-a",
                "DeviceName": "gpu-1",
                "Health": "Healthy",
                "LastUpdated": "2025-07-25T10:11:12.123456789Z",
            },
            "pool-a/gpu-2": {
                "PoolName": "pool-a",
                "DeviceName": "gpu-2",
                "Health": "Bogus",
                "LastUpdated": "not a time",
            },
        }
    }
}


def test_reads_a_kubelet_dra_health_state_file(tmp_path: pathlib.Path, capsys) -> None:
    state = json.loads(json.dumps(KUBELET_STATE))
    recent = time.strftime("%Y-%m-%dT%H:%M:%S.000000001+00:00", time.gmtime(time.time() - 5))
    state["gpu.example.com"]["Devices"]["pool-a/gpu-0"]["LastUpdated"] = recent
    path = tmp_path / "dra_health_state"
    path.write_text(json.dumps(state))
    code, out, _ = run(capsys, "--kubelet-state", str(path), "--output", "json")
    assert code == 0
    rows = {row["device"]: row for row in json.loads(out)}
    assert rows["gpu-0"] == rows["gpu-0"] | {
        "visible": "Unhealthy",
        "lease": "600s",
        "message": "critical XID 79",
    }
    assert rows["gpu-1"]["stored"] == "Healthy"
    assert rows["gpu-1"]["visible"] == "Unknown"  # 1.34 file: default 30 s lease, long gone
    assert rows["gpu-2"]["stored"] == "Unknown"


@pytest.mark.parametrize("content", ["not json", "[1, 2]"], ids=["garbage", "not-an-object"])
def test_unreadable_kubelet_state_is_a_clear_error(
    tmp_path: pathlib.Path, capsys, content: str
) -> None:
    path = tmp_path / "dra_health_state"
    path.write_text(content)
    code, _, err = run(capsys, "--kubelet-state", str(path))
    assert code == 1
    assert "error:" in err


# Null maps: kubelet v1.38 loadFromCheckpoint reads them as empty maps.
@pytest.mark.parametrize(
    ("content", "devices"),
    [
        ("null", []),
        ("{}", []),
        ('{"gpu.example.com": null}', []),
        ('{"gpu.example.com": {"Devices": null}}', []),
        ('{"gpu.example.com": {}}', []),
        ('{"a": {"Devices": null}, "b": {"Devices": {"p/d": null}}}', [("b", "p", "d", "Unknown")]),
        (
            '{"a": {"Devices": null}, "b": {"Devices": {"p/q/d": {"PoolName": "p/q",'
            ' "DeviceName": "d", "Health": "Healthy", "LastUpdated": "2025-01-01T00:00:00Z"}}}}',
            [("b", "p/q", "d", "Healthy")],
        ),
    ],
    ids=[
        "null-file",
        "empty",
        "null-driver",
        "null-devices",
        "no-devices-key",
        "null-device-entry",
        "null-beside-real",
    ],
)
def test_null_maps_in_a_kubelet_state_read_as_empty(
    tmp_path: pathlib.Path, capsys, content: str, devices: list[tuple[str, str, str, str]]
) -> None:
    path = tmp_path / "dra_health_state"
    path.write_text(content)
    code, out, err = run(capsys, "--kubelet-state", str(path), "--output", "json")
    assert (code, err) == (0, "")
    rows = [(r["driver"], r["pool"], r["device"], r["stored"]) for r in json.loads(out)]
    assert rows == devices
    assert all(r["visible"] == "Unknown" for r in json.loads(out))  # all long expired


def test_devices_that_are_not_an_object_is_a_clear_error(tmp_path: pathlib.Path, capsys) -> None:
    path = tmp_path / "dra_health_state"
    path.write_text('{"drv": {"Devices": [1]}}')
    code, _, err = run(capsys, "--kubelet-state", str(path))
    assert code == 1
    assert "Devices is not an object" in err


# -- the kubelet's resourceIDs beside each device (issue 19) ---------------------------


def _store_with(tmp_path: pathlib.Path, driver: str, *devices: str) -> pathlib.Path:
    state = tmp_path / "state"
    db = store.HealthStore.open(state)
    reports = [models.DeviceReport("node-a", d, models.HealthStatus.HEALTHY) for d in devices]
    healthinfo.HealthCache(sink=db).update(driver, reports, now=time.time())
    db.close()
    return state


def test_the_kubelets_resource_id_is_shown_where_it_differs(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kubelet_dra.state import kubeletcheckpoint
    from tests.unit import _kubelet_checkpoint_files as files

    state = _store_with(tmp_path, files.TPU, "chip-0", "chip-9")
    root = tmp_path / "kubelet"
    root.mkdir()
    (root / kubeletcheckpoint.FILE_NAME).write_bytes(files.file_of("1.37"))
    code, out, _ = run(
        capsys, "--state-dir", str(state), "--kubelet-root-dir", str(root), "--output", "json"
    )
    assert code == 0
    rows = {row["device"]: row for row in json.loads(out)}
    assert rows["chip-0"]["name"] == (
        "tpu.google.com/node-a/chip-0 (as google.com/tpu=common, ours google.com/tpu=0)"
    )
    assert rows["chip-0"]["kubeletResourceID"] == "google.com/tpu=common"
    assert rows["chip-0"]["resourceID"] == "google.com/tpu=0"
    assert rows["chip-9"]["name"] == "tpu.google.com/node-a/chip-9"  # in no claim
    code, out, _ = run(capsys, "--state-dir", str(state), "--kubelet-root-dir", str(root))
    header, chip0, chip9, _footer = out.splitlines()
    assert "RESOURCEID" in header.split()
    assert "as google.com/tpu=common, ours google.com/tpu=0" in chip0
    assert "as " not in chip9


def test_an_unusable_kubelet_checkpoint_is_a_warning(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kubelet_dra.state import kubeletcheckpoint

    state = _store_with(tmp_path, "drv", "d0")
    (tmp_path / kubeletcheckpoint.FILE_NAME).write_text('{"Data": "{}", "Checksum": 1}')
    code, out, err = run(capsys, "--state-dir", str(state), "--kubelet-root-dir", str(tmp_path))
    assert code == 0
    assert "warning: kubelet checkpoint not used: checksum" in err
    assert out.splitlines()[-1] == "1 devices"
