"""The taint bridge's planner: DeviceTaintRules named and shaped, desired state to operations.

No kubelet counterpart (KEP-5055's "an external health monitor creates DeviceTaintRules").
Pure, like ``policy``: it reads rule objects as the API returned them (through the
``podjson`` accessors) and returns new ones; ``loop`` sends them.

Rule objects (:func:`rule_body`) carry the labels the reconciler lists by, the selector
of exactly one device and the taint; :func:`rule_name` derives a stable, valid name.
:func:`plan` compares the taints the policy decided with this node's rules and says what
to create, update and delete: only what differs.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import re
from collections.abc import Callable, Mapping

from kubelet_dra import models
from kubelet_dra.status import podjson
from kubelet_dra.status.podjson import MutableObj, Obj
from kubelet_dra.taints import policy

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "kubelet-dra-health"
NODE_LABEL = "kubelet-dra.io/node"
MESSAGE_ANNOTATION = "kubelet-dra.io/message"
DEVICE_ANNOTATION = "kubelet-dra.io/device"
RESOURCE_ID_ANNOTATION = "kubelet-dra.io/resource-id"
"""The kubelet's ``resourceID`` of the device (its first CDI device ID), set only where it
differs from the ``<driver>/<pool>/<device>`` of :data:`DEVICE_ANNOTATION`."""
EFFECTS = ("None", "NoSchedule", "NoExecute")
OPS = ("create", "update", "delete")

NAME_MAX = 253
_HASH_LEN = 10
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


# -- names and objects ---------------------------------------------------------------------


def rule_name(node: str, key: models.DeviceKey, *, hashed: bool = False) -> str:
    """``<node>.<driver>.<pool>.<device>`` when that is a valid name, else a hashed one.

    Stable (a function of node and device only) and always a valid DNS subdomain. The
    readable form is used when it is valid and at most 253 characters; otherwise (or with
    ``hashed``, which the reconciler uses when someone else's rule holds the readable name)
    a prefix of it plus a hash of the exact node and device.
    """
    plain = ".".join((node, key.driver, key.pool.replace("/", "."), key.device))
    if not hashed and len(plain) <= NAME_MAX and _DNS_SUBDOMAIN.fullmatch(plain):
        return plain
    exact = "\0".join((node, key.driver, key.pool, key.device)).encode()
    digest = hashlib.sha256(exact).hexdigest()[:_HASH_LEN]
    prefix = re.sub(r"[^a-z0-9.-]+", "-", plain.lower())
    prefix = prefix[: NAME_MAX - _HASH_LEN - 1]
    # Each dot-separated part must start and end alphanumeric; collapse what does not.
    parts = [p.strip("-") for p in prefix.split(".")]
    prefix = ".".join(p for p in parts if p)
    return f"{prefix}-{digest}" if prefix else digest


def valid_label_value(value: str) -> bool:
    return len(value) <= 63 and _LABEL_VALUE.fullmatch(value) is not None


def valid_taint_key(key: str) -> bool:
    """A label name: ``[prefix/]name``, prefix a DNS subdomain, name at most 63 characters."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > NAME_MAX or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        return False
    return 0 < len(name) <= 63 and _QUALIFIED_NAME.fullmatch(name) is not None


def node_selector(node: str) -> str:
    """The label selector of this node's rules (and only rules we manage)."""
    return f"{MANAGED_BY_LABEL}={MANAGED_BY},{NODE_LABEL}={node}"


def rule_body(
    name: str,
    node: str,
    key: models.DeviceKey,
    taint: policy.Taint,
    thresholds: policy.Thresholds,
    *,
    kubelet_id: str = "",
) -> MutableObj:
    """The DeviceTaintRule we want for one device (no apiVersion/kind: the API adds them).

    ``kubelet_id`` is the kubelet's ``resourceID`` of the device; it is annotated where it
    differs from ``<driver>/<pool>/<device>``, so the rule can be matched with the field.
    """
    annotations = {MESSAGE_ANNOTATION: taint.message, DEVICE_ANNOTATION: str(key)}
    if kubelet_id and kubelet_id != str(key):
        annotations[RESOURCE_ID_ANNOTATION] = kubelet_id
    return {
        "metadata": {
            "name": name,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY, NODE_LABEL: node},
            "annotations": annotations,
        },
        "spec": {
            "deviceSelector": {"driver": key.driver, "pool": key.pool, "device": key.device},
            "taint": {
                "key": thresholds.key,
                "value": taint.value,
                "effect": thresholds.effect,
                "timeAdded": rfc3339(taint.time_added),
            },
        },
    }


def device_of(rule: Obj) -> models.DeviceKey | None:
    """The one device a rule of ours selects, or ``None`` if it does not select exactly one."""
    selector = podjson.child(rule, "spec", "deviceSelector")
    driver, pool, device = (selector.get(field) for field in ("driver", "pool", "device"))
    if not (isinstance(driver, str) and isinstance(pool, str) and isinstance(device, str)):
        return None
    if not (driver and pool and device):
        return None
    return models.DeviceKey(driver, pool, device)


def is_ours(rule: Obj, node: str) -> bool:
    """Whether ``rule`` carries our managed-by label and ``node``'s label."""
    if not isinstance(rule.get("metadata"), dict):
        return False
    labels = podjson.child(rule, "metadata", "labels")
    return bool(labels.get(MANAGED_BY_LABEL) == MANAGED_BY and labels.get(NODE_LABEL) == node)


def effect_of(rule: Obj) -> str:
    """The rule's taint effect, ``""`` if it names none."""
    return str(podjson.child(rule, "spec", "taint").get("effect") or "")


def differs(current: Obj, desired: Obj) -> bool:
    """Whether an existing rule must be updated: labels, selector, key, value or effect.

    ``timeAdded`` is the API server's (it rewrites it when the effect changes) and the
    message annotation is informational: neither alone causes an update.
    """
    want_meta, want_spec = desired["metadata"], desired["spec"]
    labels = podjson.child(current, "metadata", "labels")
    if any(labels.get(k) != v for k, v in want_meta["labels"].items()):
        return True
    if podjson.child(current, "spec", "deviceSelector") != want_spec["deviceSelector"]:
        return True
    cur_taint, want_taint = podjson.child(current, "spec", "taint"), want_spec["taint"]
    return any(cur_taint.get(f) != want_taint[f] for f in ("key", "value", "effect"))


def updated(current: Obj, desired: MutableObj) -> MutableObj:
    """``current`` with the desired labels, annotations and spec, keeping its timeAdded."""
    body: MutableObj = {"metadata": dict(podjson.metadata(current)), "spec": dict(desired["spec"])}
    meta = body["metadata"]
    meta.pop("managedFields", None)
    meta["labels"] = {**podjson.child(meta, "labels"), **desired["metadata"]["labels"]}
    meta["annotations"] = {
        **podjson.child(meta, "annotations"), **desired["metadata"]["annotations"]
    }  # fmt: skip
    old_time = podjson.child(current, "spec", "taint").get("timeAdded")
    taint = dict(desired["spec"]["taint"])
    if old_time:
        taint["timeAdded"] = old_time
    body["spec"]["taint"] = taint
    return body


def taint_from_rule(rule: Obj, now: float) -> policy.Taint:
    """The taint an existing rule of ours records (adopted after a lost state file)."""
    spec_taint = podjson.child(rule, "spec", "taint")
    value = str(spec_taint.get("value") or models.HealthStatus.UNHEALTHY.value)
    added = parse_rfc3339(str(spec_taint.get("timeAdded") or "")) or now
    message = podjson.child(rule, "metadata", "annotations").get(MESSAGE_ANNOTATION, "")
    return policy.Taint(value, added, str(message))


def rfc3339(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(int(seconds), datetime.UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


def parse_rfc3339(text: str) -> float | None:
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


# -- the plan ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Create:
    """Create a rule tainting ``key`` (named by :func:`rule_name` when sent)."""

    key: models.DeviceKey
    taint: policy.Taint


@dataclasses.dataclass(frozen=True, slots=True)
class Update:
    """Replace ``current`` with :func:`updated` of it and ``body``."""

    current: Obj
    body: MutableObj


@dataclasses.dataclass(frozen=True, slots=True)
class Delete:
    """Delete ``rule`` (its device is untainted, or another rule of ours selects it)."""

    rule: Obj


Operation = Create | Update | Delete


def plan(
    tracks: Mapping[models.DeviceKey, policy.Track],
    rules: Mapping[str, Obj],
    *,
    node: str,
    thresholds: policy.Thresholds,
    kubelet_id: Callable[[models.DeviceKey], str],
) -> list[Operation]:
    """What turns ``rules`` (this node's, by name) into the taints ``tracks`` decided.

    Creates and updates in device order, then deletes in name order: a device keeps the
    first rule (by name) that selects it, and every other rule of ours goes.
    """
    desired = {key: t.taint for key, t in tracks.items() if t.taint is not None}
    existing: dict[models.DeviceKey, Obj] = {}
    surplus: list[Obj] = []
    for name in sorted(rules):
        key = device_of(rules[name])
        if key is None or key not in desired or key in existing:
            surplus.append(rules[name])
        else:
            existing[key] = rules[name]
    operations: list[Operation] = []
    for key, taint in sorted(desired.items()):
        current = existing.get(key)
        if current is None:
            operations.append(Create(key, taint))
            continue
        body = rule_body(
            podjson.name(current), node, key, taint, thresholds, kubelet_id=kubelet_id(key)
        )
        if differs(current, body):
            operations.append(Update(current, body))
    operations.extend(Delete(rule) for rule in surplus)
    return operations


def adopted(
    rules: Mapping[str, Obj],
    tracks: Mapping[models.DeviceKey, policy.Track],
    *,
    health: Callable[[models.DeviceKey], models.HealthStatus],
    now: float,
) -> dict[models.DeviceKey, policy.Track]:
    """Tracks for the devices our rules taint that ``tracks`` holds no taint for.

    After a lost state file: a device still broken must not be untainted, so it starts
    from the rule's taint, with the health it shows ``now``.
    """
    found: dict[models.DeviceKey, policy.Track] = {}
    for rule in rules.values():
        key = device_of(rule)
        if key is None:
            continue
        track = found.get(key) or tracks.get(key)
        if track is None or track.taint is None:
            found[key] = policy.Track(health(key), now, taint_from_rule(rule, now))
    return found
