"""Output of ``kubectl dra-health``: kubectl-style tables, the JSON/YAML documents, describe.

Tables look like ``kubectl get``: upper-case headers, columns three spaces apart, ``<none>``
for an empty cell. In ``table`` output a message is cut at 60 characters; ``wide`` shows it
whole and adds columns. JSON and YAML print the documents of ``_model`` unchanged.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml

from kubelet_dra.kubectl import _model as model
from kubelet_dra.status import claims as claims_mod
from kubelet_dra.status import podstatus

NONE = "<none>"
MESSAGE_WIDTH = 60
PODS_SHOWN = 3
EVENTS_SHOWN = 10


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "") -> str:
    cells = [list(headers)] + [[c or NONE for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [c.ljust(w) for c, w in zip(row[:-1], widths[:-1], strict=True)] + [row[-1]]
        lines.append(indent + "   ".join(padded).rstrip())
    return "\n".join(lines) + "\n"


def document(doc: tuple[Mapping[str, Any], Iterable[Mapping[str, Any]]], output: str) -> str:
    """A list document (head, items) as JSON or YAML.

    JSON is the text of ``json.dumps(..., indent=2)``, built one item at a time: 80,000 items
    as one structure, then as one ``json.dumps`` chunk list, took 250 MB more.
    """
    head, items = doc
    if output == "json":
        text = json.dumps({**head, "items": []}, indent=2)
        parts = [json.dumps(item, indent=2).replace("\n", "\n    ") for item in items]
        if not parts:
            return text + "\n"
        return text[: text.rindex("[]")] + "[\n    " + ",\n    ".join(parts) + "\n  ]\n}\n"
    whole = {**head, "items": list(items)}
    return str(yaml.safe_dump(whole, sort_keys=False, default_flow_style=False))


def _cut(text: str, wide: bool) -> str:
    text = " ".join(text.split())  # messages may hold newlines; a table row may not
    if wide or len(text) <= MESSAGE_WIDTH:
        return text
    return text[: MESSAGE_WIDTH - 3] + "..."


def _pods_cell(uses: Sequence[model.PodUse], wide: bool) -> str:
    names = list(dict.fromkeys(f"{u.namespace}/{u.name}" for u in uses))
    if wide or len(names) <= PODS_SHOWN:
        return ",".join(names)
    return ",".join(names[:PODS_SHOWN]) + f" +{len(names) - PODS_SHOWN} more"


def _taint(t: model.Taint) -> str:
    return f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}"


def devices_table(rows: Sequence[model.DeviceRow], wide: bool) -> str:
    headers = ["NODE", "DRIVER", "POOL", "DEVICE", "RESOURCE ID", "HEALTH", "MESSAGE", "PODS"]
    if wide:
        headers += ["TAINTS", "CLAIMS"]
    body = []
    for r in rows:
        driver, pool, device = r.device or ("", "", "")
        cells = [
            r.node, driver, pool, device, r.resource_id, r.health, _cut(r.message, wide),
            _pods_cell(r.pods, wide),
        ]  # fmt: skip
        if wide:
            cells += [",".join(_taint(t) for t in r.taints), ",".join(r.claims)]
        body.append(cells)
    return table(headers, body)


def condition_cell(condition: model.Condition | None) -> str:
    if condition is None:
        return ""
    return f"{condition.status}/{condition.reason}" if condition.reason else condition.status


def pods_table(rows: Sequence[model.PodRow], wide: bool) -> str:
    headers = ["NAMESPACE", "POD", "CONTAINER", "CLAIM", "RESOURCE ID", "HEALTH", "MESSAGE"]
    headers += ["CONDITION"] + (["NODE"] if wide else [])
    body = []
    for r in rows:
        cells = [
            r.namespace, r.name, r.container, r.claim, r.resource_id, r.health,
            _cut(r.message, wide), condition_cell(r.condition),
        ]  # fmt: skip
        body.append(cells + ([r.node] if wide else []))
    return table(headers, body)


# -- describe ----------------------------------------------------------------------------------


def describe(
    pod: Mapping[str, Any],
    view: model.PodView,
    results: Mapping[claims_mod.ClaimKey, Sequence[model.Result]],
    events: Sequence[Mapping[str, Any]],
    *,
    condition_type: str,
    now: float,
) -> str:
    lines = [
        f"Name:         {view.name}",
        f"Namespace:    {view.namespace}",
        f"Node:         {view.node or NONE}",
    ]
    lines += _condition_lines(condition_type, view.condition, now)
    lines.append("Device health:")
    lines += _containers(pod, view, results) or ["  <no containers with claims or device health>"]
    lines.append("Events:")
    lines += _events(events, now)
    return "\n".join(lines) + "\n"


def _condition_lines(kind: str, condition: model.Condition | None, now: float) -> list[str]:
    label = f"Condition:    {kind or NONE}"
    if condition is None:
        return [f"{label}  {NONE}"]
    line = f"{label}={condition.status}"
    if condition.reason:
        line += f" ({condition.reason})"
    if condition.last_transition:
        line += f", since {condition.last_transition} ({_age(condition.last_transition, now)} ago)"
    out = [line]
    if condition.message:
        out.append(f"              {condition.message}")
    return out


def _containers(
    pod: Mapping[str, Any],
    view: model.PodView,
    results: Mapping[claims_mod.ClaimKey, Sequence[model.Result]],
) -> list[str]:
    entries: dict[str, dict[str, list[model.Resource]]] = {}
    for cc in claims_mod.container_claims(pod):
        entries.setdefault(cc.container, {})[podstatus.status_name(cc.ref, cc.request)] = []
    for res in view.resources:
        entries.setdefault(res.container, {}).setdefault(res.entry, []).append(res)
    lines: list[str] = []
    for container, by_entry in entries.items():
        lines.append(f"  Container {container}:")
        for entry, resources in by_entry.items():
            claim = view.claim_of(entry)
            what = f"ResourceClaim {claim.name}" if claim else "not a resolved claim"
            lines.append(f"    {entry} ({what}):")
            if not resources:
                lines.append("      <no health reported>")
                continue
            rows = []
            for res in resources:
                device = model.resolve(
                    res.resource_id, res.entry, results.get(claim, ()) if claim else (), view
                )
                rows.append([
                    res.resource_id, res.health, _device_cell(device, res.resource_id, view),
                    " ".join(res.message.split()),
                ])  # fmt: skip
            lines.append(
                table(["RESOURCE ID", "HEALTH", "DEVICE", "MESSAGE"], rows, "      ").rstrip("\n")
            )
    return lines


def _events(events: Sequence[Mapping[str, Any]], now: float) -> list[str]:
    if not events:
        return ["  <none>"]
    ordered = sorted(events, key=_event_time)[-EVENTS_SHOWN:]
    rows = []
    for e in ordered:
        source = (e.get("source") or {}).get("component") or e.get("reportingComponent") or ""
        stamp = _event_time(e)
        rows.append([
            str(e.get("type") or ""), str(e.get("reason") or ""),
            _age(stamp, now) if stamp else "", str(e.get("count") or 1), str(source),
            " ".join(str(e.get("message") or "").split()),
        ])  # fmt: skip
    return table(["TYPE", "REASON", "AGE", "COUNT", "FROM", "MESSAGE"], rows, "  ").splitlines()


def _event_time(event: Mapping[str, Any]) -> str:
    return str(
        event.get("lastTimestamp")
        or event.get("eventTime")
        or event.get("firstTimestamp")
        or (event.get("metadata") or {}).get("creationTimestamp")
        or ""
    )


def _age(stamp: str, now: float) -> str:
    """kubectl's short age: 45s, 12m, 3h, 2d."""
    try:
        when = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return "?"
    seconds = max(0, int(now - when))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size or (unit == "m" and seconds >= 120):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _device_cell(device: model.DeviceId | None, resource_id: str, view: model.PodView) -> str:
    """``describe``'s DEVICE column: the device, or why there is none."""
    if device is not None:
        return "/".join(device)
    if resource_id in view.shared:
        return "<shared by several devices>"
    return "<unresolved>"
