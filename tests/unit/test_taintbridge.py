"""The taint bridge's reconciler (``taintbridge``) on a fake clock against an in-memory API.

The API here is a dict of rules with the behaviour the reconciler relies on (409 on an
existing name, resourceVersion preconditions, label selection) and a switch to fail calls;
``tests/integration/test_taint_bridge.py`` runs the same bridge over HTTP against
``FakeApiServer`` through the official client.
"""

from __future__ import annotations

import asyncio
import builtins
import copy
import functools
import pathlib
import typing
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kubelet_dra import clock, kube, models, settings
from kubelet_dra.status.podjson import MutableObj as Obj
from kubelet_dra.taints import loop, planner
from kubelet_dra.testing import eventually

H = models.HealthStatus
NODE = "node-a"
DRIVER = "gpu.example.com"
A = models.DeviceKey(DRIVER, NODE, "gpu-a")
B = models.DeviceKey(DRIVER, NODE, "gpu-b")


class MemoryApi:
    """DeviceTaintRules in a dict; ``fail`` makes the next calls raise."""

    def __init__(self) -> None:
        self.rules: dict[str, Obj] = {}
        self.rv = 100
        self.log: list[tuple[str, str]] = []
        self.failures: list[kube.CallError] = []
        self.served: str | None = "v1"
        self.events: list[Obj] = []

    def fail(self, status: int | None, times: int = 1) -> None:
        self.failures += [kube.CallError(f"injected {status}", status=status)] * times

    def _maybe_fail(self, what: str, name: str = "") -> None:
        self.log.append((what, name))
        if self.failures:
            raise self.failures.pop(0)

    # the TaintApi surface

    def discover(self, client: object) -> str | None:
        self._maybe_fail("discover")
        return self.served

    def factory(self, client: object, version: str) -> MemoryApi:
        return self

    def list(self, label_selector: str) -> list[Obj]:
        self._maybe_fail("list")
        terms = dict(t.split("=", 1) for t in label_selector.split(","))
        return [
            copy.deepcopy(r)
            for r in self.rules.values()
            if all((r["metadata"].get("labels") or {}).get(k) == v for k, v in terms.items())
        ]

    def create(self, body: Obj) -> Obj:
        name = body["metadata"]["name"]
        self._maybe_fail("create", name)
        if name in self.rules:
            raise kube.CallError("exists", status=409)
        return self.put(body)

    def replace(self, body: Obj) -> Obj:
        name = body["metadata"]["name"]
        self._maybe_fail("update", name)
        if self.rules[name]["metadata"]["resourceVersion"] != body["metadata"]["resourceVersion"]:
            raise kube.CallError("conflict", status=409)
        return self.put(body)

    def delete(self, name: str, uid: str, resource_version: str) -> None:
        self._maybe_fail("delete", name)
        if name not in self.rules:
            raise kube.CallError("gone", status=404)
        del self.rules[name]

    def create_event(self, namespace: str, body: Obj) -> Obj:
        self.events.append(body)
        return body

    def patch_event(self, namespace: str, name: str, body: Obj) -> Obj:
        self.events.append(body)
        return body

    # test helpers

    def put(self, body: Obj) -> Obj:
        self.rv += 1
        obj = copy.deepcopy(body)
        obj["metadata"].update(uid=f"uid-{self.rv}", resourceVersion=str(self.rv))
        self.rules[obj["metadata"]["name"]] = obj
        return copy.deepcopy(obj)

    def writes(self) -> builtins.list[tuple[str, str]]:  # ``list`` is the method above
        return [(op, name) for op, name in self.log if op in ("create", "update", "delete")]


class Health:
    """The health cache's ``get`` for the bridge: a dict the test changes."""

    def __init__(self) -> None:
        self.health: dict[models.DeviceKey, H] = {}

    def get(self, key: models.DeviceKey, now: float) -> models.DeviceHealth:
        return models.DeviceHealth(self.health.get(key, H.UNKNOWN), "broken", 30.0, now)


class Rig:
    """One bridge on the fake clock, restartable with the same state dir and API."""

    def __init__(self, state_dir: pathlib.Path, fake: clock.FakeClock, **overrides: Any) -> None:
        self.state_dir, self.clock, self.api, self.health = state_dir, fake, MemoryApi(), Health()
        self.overrides = overrides
        self.bridge: loop.TaintBridge | None = None
        self.task: asyncio.Task[None] | None = None
        self.resource_ids: Any = None  # the index's (kubelet's, our) resourceID lookup

    async def start(self, *, settle: bool = True, **overrides: Any) -> loop.TaintBridge:
        values: dict[str, Any] = {
            "node_name": NODE,
            "state_dir": self.state_dir,
            "taint_effect": "NoSchedule",
            "taint_after": 10,
            "untaint_after": 60,
            "write_window": 0,
        }
        values.update(self.overrides)
        values.update(overrides)
        self.bridge = loop.TaintBridge(
            client=typing.cast("kube.ApiClient", None),  # the fake factory ignores it
            node=NODE,
            settings=settings.Settings(**values),
            clock=self.clock,
            health=self.health.get,
            devices=lambda: list(self.health.health),
            resource_ids=self.resource_ids,
            api_factory=self.api.factory,  # type: ignore[arg-type]  # duck-typed TaintApi
            discover=self.api.discover,
        )
        self.task = asyncio.create_task(self.bridge.run())
        if settle:
            await self.idle()
        return self.bridge

    async def stop(self) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)

    async def idle(self, after: int | None = None) -> None:
        """Until the bridge finished a round (after ``after`` rounds) and sleeps."""
        bridge = self.bridge
        assert bridge is not None
        target = bridge.rounds if after is None else after
        await wait(lambda: bridge.rounds > target or bridge.state == "off")
        await self.clock.wait_for_sleepers(1)

    async def set(self, key: models.DeviceKey, health: H) -> None:
        assert self.bridge is not None
        rounds = self.bridge.rounds
        self.health.health[key] = health
        self.bridge.observe([key])
        await self.idle(rounds)

    async def advance(self, seconds: float) -> None:
        """Move time in one-second steps, letting the bridge run at each."""
        assert self.bridge is not None
        for _ in range(int(seconds)):
            self.clock.advance(1)
            for _ in range(20):
                await asyncio.sleep(0)
            await self.clock.wait_for_sleepers(1)


# The bridge's tasks run on this loop: poll often, they settle in a few iterations.
wait = functools.partial(eventually, interval=0.002)


@pytest.fixture
async def rig(tmp_path: pathlib.Path) -> AsyncIterator[Rig]:
    made = Rig(tmp_path, clock.FakeClock())
    yield made
    if made.task is not None:
        await made.stop()


def rule_of(api: MemoryApi, key: models.DeviceKey) -> Obj | None:
    found = [r for r in api.rules.values() if planner.device_of(r) == key]
    assert len(found) <= 1
    return found[0] if found else None


# -- thresholds over time ---------------------------------------------------------------------


async def test_taint_after_then_untaint_after(rig: Rig) -> None:
    bridge = await rig.start()
    await rig.set(A, H.UNHEALTHY)
    await rig.set(B, H.HEALTHY)
    await rig.advance(9)
    assert rig.api.rules == {}
    await rig.advance(1)
    rule = rule_of(rig.api, A)
    assert rule is not None
    assert rule["metadata"]["name"] == planner.rule_name(NODE, A)
    assert rule["spec"]["taint"] == {
        "key": "kubelet-dra.io/unhealthy",
        "value": "Unhealthy",
        "effect": "NoSchedule",
        "timeAdded": planner.rfc3339(rig.clock.now()),
    }
    assert rule["metadata"]["annotations"]["kubelet-dra.io/message"] == "broken"
    assert bridge.rules_by_effect()["NoSchedule"] == 1
    await rig.set(A, H.HEALTHY)
    await rig.advance(59)
    assert rule_of(rig.api, A) is not None
    await rig.advance(1)
    assert rig.api.rules == {}
    name = rule["metadata"]["name"]
    assert rig.api.writes() == [("create", name), ("delete", name)]
    reasons = [e["reason"] for e in rig.api.events]
    assert reasons == ["DeviceTainted", "DeviceUntainted"]
    assert bridge.writes[("create", "ok")] == 1
    assert bridge.readiness() == "ok"


async def test_rules_and_events_give_the_kubelets_resource_id_beside_the_device(
    rig: Rig,
) -> None:
    ids = {A: ("vendor.com/gpu=a", "vendor.com/gpu=a")}
    rig.resource_ids = lambda key: ids.get(key, (str(key), str(key)))
    await rig.start(taint_after=0, untaint_after=0)
    await rig.set(A, H.UNHEALTHY)
    await wait(lambda: rig.api.events)
    assert rig.api.events[0]["message"].startswith(
        f"Device {A} (as vendor.com/gpu=a) is Unhealthy: "
    )
    await rig.set(B, H.UNHEALTHY)
    rule_a, rule_b = rule_of(rig.api, A), rule_of(rig.api, B)
    assert rule_a is not None and rule_b is not None
    assert rule_a["metadata"]["annotations"][planner.DEVICE_ANNOTATION] == str(A)
    assert rule_a["metadata"]["annotations"][planner.RESOURCE_ID_ANNOTATION] == "vendor.com/gpu=a"
    assert planner.RESOURCE_ID_ANNOTATION not in rule_b["metadata"]["annotations"]


async def test_thresholds_zero(rig: Rig) -> None:
    await rig.start(taint_after=0, untaint_after=0, taint_unknown_after=0)
    await rig.set(A, H.UNKNOWN)
    assert (rule_of(rig.api, A) or {})["spec"]["taint"]["value"] == "Unknown"
    await rig.set(A, H.UNHEALTHY)
    assert (rule_of(rig.api, A) or {})["spec"]["taint"]["value"] == "Unhealthy"
    await rig.set(A, H.HEALTHY)
    assert rig.api.rules == {}
    assert [op for op, _ in rig.api.writes()] == ["create", "update", "delete"]


async def test_flapping_causes_no_writes(rig: Rig) -> None:
    await rig.start()
    for _ in range(30):  # Unhealthy 5 s, Healthy 5 s: never 10 s in a row
        await rig.set(A, H.UNHEALTHY)
        await rig.advance(5)
        await rig.set(A, H.HEALTHY)
        await rig.advance(5)
    assert rig.api.writes() == []
    await rig.set(A, H.UNHEALTHY)
    await rig.advance(10)
    for _ in range(30):  # tainted; Healthy 30 s at a time never reaches 60 s
        await rig.set(A, H.HEALTHY)
        await rig.advance(30)
        await rig.set(A, H.UNHEALTHY)
        await rig.advance(1)
    assert [op for op, _ in rig.api.writes()] == ["create"]


# -- restarts ---------------------------------------------------------------------------------


async def test_restart_keeps_the_since_time(rig: Rig) -> None:
    await rig.start()
    await rig.set(A, H.UNHEALTHY)
    await rig.advance(6)
    await rig.stop()
    rig.clock.advance(2)
    await rig.start()  # still Unhealthy: 8 s of the 10 have passed
    await rig.advance(1)
    assert rig.api.rules == {}
    await rig.advance(1)
    assert rule_of(rig.api, A) is not None


async def test_restart_keeps_a_rule_that_should_stay(rig: Rig) -> None:
    await rig.start()
    await rig.set(A, H.UNHEALTHY)
    await rig.advance(10)
    await rig.set(A, H.HEALTHY)
    await rig.advance(30)
    await rig.stop()
    # Healthy for 30 of the 60 s: the restarted bridge must not remove the rule now...
    await rig.start()
    assert rule_of(rig.api, A) is not None
    await rig.advance(29)
    assert rule_of(rig.api, A) is not None
    await rig.advance(1)  # ...but 60 s after the device turned Healthy
    assert rig.api.rules == {}
    assert [op for op, _ in rig.api.writes()] == ["create", "delete"]


async def test_lost_state_file_adopts_the_api_rules(rig: Rig) -> None:
    await rig.start()
    await rig.set(A, H.UNHEALTHY)
    await rig.advance(10)
    await rig.stop()
    (rig.state_dir / "taints.json").unlink()
    rig.health.health[A] = H.HEALTHY
    await rig.start()
    assert rule_of(rig.api, A) is not None  # adopted, not deleted at once
    await rig.advance(60)
    assert rig.api.rules == {}


# -- other owners -----------------------------------------------------------------------------


def foreign(name: str, labels: dict[str, str]) -> Obj:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "deviceSelector": {"driver": DRIVER, "pool": NODE, "device": "gpu-a"},
            "taint": {"key": "admin", "effect": "NoExecute"},
        },
    }


async def test_never_touches_other_nodes_or_unlabelled_rules(rig: Rig) -> None:
    other_node = {planner.MANAGED_BY_LABEL: planner.MANAGED_BY, planner.NODE_LABEL: "node-b"}
    rig.api.put(foreign("other-node", other_node))
    rig.api.put(foreign("by-admin", {}))
    rig.api.put(foreign("other-manager", {planner.NODE_LABEL: NODE}))
    # Someone else's rule holds the name ours would get: ours takes the hashed name.
    rig.api.put(foreign(planner.rule_name(NODE, A), {"team": "infra"}))
    before = copy.deepcopy(rig.api.rules)
    await rig.start(taint_after=0, untaint_after=0)
    await rig.set(A, H.UNHEALTHY)
    ours = [n for n in rig.api.rules if n not in before]
    assert ours == [planner.rule_name(NODE, A, hashed=True)]
    await rig.set(A, H.HEALTHY)
    assert rig.api.rules == before
    touched = {name for op, name in rig.api.writes() if op != "create"}
    assert touched == {planner.rule_name(NODE, A, hashed=True)}


async def test_stray_rules_of_ours_are_removed(rig: Rig) -> None:
    ours = {planner.MANAGED_BY_LABEL: planner.MANAGED_BY, planner.NODE_LABEL: NODE}
    rig.api.put(foreign("stray", ours))
    (rig.state_dir / "taints.json").write_text('{"format": 1, "devices": []}')
    await rig.start()
    assert rig.api.rules == {}


# -- failures ---------------------------------------------------------------------------------


async def test_outage_keeps_the_last_state_and_creates_once(rig: Rig) -> None:
    await rig.start(taint_after=0)
    rig.api.fail(None, times=6)  # connection lost: every call for a while
    await rig.set(A, H.UNHEALTHY)
    assert rig.api.rules == {}
    await rig.advance(60)  # retries after 1, 2, 4, 8, 16 and 30 s: the sixth is at 61 s
    assert rig.api.rules == {}
    await rig.advance(1)
    assert rule_of(rig.api, A) is not None
    # Every attempt failed before reaching the API; the one that reached it created the rule.
    assert [op for op, _ in rig.api.writes()].count("create") >= 1
    assert len(rig.api.rules) == 1
    assert rig.bridge is not None
    assert rig.bridge.writes[("create", "ok")] == 1
    assert rig.bridge is not None and rig.bridge.readiness() == "ok"


async def test_api_down_at_start_is_retried(rig: Rig) -> None:
    rig.api.fail(None, times=2)  # discovery fails twice
    bridge = await rig.start(settle=False)
    await rig.clock.wait_for_sleepers(1)
    assert bridge.readiness().startswith("starting: API not reachable yet: injected None")
    rig.clock.advance(1)
    await rig.clock.wait_for_sleepers(1)
    assert bridge.state == "starting"
    rig.clock.advance(2)
    await rig.idle(0)
    assert bridge.readiness() == "ok"
    assert [what for what, _ in rig.api.log] == ["discover", "discover", "discover", "list"]


async def test_lost_answer_to_a_create_is_adopted(rig: Rig) -> None:
    await rig.start(taint_after=0)
    original = rig.api.create

    def create_then_lose(body: Obj) -> Obj:
        original(body)
        raise kube.CallError("connection lost", status=None)

    rig.api.create = create_then_lose  # type: ignore[method-assign]  # a fault, undone below
    await rig.set(A, H.UNHEALTHY)
    rig.api.create = original  # type: ignore[method-assign]  # the fault undone
    await rig.advance(5)
    assert len(rig.api.rules) == 1
    assert rig.api.log.count(("list", "")) >= 2  # relisted after the failure


async def test_unexpected_error_is_logged_and_retried(rig: Rig) -> None:
    await rig.start(taint_after=0)
    original = rig.api.list
    calls = {"n": 0}

    def list_then_break(label_selector: str) -> list[Obj]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("a bug")
        return original(label_selector)

    rig.api.list = list_then_break  # type: ignore[method-assign]  # a fault, for this rig
    rig.bridge.sync.forget()  # type: ignore[union-attr]  # force a relist
    await rig.set(A, H.UNHEALTHY)
    assert rig.bridge is not None and rig.bridge.readiness() == "ok"
    assert rule_of(rig.api, A) is None
    await rig.advance(1)
    assert rule_of(rig.api, A) is not None
    assert rig.task is not None and not rig.task.done()


async def test_forbidden_turns_the_bridge_off(rig: Rig) -> None:
    rig.api.fail(403)
    bridge = await rig.start()
    assert bridge.state == "off"
    assert bridge.readiness().startswith("off: RBAC or admission")
    assert "create, list, update and delete" in bridge.readiness()
    assert bridge.state is loop.BridgeState.OFF


async def test_forbidden_write_turns_the_bridge_off(rig: Rig) -> None:
    bridge = await rig.start(taint_after=0)
    rig.api.fail(403)
    rounds = bridge.rounds
    rig.health.health[A] = H.UNHEALTHY
    bridge.observe([A])
    await wait(lambda: bridge.state == "off")
    assert bridge.rounds == rounds
    assert rig.api.rules == {}


async def test_no_served_version_turns_the_bridge_off(rig: Rig) -> None:
    rig.api.served = None
    bridge = await rig.start()
    assert bridge.readiness() == (
        "off: API: resource.k8s.io serves no devicetaintrules in v1, v1beta2, v1alpha3 "
        "(Kubernetes 1.33+ with DRADeviceTaintRules; GA in 1.37)"
    )
    # It looks again every resync interval and resumes when the API appears.
    rig.api.served = "v1beta2"
    rig.clock.advance(300)
    await wait(lambda: bridge.state == "active")
    assert bridge.version == "v1beta2"


async def test_node_name_too_long_for_a_label(rig: Rig, tmp_path: pathlib.Path) -> None:
    bridge = loop.TaintBridge(
        client=typing.cast("kube.ApiClient", None),  # refused before any call
        node="n" * 64,
        settings=settings.Settings(
            taint_effect=settings.TaintEffect.NO_SCHEDULE, state_dir=tmp_path
        ),
        clock=rig.clock,
        health=rig.health.get,
        devices=list,
        discover=rig.api.discover,
    )
    await bridge.run()
    assert bridge.state == "off"
    assert "at most 63 characters" in bridge.readiness()
    assert rig.api.log == []


# -- the shared budget ------------------------------------------------------------------------


async def test_budget_serves_status_writes_first() -> None:
    fake = clock.FakeClock()
    budget = kube.TokenBucket(qps=1, burst=1, clock=fake)
    order: list[str] = []

    async def take(kind: str) -> None:
        if kind == "status":
            await budget.acquire()
        else:
            await budget.acquire(spare=True)
        order.append(kind)

    await take("status")  # the burst is used up
    spare = asyncio.create_task(take("taint"))
    status = [asyncio.create_task(take("status")) for _ in range(3)]
    for _ in range(10):
        await fake.wait_for_sleepers(1)
        fake.advance(1)
        for _ in range(20):
            await asyncio.sleep(0)
        if spare.done():
            break
    await asyncio.gather(spare, *status)
    assert order == ["status", "status", "status", "status", "taint"]
