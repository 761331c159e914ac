"""The taint bridge over HTTP: ``FakeApiServer`` through the official client, and the sidecar.

In-process tests run :class:`loop.TaintBridge` on the real clock with zero thresholds
(no waiting) against the stand-in, which serves DeviceTaintRules in resource.k8s.io v1,
v1beta2 and v1alpha3 with label selectors, validation and injected faults (403, 503, lost
connections). The last tests run ``kubelet-dra-health run --taint-effect ...`` as a process
with a fake driver: health in, a rule out, metrics, ``/readyz`` and the Node's events.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
from collections.abc import AsyncIterator

import pytest

from kubelet_dra import clock, models, settings
from kubelet_dra.status.podjson import MutableObj as Obj
from kubelet_dra.taints import loop, planner
from kubelet_dra.testing import FakeApiServer, FakeDriver, eventually
from tests.unit import _rbac

from ._sidecar_process import DRIVER, NODE, SidecarProcess, cluster, device, http_get

H = models.HealthStatus
A = models.DeviceKey(DRIVER, "pool", "gpu-0")
B = models.DeviceKey(DRIVER, "pool", "gpu-1")
OURS = planner.node_selector(NODE)
WAIT = 30.0  # generous: the suite runs on loaded machines; nothing here waits that long


class Health:
    def __init__(self) -> None:
        self.health: dict[models.DeviceKey, H] = {}

    def get(self, key: models.DeviceKey, now: float) -> models.DeviceHealth:
        return models.DeviceHealth(self.health.get(key, H.UNKNOWN), "XID 79", 30.0, now)


class ParkedClock(clock.SystemClock):
    """The real clock, counting the tasks parked in its ``sleep`` and for how long."""

    def __init__(self) -> None:
        self.parked: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.parked.append(seconds)
        try:
            await super().sleep(seconds)
        finally:
            self.parked.remove(seconds)


class Running:
    """A bridge task against ``api`` and the dict of healths it reads."""

    def __init__(self, bridge: loop.TaintBridge, health: Health, clock: ParkedClock) -> None:
        self.bridge, self.health, self.clock = bridge, health, clock

    async def parked_off(self) -> None:
        """Until the bridge, turned off, sleeps its resync interval: all it does then."""
        resync = settings.Settings(node_name=NODE).taint_resync_interval
        await eventually(
            lambda: self.bridge.state == "off" and resync in self.clock.parked,
            what="the bridge parked in its off state",
            timeout=WAIT,
        )

    async def rounds_after(self, count: int) -> None:
        """Until ``count`` more reconcile rounds are done."""
        start = self.bridge.rounds
        await eventually(lambda: self.bridge.rounds >= start + count, timeout=WAIT)

    def set(self, key: models.DeviceKey, health: H) -> None:
        self.health.health[key] = health
        self.bridge.observe([key])


@pytest.fixture
async def bridge(api: FakeApiServer, tmp_path: pathlib.Path) -> AsyncIterator[Running]:
    health = Health()
    parked = ParkedClock()
    client = api.api_client()
    made = loop.TaintBridge(
        client=client,
        node=NODE,
        settings=settings.Settings(
            node_name=NODE,
            state_dir=tmp_path,
            taint_effect=settings.TaintEffect.NO_EXECUTE,
            taint_after=0,
            untaint_after=0,
            write_window=0.01,
            event_interval=0,
        ),
        clock=parked,
        health=health.get,
        devices=lambda: list(health.health),
    )
    task = asyncio.create_task(made.run())
    yield Running(made, health, parked)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    client.close()


def rules(api: FakeApiServer, selector: str = OURS) -> dict[str, Obj]:
    return {r["metadata"]["name"]: r for r in api.device_taint_rules(selector)}


def assert_rbac_allows_every_request(api: FakeApiServer) -> None:
    role = _rbac.cluster_role_rules()
    made = {(r.method, r.path + ("?watch=true" if r.is_watch else "")) for r in api.requests}
    denied = sorted(m for m in made if not _rbac.request_allowed(role, *m))
    assert not denied, f"requests the ClusterRole does not allow: {denied}"


async def test_rule_created_and_deleted_through_the_client(
    api: FakeApiServer, bridge: Running
) -> None:
    await eventually(lambda: bridge.bridge.state == "active", timeout=WAIT)
    bridge.set(A, H.UNHEALTHY)
    bridge.set(B, H.HEALTHY)
    await eventually(lambda: len(rules(api)) == 1, timeout=WAIT)
    (rule,) = rules(api).values()
    assert rule["apiVersion"] == "resource.k8s.io/v1"
    assert rule["metadata"]["name"] == "node-1.gpu.example.com.pool.gpu-0"
    assert rule["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": "pool", "device": "gpu-0"}
    taint = rule["spec"]["taint"]
    assert (taint["key"], taint["value"], taint["effect"]) == (
        "kubelet-dra.io/unhealthy",
        "Unhealthy",
        "NoExecute",
    )
    assert planner.parse_rfc3339(taint["timeAdded"]) is not None
    assert rule["metadata"]["annotations"]["kubelet-dra.io/message"] == "XID 79"
    await eventually(
        lambda: any(e["reason"] == "DeviceTainted" for e in api.events("default")), timeout=WAIT
    )
    bridge.set(A, H.HEALTHY)
    await eventually(lambda: rules(api) == {}, timeout=WAIT)
    await eventually(
        lambda: any(e["reason"] == "DeviceUntainted" for e in api.events("default")), timeout=WAIT
    )
    tainted = [e for e in api.events("default") if e["reason"] == "DeviceTainted"]
    assert tainted[0]["involvedObject"]["kind"] == "Node"
    assert tainted[0]["involvedObject"]["name"] == NODE
    assert "gpu.example.com/pool/gpu-0" in tainted[0]["message"]
    # One list at start, one create, one delete: nothing else was needed.
    assert api.count("POST", "devicetaintrules") == 1
    assert api.count("DELETE", "devicetaintrules") == 1
    assert api.count("PUT", "devicetaintrules") == 0
    assert_rbac_allows_every_request(api)
    writes = bridge.bridge.writes
    assert writes[("create", "ok")] == writes[("delete", "ok")] == 1


async def test_older_api_version_is_discovered(api: FakeApiServer, bridge: Running) -> None:
    api.device_taint_versions = ("v1alpha3",)
    await eventually(lambda: bridge.bridge.state == "active", timeout=WAIT)
    assert bridge.bridge.version == "v1alpha3"
    bridge.set(A, H.UNHEALTHY)
    await eventually(lambda: len(rules(api)) == 1, timeout=WAIT)
    assert api.count("POST", "/apis/resource.k8s.io/v1alpha3/devicetaintrules$") == 1
    assert api.count(None, "/apis/resource.k8s.io/v1/devicetaintrules") == 0


async def test_no_version_served_turns_off(api: FakeApiServer, bridge: Running) -> None:
    api.device_taint_versions = ()
    await eventually(lambda: bridge.bridge.state == "off", timeout=WAIT)
    assert "serves no devicetaintrules" in bridge.bridge.readiness()
    bridge.set(A, H.UNHEALTHY)
    await bridge.parked_off()
    assert api.count(None, "devicetaintrules") == 0


async def test_forbidden_turns_off_with_the_reason(api: FakeApiServer, bridge: Running) -> None:
    api.fail("POST", "devicetaintrules", code=403, times=None)
    await eventually(lambda: bridge.bridge.state == "active", timeout=WAIT)
    bridge.set(A, H.UNHEALTHY)
    await eventually(lambda: bridge.bridge.state == "off", timeout=WAIT)
    assert "HTTP 403" in bridge.bridge.readiness()
    assert "deploy/clusterrole.yaml" in bridge.bridge.readiness()
    posts = api.count("POST", "devicetaintrules")
    bridge.set(B, H.UNHEALTHY)
    await bridge.parked_off()
    assert api.count("POST", "devicetaintrules") == posts == 1
    assert bridge.bridge.writes[("create", "failed")] == 1


async def test_outage_creates_the_rule_once(api: FakeApiServer, bridge: Running) -> None:
    await eventually(lambda: bridge.bridge.state == "active", timeout=WAIT)
    api.fail(None, "devicetaintrules", code=503, times=2)
    api.drop_connection("POST", "devicetaintrules", times=1)
    bridge.set(A, H.UNHEALTHY)
    await eventually(lambda: len(rules(api)) == 1, timeout=WAIT)
    for _ in range(2):  # two more rounds, each of which would repeat a wrong create
        bridge.set(A, H.UNHEALTHY)
        await bridge.rounds_after(1)
    assert len(rules(api)) == 1
    assert api.count("POST", "devicetaintrules", code=201) == 1


async def test_others_rules_are_never_touched(api: FakeApiServer, bridge: Running) -> None:
    def rule(name: str, labels: dict[str, str]) -> Obj:
        return {
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "deviceSelector": {"driver": DRIVER, "pool": "pool", "device": "gpu-0"},
                "taint": {"key": "example.com/maintenance", "effect": "NoSchedule"},
            },
        }

    other = {planner.MANAGED_BY_LABEL: planner.MANAGED_BY, planner.NODE_LABEL: "node-2"}
    api.create_device_taint_rule(rule("node-2-rule", other))
    api.create_device_taint_rule(rule("admin-rule", {}))
    # Someone else holds the name our rule would get.
    api.create_device_taint_rule(rule(planner.rule_name(NODE, A), {"team": "x"}))
    before = {r["metadata"]["name"]: r for r in api.device_taint_rules()}
    await eventually(lambda: bridge.bridge.state == "active", timeout=WAIT)
    bridge.set(A, H.UNHEALTHY)
    await eventually(lambda: len(rules(api)) == 1, timeout=WAIT)
    assert list(rules(api)) == [planner.rule_name(NODE, A, hashed=True)]
    bridge.set(A, H.HEALTHY)
    await eventually(lambda: rules(api) == {}, timeout=WAIT)
    after = {r["metadata"]["name"]: r for r in api.device_taint_rules()}
    assert after == before
    for record in api.requests:
        if record.method in ("PUT", "DELETE") and "devicetaintrules" in record.path:
            assert record.path.endswith(planner.rule_name(NODE, A, hashed=True))


# -- the sidecar process --------------------------------------------------------------------------


async def test_sidecar_taints_and_untaints(sockdir: pathlib.Path, api: FakeApiServer) -> None:
    cluster(api)
    flags = ["--taint-effect", "NoSchedule", "--taint-after", "0", "--untaint-after", "0"]
    async with (
        FakeDriver(DRIVER, registry=sockdir / "reg") as driver,
        SidecarProcess(sockdir, api, flags=flags, metrics=True) as sidecar,
    ):
        await driver.set_health(device("gpu-0", "Unhealthy", message="XID 79"), device("gpu-1"))
        await sidecar.until(lambda: len(rules(api)) == 1, timeout=WAIT)
        (rule,) = rules(api).values()
        assert rule["spec"]["taint"]["effect"] == "NoSchedule"
        assert rule["spec"]["deviceSelector"]["device"] == "gpu-0"
        url = await sidecar.metrics_url()

        async def scraped() -> str:
            # The rule is in the API once the create is processed; the bridge counts
            # it once it has the answer, a moment later.
            code, text = await http_get(f"{url}/metrics")
            assert code == 200
            assert 'kubelet_dra_taint_rules{effect="NoSchedule"} 1.0' in text
            return text

        text = await eventually(scraped, what="the rule counted in /metrics", timeout=WAIT)
        assert 'kubelet_dra_taint_bridge{state="active"} 1.0' in text
        assert 'kubelet_dra_taint_rule_writes_total{op="create",result="ok"} 1.0' in text
        code, body = await http_get(f"{url}/readyz")
        assert json.loads(body)["checks"]["taints"] == "ok"
        await driver.set_health(device("gpu-0"), device("gpu-1"))
        await sidecar.until(lambda: rules(api) == {}, timeout=WAIT)
        code, _ = await sidecar.stop()
    assert code == 0, sidecar.log
    assert "taint bridge on: resource.k8s.io/v1, effect NoSchedule" in sidecar.log
    assert_rbac_allows_every_request(api)


async def test_sidecar_forbidden_stays_up_and_says_why(
    sockdir: pathlib.Path, api: FakeApiServer
) -> None:
    cluster(api)
    api.fail(None, "devicetaintrules", code=403, times=None)
    flags = ["--taint-effect", "NoExecute", "--taint-after", "0"]
    async with (
        FakeDriver(DRIVER, registry=sockdir / "reg") as driver,
        SidecarProcess(sockdir, api, flags=flags, metrics=True) as sidecar,
    ):
        await driver.set_health(device("gpu-0", "Unhealthy"), device("gpu-1"))
        url = await sidecar.metrics_url()

        async def readyz() -> Obj:
            return dict(json.loads((await http_get(f"{url}/readyz"))[1]))

        for _ in range(200):
            if (await readyz())["checks"].get("taints", "").startswith("off"):
                break
            await asyncio.sleep(0.05)
        answer = await readyz()
        assert answer["ready"] is False
        assert "RBAC or admission" in answer["checks"]["taints"]
        # The pipeline goes on: pod status is still written.
        await sidecar.until(
            lambda: (
                api.get_pod("default", "train-a")["status"].get("conditions", [{}])[-1].get("type")
                == "DeviceHealthy"
            ),
            timeout=WAIT,
        )
        _, text = await http_get(f"{url}/metrics")
        assert 'kubelet_dra_taint_bridge{state="off"} 1.0' in text
    assert len([line for line in sidecar.stderr if "taint bridge off" in line]) == 1
