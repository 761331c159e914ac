"""Smoke test of the kubelet twin on every upstream line: the kubelet's own DRA manager
(``pkg/kubelet/cm/dra``, built from the module proxy) registers our FakeDriver, prepares a
pod's claim through it, receives an Unhealthy report on its health stream and computes the
pod's ``allocatedResourcesStatus`` and its ``dra_health_state`` checkpoint.

What this pins per line: which health API version the manager watches, which DRA API it
prepares through, whether the message reaches the status and the checkpoint, and the
``claim:<name>[/<request>]`` naming. The scenario runner relies on all of it.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
from typing import Any

import pytest

from kubelet_dra._proto.pluginregistration.v1 import api_pb2 as reg_pb2
from kubelet_dra._proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from kubelet_dra.testing import FakeDriver
from tests.conformance import _twin
from tests.interop import _build
from tests.interop._driver import DriverProcess, device
from tests.interop._grpc import unix_channel

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(60, func_only=True)]

DRIVER = "gpu.example.com"
POOL = "pool-a"
DEVICE = "gpu-0"
NAMESPACE = "default"
#: The ResourceClaim object's name per way the pod names its claim (the pod's own entry is
#: always called "gpu"): made from a template, named directly, named directly by a claim
#: object that happens to be called like the pod's entry.
CLAIM_NAMES = {"template": "pod-1-gpu-x7k2p", "direct": "claim-1", "direct-same-name": "gpu"}
POD_UID = "pod-uid-1"
MESSAGE = "ECC errors: 3 uncorrectable"


#: The suite's line selection (comma list of minors, e.g. ``1.37,1.38``; empty = all).
LINES_ENV = "KUBELET_DRA_CONFORMANCE_LINES"


@pytest.fixture(scope="module", params=_twin.LINES)
def line(request: pytest.FixtureRequest) -> tuple[str, pathlib.Path]:
    """(version, binary) for each selected line; the build runs outside the test's timeout."""
    version: str = request.param
    wanted = {w.strip() for w in os.environ.get(LINES_ENV, "").split(",") if w.strip()}
    minor = ".".join(version.lstrip("v").split(".")[:2])
    if wanted and minor not in wanted:
        pytest.skip(f"kubelet {minor} not selected ({LINES_ENV})")
    return version, _twin.require_binary(version)


def _has_entries(version: str, source: str) -> bool:
    """Whether the line's UpdateAllocatedResourcesStatus finds the claim at all.

    1.34 matches the container's claim reference against the ResourceClaim *object's* name,
    so only a claim object called like the pod's entry gets a status; 1.35 looks the
    object's name up only in ``pod.status.resourceClaimStatuses`` (filled for template
    claims); 1.36 on also fall back to the pod spec, so every way works.
    """
    if version == "v1.34.4":
        return source == "direct-same-name"
    if version == "v1.35.5":
        return source == "template"
    return True


def _claim(source: str) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": CLAIM_NAMES[source],
        "namespace": NAMESPACE,
        "uid": "claim-uid-1",
    }
    if source == "template":
        # A claim generated for the pod is owned by it; the kubelet checks that.
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": "pod-1", "uid": POD_UID, "controller": True}
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": {
            "devices": {"requests": [{"name": "req-0", "exactly": {"deviceClassName": "gpu"}}]}
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "req-0", "driver": DRIVER, "pool": POOL, "device": DEVICE}
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": "pod-1", "uid": POD_UID}],
        },
    }


def _pod(source: str) -> dict[str, Any]:
    # Container "whole" names the claim; "one" names its request: the kubelet calls the
    # entries "claim:gpu" and "claim:gpu/req-0".
    pod_claim: dict[str, Any] = {"name": "gpu", "resourceClaimName": CLAIM_NAMES[source]}
    status: dict[str, Any] = {
        "containerStatuses": [{"name": "whole"}, {"name": "one"}, {"name": "none"}]
    }
    if source == "template":
        pod_claim = {"name": "gpu", "resourceClaimTemplateName": "gpu-template"}
        status["resourceClaimStatuses"] = [
            {"name": "gpu", "resourceClaimName": CLAIM_NAMES[source]}
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "pod-1", "namespace": NAMESPACE, "uid": POD_UID},
        "spec": {
            "resourceClaims": [pod_claim],
            "containers": [
                {"name": "whole", "image": "x", "resources": {"claims": [{"name": "gpu"}]}},
                {
                    "name": "one",
                    "image": "x",
                    "resources": {"claims": [{"name": "gpu", "request": "req-0"}]},
                },
                {"name": "none", "image": "x"},
            ],
        },
        "status": status,
    }


@pytest.mark.parametrize("source", list(CLAIM_NAMES))
async def test_unhealthy_report_reaches_the_pod_status(
    line: tuple[str, pathlib.Path], sockdir: pathlib.Path, source: str
) -> None:
    version, path = line
    driver = FakeDriver(
        DRIVER,
        registry=sockdir / "reg",
        plugin_dir=sockdir / "plugin",
        health_versions=("v1", "v1alpha1"),
        dra_versions=("v1", "v1beta1"),
    )
    driver.prepare_devices = [{"pool": POOL, "device": DEVICE, "requests": ["req-0"]}]
    state_dir = sockdir / "state"
    twin = _twin.Twin(version, path=path)
    call = asyncio.to_thread  # the twin's client blocks; the driver serves on this loop
    async with driver:
        with twin:
            started = await call(twin.start, state_dir)
            assert started["version"] == version
            await call(twin.claims, [_claim(source)])
            await call(twin.register, DRIVER, str(driver.dra_socket), driver.supported_versions)
            await driver.wait_for_streams(1, timeout=10.0)

            prepared = await call(twin.prepare, _pod(source))
            assert "error" not in prepared, prepared

            await driver.set_health(
                {"pool": POOL, "device": DEVICE, "health": "Unhealthy", "message": MESSAGE}
            )
            await call(twin.wait_state, DRIVER, POOL, DEVICE, health="Unhealthy")
            synced = await call(twin.sync, [_pod(source)])
            checkpoint = (await call(twin.state))["state"]
            await call(twin.stop)

    # The manager opened the newest health API it knows and prepared through DRA v1.
    newest = _twin.HEALTH_VERSIONS[version][0]
    assert driver.calls[f"NodeWatchResources/{newest}"] == 1
    assert sum(n for k, n in driver.calls.items() if k.startswith("NodeWatchResources/")) == 1
    assert driver.calls["NodePrepareResources/v1"] == 1
    assert driver.calls["NodePrepareResources/v1beta1"] == 0

    assert synced["announced"] == [POD_UID]
    assert synced["updates"] == [[POD_UID]]
    health: dict[str, Any] = {"resourceID": f"{DRIVER}/{POOL}/{DEVICE}", "health": "Unhealthy"}
    if version in _twin.MESSAGE_LINES:
        health["message"] = MESSAGE
    statuses = {
        s["name"]: sorted(s.get("allocatedResourcesStatus") or [], key=lambda r: r["name"])
        for s in synced["statuses"][POD_UID]["containerStatuses"]
    }
    if not _has_entries(version, source):
        assert statuses == {"whole": [], "one": [], "none": []}
    else:
        assert statuses == {
            "whole": [{"name": "claim:gpu", "resources": [health]}],
            "one": [{"name": "claim:gpu/req-0", "resources": [health]}],
            "none": [],
        }

    entry = checkpoint[DRIVER]["Devices"][f"{POOL}/{DEVICE}"]
    assert entry["PoolName"] == POOL
    assert entry["DeviceName"] == DEVICE
    assert entry["Health"] == "Unhealthy"
    if version in _twin.MESSAGE_LINES:
        assert entry["Message"] == MESSAGE
    else:
        assert "Message" not in entry


async def test_refused_registration_is_a_reply(
    line: tuple[str, pathlib.Path], sockdir: pathlib.Path
) -> None:
    """A driver with no DRA service the kubelet knows is refused, and the twin keeps serving.

    The manager writes no health checkpoint before the first report."""
    version, path = line
    with _twin.Twin(version, path=path) as twin:
        await asyncio.to_thread(twin.start, sockdir / "state")
        refused = await asyncio.to_thread(
            twin.register, DRIVER, str(sockdir / "dra.sock"), ["v9.DRAPlugin"], check=False
        )
        assert refused["ok"] is False
        assert "v9.DRAPlugin" in refused["error"]
        state = await asyncio.to_thread(twin.state)
        assert state == {"ok": True, "state": None, "raw": None}


async def test_health_stream_without_advertised_service(
    line: tuple[str, pathlib.Path], sockdir: pathlib.Path
) -> None:
    """Up to 1.36 the manager opens v1alpha1 for every driver; from 1.37 only if advertised."""
    version, path = line
    driver = FakeDriver(
        DRIVER,
        registry=sockdir / "reg",
        plugin_dir=sockdir / "plugin",
        health_versions=("v1alpha1",),
        supported_versions=["v1.DRAPlugin"],
    )
    call = asyncio.to_thread
    async with driver:
        with _twin.Twin(version, path=path) as twin:
            await call(twin.start, sockdir / "state")
            await call(twin.register, DRIVER, str(driver.dra_socket), ["v1.DRAPlugin"])
            if "v1" in _twin.HEALTH_VERSIONS[version]:
                # Nothing to wait for: give the manager the time it takes to open a stream
                # (about 50 ms) many times over, then check that it did not.
                await asyncio.sleep(1.0)
                assert driver.calls["NodeWatchResources/v1alpha1"] == 0
            else:
                await driver.wait_for_streams(1, timeout=10.0)
            await call(twin.stop)


@pytest.fixture(scope="module", params=["current", "v035"])
def go_driver_bin(request: pytest.FixtureRequest) -> tuple[str, pathlib.Path]:
    """The interop Go driver (kubeletplugin helper v0.37.2 or v0.35.10), built once."""
    name: str = request.param
    try:
        return name, _build.ensure(name)
    except _build.BuildUnavailable as exc:
        pytest.skip(f"interop driver {name} unavailable: {exc.reason}")
    except _build.BuildFailed as exc:
        pytest.fail(f"building the interop driver {name} failed: {exc}", pytrace=False)


def _get_info(registration_socket: pathlib.Path) -> Any:
    """GetInfo on the registration socket: the plugin watcher's first call."""
    with unix_channel(registration_socket) as channel:
        stub = reg_grpc.RegistrationStub(channel)
        return stub.GetInfo(reg_pb2.InfoRequest(), timeout=10)


def test_go_helper_driver(
    line: tuple[str, pathlib.Path],
    go_driver_bin: tuple[str, pathlib.Path],
    sockdir: pathlib.Path,
) -> None:
    """The kubelet's manager and the kubeletplugin helper, both upstream code, end to end.

    The 1.37 helper serves health v1 and v1alpha1, the 1.35 helper only v1alpha1: each
    line's manager picks the newest version both sides have.
    """
    version, path = line
    helper, driver_bin = go_driver_bin
    name = "interop.kubelet-dra.test"
    drv = DriverProcess(
        driver_bin,
        driver_name=name,
        registry_dir=sockdir / "reg",
        plugin_data_dir=sockdir / "plugin",
        control_file=sockdir / "control.json",
        log_dir=sockdir,
    )
    claim, pod = _claim("template"), _pod("template")
    claim["status"]["allocation"]["devices"]["results"][0]["driver"] = name
    prepared = {"requests": ["req-0"], "pool": POOL, "device": DEVICE, "cdi_device_ids": []}
    drv.start({"devices": [], "prepare_devices": [prepared]})
    try:
        info = _get_info(drv.registration_socket)
        assert info.name == name
        with _twin.Twin(version, path=path) as twin:
            twin.start(sockdir / "state")
            twin.claims([claim])
            twin.register(info.name, info.endpoint, list(info.supported_versions))
            opened = drv.wait_for("stream_open", timeout=10.0)[0]["method"]
            assert "error" not in twin.prepare(pod)
            drv.control(
                {
                    "devices": [device(DEVICE, "UNHEALTHY", pool=POOL, message=MESSAGE)],
                    "prepare_devices": [prepared],
                }
            )
            twin.wait_state(name, POOL, DEVICE, health="Unhealthy")
            synced = twin.sync([pod])
            twin.stop()
    finally:
        drv.stop()

    served = ("v1", "v1alpha1") if helper == "current" else ("v1alpha1",)
    chosen = next(v for v in _twin.HEALTH_VERSIONS[version] if v in served)
    assert opened == f"/{chosen}.DRAResourceHealth/NodeWatchResources"
    assert synced["announced"] == [POD_UID]
    statuses = {
        s["name"]: s.get("allocatedResourcesStatus") or []
        for s in synced["statuses"][POD_UID]["containerStatuses"]
    }
    health: dict[str, Any] = {"resourceID": f"{name}/{POOL}/{DEVICE}", "health": "Unhealthy"}
    # The message travels on v1, and on v1alpha1 from 1.36 on (both helpers send it there
    # only if their v1alpha1 has the field: the 1.35 helper's has not).
    if version in _twin.MESSAGE_LINES and (chosen == "v1" or helper == "current"):
        health["message"] = MESSAGE
    expected_whole = [{"name": "claim:gpu", "resources": [health]}]
    if version == "v1.34.4":  # matches the claim object's name only (see _has_entries)
        expected_whole = []
    assert statuses["whole"] == expected_whole


@pytest.mark.parametrize("content", ["null", '{"gpu.example.com": {"Devices": null}}'])
async def test_null_maps_in_the_checkpoint(
    line: tuple[str, pathlib.Path], sockdir: pathlib.Path, content: str
) -> None:
    """Up to 1.37 a checkpoint with a null map loads, and the first report then panics the
    manager (the kubelet process ends); 1.38 loads null maps as empty ones."""
    version, path = line
    state_dir = sockdir / "state"
    state_dir.mkdir()
    (state_dir / "dra_health_state").write_text(content)
    driver = FakeDriver(
        DRIVER,
        registry=sockdir / "reg",
        plugin_dir=sockdir / "plugin",
        health_versions=("v1", "v1alpha1"),
    )
    twin = _twin.Twin(version, path=path)
    call = asyncio.to_thread
    async with driver:
        with twin:
            await call(twin.start, state_dir)
            await call(twin.register, DRIVER, str(driver.dra_socket), driver.supported_versions)
            await driver.wait_for_streams(1, timeout=10.0)
            await driver.set_health({"pool": POOL, "device": DEVICE, "health": "Unhealthy"})
            if version == "v1.38.0-beta.0":
                await call(twin.wait_state, DRIVER, POOL, DEVICE, health="Unhealthy")
                await call(twin.stop)
                return
            with pytest.raises(_twin.TwinError, match="assignment to entry in nil map"):
                await call(twin.wait_state, DRIVER, POOL, DEVICE, health="Unhealthy")
            assert twin.returncode == 2
