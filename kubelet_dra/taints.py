"""The taint bridge's decisions: which devices should carry a DeviceTaintRule, and its shape.

No kubelet counterpart: the kubelet stops at ``allocatedResourcesStatus``. This module is
pure (``now`` is always an argument, nothing is read or written); ``taintbridge`` runs it
against the health cache and the API.

Per device it keeps a :class:`Track`: the health the device shows, since when it shows it
without interruption, and the taint the bridge decided on (if any). :func:`step` applies
the thresholds:

- untainted, ``Unhealthy`` for ``taint_after`` seconds without interruption: taint with
  value ``Unhealthy``; ``Unknown`` for ``taint_unknown_after`` (if set): value ``Unknown``;
- tainted, ``Healthy`` for ``untaint_after`` seconds without interruption: untaint;
- tainted ``Unknown`` and then ``Unhealthy`` for ``taint_after``: the value becomes
  ``Unhealthy``. ``Unknown`` never replaces ``Unhealthy``: it says nothing new about a
  device known to be broken.

Every change of health restarts the clock, so a device that flaps faster than the
thresholds never changes its taint: no rule churn. The driver's message is the one of the
moment of the decision; later messages do not rewrite the rule (drivers put counters and
temperatures in messages).

Rule objects (:func:`rule_body`) carry the labels the reconciler lists by, the selector
of exactly one device and the taint; :func:`rule_name` derives a stable, valid name.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import re
from collections.abc import Mapping
from typing import Any

from kubelet_dra import models
from kubelet_dra.podjson import MutableObj

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "kubelet-dra-health"
NODE_LABEL = "kubelet-dra.io/node"
MESSAGE_ANNOTATION = "kubelet-dra.io/message"
DEVICE_ANNOTATION = "kubelet-dra.io/device"
RESOURCE_ID_ANNOTATION = "kubelet-dra.io/resource-id"
"""The kubelet's ``resourceID`` of the device (its first CDI device ID), set only where it
differs from the ``<driver>/<pool>/<device>`` of :data:`DEVICE_ANNOTATION`."""
MESSAGE_MAX_BYTES = 256
"""The driver's message in the annotation is cut to this many bytes: enough to read the
reason, small enough that thousands of rules stay cheap to list."""

NAME_MAX = 253
_HASH_LEN = 10
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


@dataclasses.dataclass(frozen=True, slots=True)
class Thresholds:
    """The bridge's settings in seconds; ``unknown_after`` ``None`` never taints Unknown."""

    effect: str
    key: str
    taint_after: float = 10.0
    unknown_after: float | None = None
    untaint_after: float = 60.0


@dataclasses.dataclass(frozen=True, slots=True)
class Taint:
    """A decided taint: its value (the health), when it was decided, the driver's message."""

    value: str
    time_added: float
    message: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Track:
    """What the bridge remembers of one device (persisted across restarts)."""

    health: models.HealthStatus
    since: float
    taint: Taint | None = None

    @property
    def forgettable(self) -> bool:
        """Healthy and untainted: nothing to remember."""
        return self.taint is None and self.health is models.HealthStatus.HEALTHY


def observe(track: Track | None, health: models.HealthStatus, now: float) -> Track:
    """The track after the device was seen with ``health`` at ``now``."""
    if track is None:
        return Track(health, now)
    if track.health is health:
        return track
    return Track(health, now, track.taint)


def step(
    track: Track, thresholds: Thresholds, now: float, message: str = ""
) -> tuple[Track, float | None]:
    """Apply the thresholds at ``now``: the new track and when to look again (or ``None``)."""
    held = now - track.since
    health = models.HealthStatus
    if track.taint is None:
        after = _taint_threshold(track.health, thresholds)
        if after is None:
            return track, None
        if held >= after:
            taint = Taint(track.health.value, now, _cut(message))
            return dataclasses.replace(track, taint=taint), None
        return track, track.since + after
    if track.health is health.HEALTHY:
        if held >= thresholds.untaint_after:
            return dataclasses.replace(track, taint=None), None
        return track, track.since + thresholds.untaint_after
    if track.health is health.UNHEALTHY and track.taint.value != health.UNHEALTHY.value:
        if held >= thresholds.taint_after:
            taint = Taint(health.UNHEALTHY.value, track.taint.time_added, _cut(message))
            return dataclasses.replace(track, taint=taint), None
        return track, track.since + thresholds.taint_after
    return track, None


def _taint_threshold(health: models.HealthStatus, thresholds: Thresholds) -> float | None:
    if health is models.HealthStatus.UNHEALTHY:
        return thresholds.taint_after
    if health is models.HealthStatus.UNKNOWN:
        return thresholds.unknown_after
    return None


def _cut(message: str) -> str:
    raw = message.encode("utf-8")
    if len(raw) <= MESSAGE_MAX_BYTES:
        return message
    return raw[: MESSAGE_MAX_BYTES - 3].decode("utf-8", errors="ignore") + "..."


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
    taint: Taint,
    thresholds: Thresholds,
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


def device_of(rule: Mapping[str, Any]) -> models.DeviceKey | None:
    """The one device a rule of ours selects, or ``None`` if it does not select exactly one."""
    selector = (rule.get("spec") or {}).get("deviceSelector") or {}
    driver, pool, device = (selector.get(field) for field in ("driver", "pool", "device"))
    if not (isinstance(driver, str) and isinstance(pool, str) and isinstance(device, str)):
        return None
    if not (driver and pool and device):
        return None
    return models.DeviceKey(driver, pool, device)


def differs(current: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether an existing rule must be updated: labels, selector, key, value or effect.

    ``timeAdded`` is the API server's (it rewrites it when the effect changes) and the
    message annotation is informational: neither alone causes an update.
    """
    cur_meta, want_meta = current.get("metadata") or {}, desired["metadata"]
    labels = cur_meta.get("labels") or {}
    if any(labels.get(k) != v for k, v in want_meta["labels"].items()):
        return True
    cur_spec, want_spec = current.get("spec") or {}, desired["spec"]
    if (cur_spec.get("deviceSelector") or {}) != want_spec["deviceSelector"]:
        return True
    cur_taint, want_taint = cur_spec.get("taint") or {}, want_spec["taint"]
    return any(cur_taint.get(f) != want_taint[f] for f in ("key", "value", "effect"))


def updated(current: Mapping[str, Any], desired: MutableObj) -> MutableObj:
    """``current`` with the desired labels, annotations and spec, keeping its timeAdded."""
    body: MutableObj = {
        "metadata": dict(current.get("metadata") or {}),
        "spec": dict(desired["spec"]),
    }
    meta = body["metadata"]
    meta.pop("managedFields", None)
    meta["labels"] = {**(meta.get("labels") or {}), **desired["metadata"]["labels"]}
    meta["annotations"] = {**(meta.get("annotations") or {}), **desired["metadata"]["annotations"]}
    old_time = ((current.get("spec") or {}).get("taint") or {}).get("timeAdded")
    taint = dict(desired["spec"]["taint"])
    if old_time:
        taint["timeAdded"] = old_time
    body["spec"]["taint"] = taint
    return body


def taint_from_rule(rule: Mapping[str, Any], now: float) -> Taint:
    """The taint an existing rule of ours records (adopted after a lost state file)."""
    spec_taint = (rule.get("spec") or {}).get("taint") or {}
    value = str(spec_taint.get("value") or models.HealthStatus.UNHEALTHY.value)
    added = parse_rfc3339(str(spec_taint.get("timeAdded") or "")) or now
    message = ((rule.get("metadata") or {}).get("annotations") or {}).get(MESSAGE_ANNOTATION, "")
    return Taint(value, added, str(message))


def rfc3339(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(int(seconds), datetime.UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


def parse_rfc3339(text: str) -> float | None:
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
