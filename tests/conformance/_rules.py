"""Rules that give a declared side's value where a declaration cannot write it out.

A declaration fixes both sides' values (``ours`` and ``twin``); where a value depends on
the comparison (a 1,200-byte message cut at the API's limit, a status entry whose health
changes from one sync point to the next), it names a rule instead (``ours_rule``,
``twin_rule``) and the rule computes the value for each comparison in its scope:

- ``message-cut-at-character``: our cut of the message last reported for the compared
  device (``state/healthinfo.py``): whole characters within 1,021 bytes, then ``...``;
- ``message-cut-bytes``: the kubelet's cut (``truncateHealthMessage``): the first 1,021
  bytes, then ``...``, each byte of the split character shown as U+FFFD (Go's JSON
  encoding of a string that is not valid UTF-8);
- ``entry-from-our-view``: a status entry as our side must build it for a claim the
  kubelet line lists nowhere (``claim-name-fallback``): each device of the entry's claim
  that the driver's prepare returned (of its request, a sub-request counting as its
  parent, if the entry names one; a repeated resourceID once; sorted by resourceID, as we
  write them), under its first CDI ID or ``<driver>/<pool>/<device>``, with the health
  and message our cache reads at that sync point, which the ``devices`` comparison holds
  against the kubelet's own ``getHealthInfo``.

The compared device is the subject (kind ``devices``) or the field's ``resource <id>``
(kind ``status``). Each rule has a unit test in ``test_scenario_language.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from tests.conformance import _scenario as sc

MESSAGE_MAX = 1024
ELLIPSIS = "..."

DeviceView = Mapping[tuple[str, str, str], tuple[str, str]]


@dataclasses.dataclass(frozen=True)
class Comparison:
    """What a rule may read: the comparison and the run it belongs to."""

    scenario: sc.Scenario
    kind: str
    at: str
    subject: str
    field: str
    our_view: DeviceView = dataclasses.field(default_factory=dict)
    """Our cache's (health, message) per device at this sync point."""


def cut_at_character(message: str) -> str:
    """Our cut: a message over the limit keeps the whole characters of its first 1,021
    bytes."""
    raw = message.encode()
    if len(raw) <= MESSAGE_MAX:
        return message
    return raw[: MESSAGE_MAX - len(ELLIPSIS)].decode(errors="ignore") + ELLIPSIS


def cut_bytes(message: str) -> str:
    """The kubelet's cut as its JSON shows it: the first 1,021 bytes, one U+FFFD for each
    byte that is not part of a whole character."""
    raw = message.encode()
    if len(raw) <= MESSAGE_MAX:
        return message
    head = raw[: MESSAGE_MAX - len(ELLIPSIS)].decode(errors="surrogateescape")
    # surrogateescape turns each stray byte into one lone surrogate: one U+FFFD per byte,
    # as Go's encoding/json writes it (Python's "replace" writes one per broken sequence).
    return "".join("\ufffd" if "\udc80" <= ch <= "\udcff" else ch for ch in head) + ELLIPSIS


def resource_id(dev: sc.AllocatedDevice) -> str:
    """A device's resourceID in a status entry: its first CDI ID, else
    ``<driver>/<pool>/<device>``."""
    return dev.cdi[0] if dev.cdi else f"{dev.driver}/{dev.pool}/{dev.device}"


def device_of(scenario: sc.Scenario, kind: str, subject: str, field: str) -> tuple[str, str, str]:
    """The (driver, pool, device) a comparison is about: the subject of a ``devices``
    comparison, the resource a status field names (by its resourceID)."""
    if kind == "devices":
        driver, pool, device = subject.rsplit("/", 2)
        return driver, pool, device
    _, found, rest = field.partition(" resource ")
    if not found:
        raise ValueError(f"{field!r} names no resource")
    rid = rest.rsplit(" ", 1)[0]
    for claim in scenario.claims:
        for dev in claim.devices:
            if resource_id(dev) == rid:
                return dev.driver, dev.pool, dev.device
    driver, pool, device = rid.rsplit("/", 2)
    return driver, pool, device


def reported_message(scenario: sc.Scenario, at: str, key: tuple[str, str, str]) -> str:
    """The message last reported for ``key`` before sync point ``at``."""
    message = ""
    for step in scenario.timeline:
        args = step.args
        if isinstance(args, sc.Sync) and args.name == at:
            return message
        if isinstance(args, sc.Report) and args.driver == key[0]:
            for report in args.devices:
                for d in report.expand():
                    if (d["pool"], d["device"]) == key[1:]:
                        message = str(d["message"])
    raise ValueError(f"no sync point {at!r} in {scenario.name}")


def _message_rule(cut: Callable[[str], str]) -> Callable[[Comparison], Any]:
    def rule(c: Comparison) -> Any:
        key = device_of(c.scenario, c.kind, c.subject, c.field)
        return cut(reported_message(c.scenario, c.at, key))

    return rule


def entry_from_our_view(c: Comparison) -> Any:
    """The resources of the compared entry (field ``entry claim:<ref>[/<request>]``)."""
    entry = c.field.removeprefix("entry ")
    ref, _, request = entry.removeprefix("claim:").partition("/")
    pod_name = c.subject.split()[1]
    claim = c.scenario.claim(
        next(r.claim for r in c.scenario.pod(pod_name).claims if r.name == ref)
    )
    out: list[dict[str, str]] = []
    seen: set[str] = set()
    for dev in claim.devices:
        if not dev.returned:
            continue
        names = dev.request_names if dev.request_names is not None else (dev.request,)
        if request and not any(n.split("/")[0] == request.split("/")[0] for n in names):
            continue  # a sub-request counts as its parent
        rid = resource_id(dev)
        if rid in seen:
            continue
        seen.add(rid)
        health, message = c.our_view.get((dev.driver, dev.pool, dev.device), ("Unknown", ""))
        resource = {"resourceID": rid, "health": health}
        if message:
            resource["message"] = message
        out.append(resource)
    return sorted(out, key=lambda r: r["resourceID"])


RULES: dict[str, Callable[[Comparison], Any]] = {
    "message-cut-at-character": _message_rule(cut_at_character),
    "message-cut-bytes": _message_rule(cut_bytes),
    "entry-from-our-view": entry_from_our_view,
}
