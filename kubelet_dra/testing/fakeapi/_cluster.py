"""DeviceTaintRules of the fake API server: a registered type with its write rules.

DeviceTaintRules (resource.k8s.io ``v1``, ``v1beta2`` and ``v1alpha3``, one storage as in the
real server) are cluster-scoped types of the one type registry (``_fakeapi_generic``), which
serves, routes, lists, watches and describes them in discovery like any other. What is
particular to them is :func:`prepare`, their registry strategy: the checks of
``ValidateDeviceTaintRule`` the bridge could get wrong (name a DNS subdomain, taint key a label
name, value a label value, effect one of ``None``, ``NoSchedule``, ``NoExecute``) answer 422,
and ``timeAdded`` is filled in on create and renewed when an update changes the effect without
changing it. Which versions serve them is a knob (``FakeApiServer.device_taint_versions``).
"""

from __future__ import annotations

import re
from typing import Any

from kubelet_dra.testing.fakeapi import _status as status
from kubelet_dra.testing.fakeapi import _store as storage

Obj = dict[str, Any]
GROUP = "resource.k8s.io"
TAINT_VERSIONS = ("v1", "v1beta2", "v1alpha3")
TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def prepare(obj: Obj, old: Obj | None, now: str) -> None:
    """Defaulting and validation of a create (``old`` None) or update; raises 422."""
    taint = (obj.setdefault("spec", {})).setdefault("taint", {})
    old_taint = ((old or {}).get("spec") or {}).get("taint") or {}
    if not taint.get("timeAdded"):
        taint["timeAdded"] = old_taint.get("timeAdded") or now
    elif (
        old is not None
        and taint.get("effect") != old_taint.get("effect")
        and taint["timeAdded"] == old_taint.get("timeAdded")
    ):
        taint["timeAdded"] = now
    errors = _rule_errors(obj)
    if errors:
        raise status.invalid("DeviceTaintRule", str(obj["metadata"].get("name", "")), errors)


def _rule_errors(obj: Obj) -> list[status.FieldError]:
    errors = []
    name = str(obj["metadata"].get("name", ""))
    if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        errors.append(_bad("metadata.name", name, "a lowercase RFC 1123 subdomain"))
    taint = obj["spec"]["taint"]
    key = str(taint.get("key", ""))
    prefix, slash, short = key.rpartition("/")
    if (slash and not _DNS_SUBDOMAIN.fullmatch(prefix)) or not (
        0 < len(short) <= 63 and _NAME.fullmatch(short)
    ):
        errors.append(_bad("spec.taint.key", key, "a valid label name"))
    value = str(taint.get("value", ""))
    if value and not (len(value) <= 63 and _NAME.fullmatch(value)):
        errors.append(_bad("spec.taint.value", value, "a valid label value"))
    effect = taint.get("effect")
    if effect not in TAINT_EFFECTS:
        errors.append(
            status.FieldError(
                "spec.taint.effect",
                "FieldValueNotSupported",
                f'Unsupported value: "{effect}": supported values: '
                + ", ".join(f'"{e}"' for e in TAINT_EFFECTS),
            )
        )
    selector = obj["spec"].get("deviceSelector") or {}
    driver = selector.get("driver")
    if driver is not None and not (len(driver) <= 63 and _DNS_SUBDOMAIN.fullmatch(driver)):
        errors.append(_bad("spec.deviceSelector.driver", driver, "a DNS subdomain"))
    return errors


def _bad(field: str, value: str, what: str) -> status.FieldError:
    return status.FieldError(
        field, "FieldValueInvalid", f'Invalid value: "{value}": must be {what}'
    )


DEVICE_TAINT_RULES = {
    version: storage.Resource(
        "devicetaintrules",  # one storage key: every version reads and writes the same rules
        "devicetaintrules",
        "DeviceTaintRule",
        f"{GROUP}/{version}",
        True,
        frozenset({"metadata.name"}),
        namespaced=False,
        prepare=prepare,
    )
    for version in TAINT_VERSIONS
}
