"""Seeded generator of conformance scenarios, with the differences each one must show.

``scenario(seed)`` builds a scenario from ``random.Random(seed)``: one or two
drivers (now and then one with up to 20,000 devices, across the kubelet's
16,384 cap), claims over their devices (some request-scoped, some shared by
pods), pods with one or two containers, and a timeline of episodes:

- a report of some devices with new health, messages up to 2 kB (some of them
  multi-byte, cut inside a character at the limit), default or 1-3 s timeouts,
  then a sync point; with short timeouts, a wait past every deadline and
  another sync point;
- a stream end (EOF or an error), a sync point before anyone reconnects, and
  one after both did.

Generated scenarios run on the lines we follow (1.37 and 1.38). Their
deliberate differences are not guessed: a small model of both sides (the
kubelet's lazy expiry, clearDriver and second phase; our deadline task and
leases that outlive the stream) predicts at which sync point which pod is
announced by one side only, and why, and the scenario declares exactly that
(the sync point, the pod, and which side announced it); where the caches read
differently after a stream end (we keep the last state for its lease, the
kubelet's clearDriver deleted it), it declares each such device's health and
message, in our cache and in every status entry that lists it, with both
values; a message cut inside a character is declared at the sync points where
both sides show it, for that device and the status entries that list it, with
both texts (our cut at the character boundary, the kubelet's byte cut as its
JSON shows it: ``_rules``). Declarations group devices with the same values,
and each device of a group is checked on its own: a prediction that does not
come true for one of them fails the run like an undeclared difference does.

The timeline keeps away from what the model does not cover: a short-lease
device is never reported again before its deadline has passed, a device
whose lease ran out is reported again only with a different health or message,
a stream ends only when its driver's current report has default leases, and
nobody reports ``Unknown`` without a message.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from typing import Any

from tests.conformance import _rules
from tests.conformance import _scenario as sc

LINES = ("1.37", "1.38")
SEEDS = range(1, 201)
"""The fixed seeds every run plays."""
SLOW_SEEDS = range(201, 1201)
"""More seeds, under ``-m slow``."""
CAP = 16_384
MESSAGE_MAX = 1024
DEFAULT_LEASE = 30.0
SETTLED = 0.7  # wait past a deadline (the runner adds its own margin on top)
RECONNECT_WAIT = 6.0
BIG_EPISODES = 3
"""At most this many episodes in a scenario with a driver past the cap."""
NOMINAL_BUDGET = 7.0
"""No new episode after this much nominal time (the longest adds 6 s)."""
_WORDS = ("ECC", "XID", "thermal", "link", "retrain", "fan", "probing", "ok", "PCIe", "lane")

Key = tuple[str, str]  # (driver, device); one pool per generated driver


@dataclasses.dataclass
class _Stored:
    value: tuple[str, str]  # (health, message) as reported (message cut like the kubelet)
    lease: float
    at: float  # nominal time of the last report


class _Model:
    """Both sides' caches on the scenario's nominal clock, for the announced pods."""

    def __init__(self, users: dict[Key, set[str]]) -> None:
        self.users = users
        self.kubelet: dict[str, dict[str, _Stored]] = {}
        self.ours: dict[str, dict[str, _Stored]] = {}
        self.ours_unknown: set[Key] = set()  # expired on our side (visible Unknown)
        self.cleared: set[Key] = set()  # deleted by the kubelet's clearDriver, not reported since
        self.announced_kubelet: set[str] = set()
        self.announced_ours: set[str] = set()
        self.causes: dict[str, set[str]] = {}  # pod -> why it was announced
        self.expired_handled: set[Key] = set()

    def _pods(self, key: Key) -> set[str]:
        return self.users.get(key, set())

    def ours_visible(self, key: Key, now: float) -> tuple[str, str]:
        rec = self.ours.get(key[0], {}).get(key[1])
        if rec is None or key in self.ours_unknown or now - rec.at > rec.lease:
            return ("Unknown", "")
        return rec.value

    def kubelet_visible(self, key: Key, now: float) -> tuple[str, str]:
        rec = self.kubelet.get(key[0], {}).get(key[1])
        if rec is None or now - rec.at > rec.lease:
            return ("Unknown", "")
        return rec.value

    def reads_differ(self, now: float) -> dict[Key, tuple[tuple[str, str], tuple[str, str]]]:
        """The devices that read differently, with (ours, kubelet) (only after a stream
        end: our kept leases)."""
        keys = {
            (d, n) for side in (self.ours, self.kubelet) for d, devs in side.items() for n in devs
        }
        reads = {k: (self.ours_visible(k, now), self.kubelet_visible(k, now)) for k in keys}
        return {k: v for k, v in sorted(reads.items()) if v[0] != v[1]}

    def advance(self, now: float) -> None:
        """Our deadline task: leases that ran out by ``now`` turn Unknown, pods announced."""
        for driver, devices in self.ours.items():
            for name, rec in devices.items():
                key = (driver, name)
                if key in self.ours_unknown or now - rec.at <= rec.lease:
                    continue
                self.ours_unknown.add(key)
                if rec.value != ("Unknown", ""):
                    self.announced_ours |= self._pods(key)
                    self._cause(key, "unknown-at-deadline")

    def report(self, driver: str, devices: list[tuple[str, tuple[str, str], float]], now: float):
        self.advance(now)
        kub = self.kubelet.setdefault(driver, {})
        ours = self.ours.setdefault(driver, {})
        reported = {name for name, _, _ in devices}
        for name, value, lease in devices:
            key = (driver, name)
            old = kub.get(name)
            prev = ours.get(name)
            # Both sides ignore new devices of a full driver, each by its own count: after
            # a stream end ours still holds the devices whose leases it kept, the
            # kubelet's clearDriver emptied its own.
            kubelet_takes = old is not None or len(kub) < CAP
            ours_takes = prev is not None or len(ours) < CAP
            kubelet_announces = kubelet_takes and (
                old is None or old.value != value or old.lease != lease
            )
            if kubelet_announces:
                self.announced_kubelet |= self._pods(key)
            if kubelet_takes:
                kub[name] = _Stored(value, lease, now)
            if not ours_takes:
                if kubelet_takes:
                    self._cause(key, "lease-outlives-stream")  # kept leases fill our cap
                continue
            before = self.ours_visible(key, now)
            if prev is None or before != value or prev.lease != lease:
                self.announced_ours |= self._pods(key)
            elif kubelet_announces and key in self.cleared and self._pods(key):
                self._cause(key, "lease-outlives-stream")  # new to the cleared kubelet only
            self.cleared.discard(key)
            ours[name] = _Stored(value, lease, now)
            self.ours_unknown.discard(key)
        # The kubelet's second phase: expired devices missing from the report turn
        # Unknown once (announced) and are deleted.
        for name in [n for n in kub if n not in reported]:
            rec = kub[name]
            if now - rec.at > rec.lease:
                if rec.value[0] != "Unknown":
                    self.announced_kubelet |= self._pods((driver, name))
                    self._cause((driver, name), "unknown-at-deadline")
                del kub[name]
                ours.pop(name, None)  # we delete expired entries too (after the notice)

    def end(self, driver: str, now: float) -> None:
        self.advance(now)
        # clearDriver: nobody announced. Ours keep their leases: nothing changes.
        self.cleared |= {(driver, name) for name in self.kubelet.pop(driver, {})}

    def _cause(self, key: Key, cause: str) -> None:
        for pod in self._pods(key):
            self.causes.setdefault(pod, set()).add(cause)

    def sync(self, now: float) -> tuple[set[str], set[str], dict[str, set[str]]]:
        self.advance(now)
        out = (self.announced_ours, self.announced_kubelet, self.causes)
        self.announced_ours, self.announced_kubelet, self.causes = set(), set(), {}
        return out


@dataclasses.dataclass
class _Plan:
    rng: random.Random
    drivers: dict[str, list[str]]
    users: dict[Key, set[str]]
    steps: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    differences: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    now: float = 0.0
    syncs: int = 0
    current: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    split_messages: set[Key] = dataclasses.field(default_factory=set)
    raw: dict[Key, str] = dataclasses.field(default_factory=dict)
    """The message last reported for each device, before any cut."""
    visible_split: dict[str, dict[Key, str]] = dataclasses.field(default_factory=dict)
    """Sync point -> devices whose message (cut inside a character) both sides show, with
    the message as reported."""
    differing: dict[str, dict[Key, tuple[tuple[str, str], tuple[str, str]]]] = dataclasses.field(
        default_factory=dict
    )
    """Sync point -> devices our kept lease and the kubelet's cleared cache read differently."""
    split_at: dict[str, dict[Key, str]] = dataclasses.field(default_factory=dict)
    """Sync point -> devices whose last message was cut inside a character then (with the
    message as reported)."""

    def __post_init__(self) -> None:
        self.model = _Model(self.users)
        self.last: dict[Key, tuple[tuple[str, str], float, float]] = {}

    def sync(self) -> None:
        self.syncs += 1
        name = f"s{self.syncs}"
        differ = self.model.reads_differ(self.now)
        ours, kubelet, causes = self.model.sync(self.now)
        # Each side's whole set, not only where they differ: a pod both sides announce
        # (or both miss) against the model fails too.
        predicted = {"ours": sorted(ours), "twin": sorted(kubelet)}
        self.steps.append({"sync": {"name": name, "announced": predicted}})
        if differ:
            self.differing[name] = differ
            self.split_at[name] = {k: self.raw[k] for k in self.split_messages}
        # One declaration per (cause, side): the pods only that side announced.
        grouped: dict[tuple[str, bool], list[str]] = {}
        for pod in sorted(ours ^ kubelet):
            for cause in sorted(causes.get(pod) or {"unknown-at-deadline"}):
                grouped.setdefault((cause, pod in ours), []).append(f"pod {pod}")
        for (cause, by_ours), subjects in sorted(grouped.items()):
            self.differences.append(
                {"feature": cause, "kinds": ["announced"], "at": [name], "subject": subjects,
                 "field": ["announced"], "ours": by_ours, "twin": not by_ours}
            )  # fmt: skip
        # Where the caches read differently (a kept lease), the lease declarations have
        # the message; elsewhere both sides show the cut text, each its own.
        shown = {
            k: self.raw[k]
            for k in self.split_messages
            if self.model.ours_visible(k, self.now)[1] and k not in differ
        }
        if shown:
            self.visible_split[name] = shown

    def wait(self, seconds: float) -> None:
        seconds = round(seconds, 2)
        self.steps.append({"wait": seconds})
        self.now += seconds


def _message(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.35:
        return ""
    if roll < 0.75:
        return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 6)))
    length = rng.randint(900, 2048)
    if roll < 0.9:
        return "".join(rng.choice("abcdefghij 0123456789") for _ in range(length))
    unit = rng.choice(["é", "温", "🙂"])
    return rng.choice(["", "x", "xy"]) + unit * (length // len(unit.encode()))


def _cut(message: str) -> tuple[str, bool]:
    """The kubelet's byte cut, and whether it splits a character."""
    raw = message.encode()
    if len(raw) <= MESSAGE_MAX:
        return message, False
    head = raw[: MESSAGE_MAX - 3]
    try:
        return head.decode() + "...", False
    except UnicodeDecodeError:
        return head.decode(errors="replace") + "...", True


def _report_episode(plan: _Plan, driver: str) -> None:
    rng = plan.rng
    names = plan.drivers[driver]
    big = len(names) > 100
    short = not big and rng.random() < 0.4
    if big and driver not in plan.current:
        _big_first_report(plan, driver)
        return
    chosen = rng.sample(names, k=rng.randint(1, min(len(names), 6)))
    devices: list[dict[str, Any]] = []
    model_devices = []
    for name in chosen:
        key = (driver, name)
        previous = plan.last.get(key)
        expired = previous is not None and plan.now - previous[2] > previous[1]
        for _ in range(20):
            health = rng.choice(["Healthy", "Unhealthy", "Unknown"])
            message = "" if big else _message(rng)
            if health == "Unknown" and not message:
                message = "probing"
            value = (health, _cut(message)[0])
            if not (expired and previous is not None and previous[0] == value):
                break
        lease = float(rng.choice([1, 2, 3])) if short and rng.random() < 0.7 else DEFAULT_LEASE
        device: dict[str, Any] = {"device": name, "health": health}
        if message:
            device["message"] = message
        if lease != DEFAULT_LEASE:
            device["timeout"] = int(lease)
        devices.append(device)
        model_devices.append((name, value, lease))
        plan.last[key] = (value, lease, plan.now)
        plan.raw[key] = message
        if _cut(message)[1]:
            plan.split_messages.add(key)
        else:
            plan.split_messages.discard(key)
    plan.steps.append({"report": {"driver": driver, "devices": devices}})
    plan.current[driver] = devices
    plan.model.report(driver, model_devices, plan.now)
    leases = [lease for _, _, lease in model_devices if lease != DEFAULT_LEASE]
    if not leases or min(leases) >= 2:
        plan.sync()
    if leases:
        plan.wait(max(leases) + SETTLED)
        plan.sync()


def _big_first_report(plan: _Plan, driver: str) -> None:
    """The first report of a big driver names every device (past the cap)."""
    names = plan.drivers[driver]
    health = plan.rng.choice(["Healthy", "Unhealthy"])
    devices = [{"device": "dev-", "count": len(names), "health": health}]
    for n in names:
        plan.last[(driver, n)] = ((health, ""), DEFAULT_LEASE, plan.now)
    plan.steps.append({"report": {"driver": driver, "devices": devices}})
    plan.current[driver] = devices
    plan.model.report(driver, [(n, (health, ""), DEFAULT_LEASE) for n in names], plan.now)
    plan.sync()


def _end_episode(plan: _Plan, driver: str) -> bool:
    current = plan.current.get(driver)
    if not current or any("timeout" in d for d in current):
        return False
    code = plan.rng.choice([None, "UNAVAILABLE", "INTERNAL"])
    plan.steps.append({"end_stream": {"driver": driver, "code": code}})
    plan.model.end(driver, plan.now)
    plan.sync()
    plan.wait(RECONNECT_WAIT)
    # Both reconnect and receive the driver's current report again.
    model_devices = []
    for d in current:
        if "count" in d:
            model_devices += [
                (f"dev-{i}", (d["health"], ""), DEFAULT_LEASE) for i in range(d["count"])
            ]
        else:
            value = (d["health"], _cut(d.get("message", ""))[0])
            model_devices.append((d["device"], value, DEFAULT_LEASE))
            plan.last[(driver, d["device"])] = (value, DEFAULT_LEASE, plan.now)
    plan.model.report(driver, model_devices, plan.now)
    plan.sync()
    return True


def _inventory(rng: random.Random, seed: int, slow: bool) -> dict[str, list[str]]:
    drivers: dict[str, list[str]] = {}
    for i in range(rng.choice([1, 1, 2])):
        name = f"drv-{'ab'[i]}.example.com"
        big = seed % 40 == 7 or (slow and rng.random() < 0.05)
        count = rng.randint(CAP - 50, 20_000) if big else rng.randint(2, 12)
        drivers[name] = [f"dev-{n}" for n in range(count)]
    return drivers


def scenario(seed: int, *, slow: bool = False) -> sc.Scenario:
    """The generated scenario for ``seed`` (``slow``: bigger drivers more often)."""
    rng = random.Random(seed)
    drivers = _inventory(rng, seed, slow)
    claims: list[dict[str, Any]] = []
    for c in range(rng.randint(1, 4)):
        driver = rng.choice(list(drivers))
        names = drivers[driver]
        # Prepare order = resourceID (string) order: no order difference on 1.37.
        pick = sorted(
            names[i] for i in rng.sample(range(len(names)), k=min(len(names), rng.randint(1, 3)))
        )
        request = rng.choice(["", "", "gpu"])
        claims.append(
            {
                "name": f"claim-{c}",
                "devices": [
                    {"driver": driver, "pool": "pool", "device": name, "request": request}
                    for name in pick
                ],
            }
        )
    pods: list[dict[str, Any]] = []
    users: dict[Key, set[str]] = {}
    for p in range(rng.randint(1, 3)):
        mine = rng.sample(claims, k=rng.randint(1, min(2, len(claims))))
        refs = [{"name": f"r{i}", "claim": c["name"]} for i, c in enumerate(mine)]
        containers = []
        for n in range(rng.randint(1, 2)):
            used = []
            for i, chosen in enumerate(mine):
                if rng.random() < 0.8:
                    request = chosen["devices"][0]["request"]
                    used.append(f"r{i}/{request}" if request and rng.random() < 0.5 else f"r{i}")
            containers.append({"name": f"c{n}", "claims": used})
        pods.append({"name": f"pod-{p}", "claims": refs, "containers": containers})
        for chosen in mine:
            for d in chosen["devices"]:
                users.setdefault((d["driver"], d["device"]), set()).add(f"pod-{p}")
    plan = _Plan(rng, drivers, users)
    plan.sync()
    episodes = rng.randint(3, 7)
    big = [name for name, names in drivers.items() if len(names) > 100]
    if big:
        # Each sync point and report of a driver past the cap takes seconds of real time
        # under load (16,384 devices compared and checkpointed): with more episodes the
        # run outlasts the big report's 30 s lease and only ever fails on timing. The
        # last one ends the big driver's stream, so that every big seed compares the
        # leases we keep past a stream end with the kubelet's cleared cache.
        episodes = min(episodes, BIG_EPISODES)
    for i in range(episodes):
        if plan.now > NOMINAL_BUDGET:
            break  # default leases (30 s) must not run out in real time, settling included
        last = bool(big) and i == episodes - 1
        driver = big[0] if last else rng.choice(list(drivers))
        if (last or rng.random() < 0.25) and _end_episode(plan, driver):
            continue
        _report_episode(plan, driver)
    differences = list(plan.differences)
    for at, keys in sorted(plan.visible_split.items()):
        differences += _split_declarations(at, keys, claims, pods)
    for at, reads in sorted(plan.differing.items()):
        differences += _lease_declarations(at, reads, claims, pods, plan.split_at[at])
    return sc.Scenario.model_validate(
        {
            "name": f"generated-{seed}",
            "description": f"generated from seed {seed}",
            "lines": list(LINES),
            "drivers": [{"name": d} for d in drivers],
            "claims": claims,
            "pods": pods,
            "timeline": plan.steps,
            "differences": differences,
            "generated": True,
        }
    )


def _split_declarations(
    at: str, keys: dict[Key, str], claims: list[dict[str, Any]], pods: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``message-char-boundary`` at one sync point: the message of each device whose
    message is cut inside a character, in our cache and in every status entry listing it
    (entry ``claim:<ref>[/<request>]``, resource ``<driver>/pool/<device>``), with our text
    and the kubelet's, one declaration per device and place (each has its own texts)."""
    feature = "message-char-boundary"
    out = []
    for (driver, name), raw in sorted(keys.items()):
        ours, twin = _rules.cut_at_character(raw), _rules.cut_bytes(raw)
        out.append({"feature": feature, "kinds": ["devices"], "at": [at],
                    "subject": [f"{driver}/pool/{name}"], "field": ["message"],
                    "ours": ours, "twin": twin})  # fmt: skip
        fields: dict[str, set[str]] = {}  # subject -> fields
        for key, subject, resource in _listings(claims, pods):
            if key == (driver, name):
                fields.setdefault(subject, set()).add(f"{resource} message")
        for subject, names in sorted(fields.items()):
            out.append({"feature": feature, "kinds": ["status"], "at": [at],
                        "subject": [subject], "field": sorted(names),
                        "ours": ours, "twin": twin})  # fmt: skip
    return out


def _lease_declarations(
    at: str,
    reads: dict[Key, tuple[tuple[str, str], tuple[str, str]]],
    claims: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    split: Mapping[Key, str] | None = None,
) -> list[dict[str, Any]]:
    """``lease-outlives-stream`` at one sync point: each device field (health, message)
    our kept lease reads otherwise than the kubelet's cleared cache, in both caches and in
    every status entry listing the device, grouped by the two values (a message cut
    inside a character: our cut of it, the model keeping the kubelet's)."""
    split = split or {}
    # (kind, status subject or "", ours, twin) -> devices, or the subject's fields
    groups: dict[tuple[str, str, str, str], set[str]] = {}
    listed = _listings(claims, pods)
    for key, (mine, theirs) in reads.items():
        for i, name in enumerate(("health", "message")):
            if mine[i] == theirs[i]:
                continue
            value = mine[i]
            if name == "message" and key in split:
                value = _rules.cut_at_character(split[key])
            device = f"{key[0]}/pool/{key[1]}"
            groups.setdefault(("devices", name, value, theirs[i]), set()).add(device)
            for k, subject, resource in listed:
                if k == key:
                    group = groups.setdefault(("status", subject, value, theirs[i]), set())
                    group.add(f"{resource} {name}")
    out: list[dict[str, Any]] = []
    for (kind, where, mine_v, theirs_v), names in sorted(groups.items()):
        subjects, fields = (
            (sorted(names), [where]) if kind == "devices" else ([where], sorted(names))
        )
        out.append({"feature": "lease-outlives-stream", "kinds": [kind], "at": [at],
                    "subject": subjects, "field": fields, "ours": mine_v,
                    "twin": theirs_v})  # fmt: skip
    return out


def _listings(
    claims: list[dict[str, Any]], pods: list[dict[str, Any]]
) -> list[tuple[Key, str, str]]:
    """Every (device, status subject, ``entry <e> resource <id>``) where a container's
    ``allocatedResourcesStatus`` lists a device."""
    by_claim = {c["name"]: c for c in claims}
    out = []
    for pod in pods:
        refs = {r["name"]: by_claim[r["claim"]] for r in pod["claims"]}
        for container in pod["containers"]:
            subject = f"pod {pod['name']} containerStatuses[{container['name']}]"
            for used in container["claims"]:
                ref, _, request = used.partition("/")
                entry = f"claim:{ref}/{request}" if request else f"claim:{ref}"
                for d in refs[ref]["devices"]:
                    rid = f"{d['driver']}/{d['pool']}/{d['device']}"
                    out.append(
                        ((d["driver"], d["device"]), subject, f"entry {entry} resource {rid}")
                    )
    return out


def every_run() -> list[sc.Scenario]:
    """The generated scenarios of every run (fixed seeds)."""
    return [scenario(seed) for seed in SEEDS]
