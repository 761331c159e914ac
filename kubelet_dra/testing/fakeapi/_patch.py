"""Patch engines of the fake API server: JSON patch, JSON merge patch, strategic merge patch.

Mimics the kube-apiserver's patch handler (``apiserver/pkg/endpoints/handlers/patch.go``), which
uses evanphx/json-patch for RFC 6902 and RFC 7386 and ``apimachinery/pkg/util/strategicpatch``
for strategic merge patches. The strategic merge schema here covers the pod and pod-status
fields a kubelet-like client touches; lists without a known merge key are replaced whole,
which is what the real server does for ``+listType=atomic`` lists such as
``status.containerStatuses``. JSON pointers are resolved by the package's own
``kubelet_dra.status.jsonpointer``, the one the status writer uses.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from kubelet_dra.status import jsonpointer

JSON = Any

# Merge keys taken from the ``patchMergeKey`` struct tags of core/v1 (and meta/v1 for metadata).
# A path element "[]" stands for "any item of the list above". Lists not named here are atomic.
_MERGE_KEYS: dict[tuple[str, ...], str] = {
    ("status", "conditions"): "type",
    ("status", "resourceClaimStatuses"): "name",
    ("status", "podIPs"): "ip",
    ("status", "hostIPs"): "ip",
    ("metadata", "ownerReferences"): "uid",
    ("spec", "containers"): "name",
    ("spec", "initContainers"): "name",
    ("spec", "ephemeralContainers"): "name",
    ("spec", "volumes"): "name",
    ("spec", "resourceClaims"): "name",
    ("spec", "containers", "[]", "env"): "name",
    ("spec", "containers", "[]", "ports"): "containerPort",
    ("spec", "containers", "[]", "volumeMounts"): "mountPath",
    ("spec", "containers", "[]", "resources", "claims"): "name",
}
# Primitive lists with ``patchStrategy=merge``: the patch adds to the set.
_PRIMITIVE_MERGE: frozenset[tuple[str, ...]] = frozenset({("metadata", "finalizers")})

_DIRECTIVE = "$patch"
_SET_ORDER = "$setElementOrder/"
_DELETE_PRIMITIVE = "$deleteFromPrimitiveList/"
_RETAIN_KEYS = "$retainKeys"


class PatchError(Exception):
    """A patch that cannot be applied; ``code`` is the HTTP status the real server answers."""

    def __init__(self, message: str, *, code: int) -> None:
        super().__init__(message)
        self.code = code


# --- RFC 7386 JSON merge patch -------------------------------------------------------------


def merge_patch(target: JSON, patch: JSON) -> JSON:
    """Apply an RFC 7386 merge patch; a non-object patch replaces the target."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# --- RFC 6902 JSON patch ---------------------------------------------------------------------


def json_patch(doc: JSON, ops: JSON) -> JSON:
    """Apply RFC 6902 operations; errors carry the real server's codes (400 decode, 422 apply)."""
    if not isinstance(ops, list):
        raise PatchError(
            "json: cannot unmarshal object into Go value of type []jsonpatch.Operation", code=400
        )
    result = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or not isinstance(op.get("op"), str):
            raise PatchError("invalid JSON patch operation", code=400)
        result = _apply_op(result, op)
    return result


_MISSING = jsonpointer.MISSING
_child = jsonpointer.child


def _missing(op: str, path: Any) -> PatchError:
    # evanphx/json-patch wording, which the apiserver passes through.
    return PatchError(
        f'{op} operation does not apply: doc is missing path: "{path}": missing value', code=422
    )


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str):
        raise PatchError(f"invalid JSON pointer: {path!r}", code=400)
    try:
        return jsonpointer.parse(path)
    except ValueError as exc:
        raise PatchError(str(exc), code=400) from exc


def _parent(doc: JSON, parts: list[str], op: str, path: str) -> JSON:
    node = jsonpointer.walk(doc, parts[:-1])
    if node is _MISSING:
        raise _missing(op, path)
    return node


def _get(doc: JSON, path: Any, op: str) -> JSON:
    node = jsonpointer.walk(doc, _pointer(path))
    if node is _MISSING:
        raise _missing(op, path)
    return node


def _remove(doc: JSON, path: Any, op: str) -> JSON:
    parts = _pointer(path)
    if not parts:  # the root has no parent to remove it from (evanphx: missing path)
        raise _missing(op, path)
    parent = _parent(doc, parts, op, path)
    value = _child(parent, parts[-1])
    if value is _MISSING:
        raise _missing(op, path)
    if isinstance(parent, dict):
        del parent[parts[-1]]
    else:
        del parent[int(parts[-1])]
    return value


def _add(doc: JSON, path: Any, value: JSON, op: str) -> JSON:
    parts = _pointer(path)
    if not parts:
        return copy.deepcopy(value)
    parent = _parent(doc, parts, op, path)
    key = parts[-1]
    if isinstance(parent, dict):
        parent[key] = copy.deepcopy(value)
    elif isinstance(parent, list) and (key == "-" or (key.isdigit() and int(key) <= len(parent))):
        index = len(parent) if key == "-" else int(key)
        parent.insert(index, copy.deepcopy(value))
    else:
        raise _missing(op, path)
    return doc


def _apply_op(doc: JSON, op: dict[str, Any]) -> JSON:
    kind, path = op["op"], op.get("path")
    if kind == "add":
        return _add(doc, path, op.get("value"), "add")
    if kind == "remove":
        _remove(doc, path, "remove")
        return doc
    if kind == "replace":
        _get(doc, path, "replace")
        if _pointer(path):
            _remove(doc, path, "replace")
        return _add(doc, path, op.get("value"), "replace")
    if kind == "move":
        return _add(doc, path, _remove(doc, op.get("from"), "move"), "move")
    if kind == "copy":
        return _add(doc, path, _get(doc, op.get("from"), "copy"), "copy")
    if kind == "test":
        # evanphx/json-patch wording, which the apiserver passes through as the cause message.
        if not _json_equal(_get(doc, path, "test"), op.get("value")):
            raise PatchError(f"testing value {path} failed: test failed", code=422)
        return doc
    raise PatchError(f"Unexpected kind: {kind}", code=422)


def _json_equal(a: JSON, b: JSON) -> bool:
    # Python's == says True == 1; JSON does not.
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


# --- strategic merge patch -------------------------------------------------------------------


def strategic_merge_patch(target: JSON, patch: JSON) -> JSON:
    """Apply a strategic merge patch with the pod schema above."""
    if not isinstance(patch, dict):
        raise PatchError("strategic merge patch must be a JSON object", code=400)
    base = target if isinstance(target, dict) else {}
    merged = _merge_map(base, patch, ())
    return {} if merged is None else merged


def _merge_map(original: dict[str, Any], patch: dict[str, Any], path: tuple[str, ...]) -> Any:
    directive = patch.get(_DIRECTIVE)
    if directive == "delete":
        return None
    body = {k: v for k, v in patch.items() if k != _DIRECTIVE}
    if directive == "replace":
        return _strip_directives(body)
    result = copy.deepcopy(original)
    for key, value in body.items():
        if key.startswith(_SET_ORDER) or key == _RETAIN_KEYS:
            continue
        if key.startswith(_DELETE_PRIMITIVE):
            name = key[len(_DELETE_PRIMITIVE) :]
            doomed = value if isinstance(value, list) else []
            result[name] = [v for v in result.get(name) or [] if v not in doomed]
            continue
        _merge_key(result, key, value, (*path, key))
    _apply_set_orders(result, body, path)
    retain = body.get(_RETAIN_KEYS)
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_key(result: dict[str, Any], key: str, value: Any, path: tuple[str, ...]) -> None:
    if value is None:
        result.pop(key, None)
        return
    current = result.get(key)
    if isinstance(value, dict) and isinstance(current, dict):
        merged = _merge_map(current, value, path)
    elif isinstance(value, dict):
        merged = _merge_map({}, value, path) if value.get(_DIRECTIVE) != "delete" else None
    elif isinstance(value, list):
        merged = _merge_list(current if isinstance(current, list) else [], value, path)
    else:
        merged = copy.deepcopy(value)
    if merged is None:
        result.pop(key, None)
    else:
        result[key] = merged


def _merge_list(original: list[Any], patch: list[Any], path: tuple[str, ...]) -> list[Any]:
    merge_key = _MERGE_KEYS.get(path)
    if path in _PRIMITIVE_MERGE:
        return copy.deepcopy(original + [v for v in patch if v not in original])
    if merge_key is None:
        return _strip_directives(patch)  # type: ignore[no-any-return]
    if any(isinstance(p, dict) and p.get(_DIRECTIVE) == "replace" for p in patch):
        return [_strip_directives(p) for p in patch if not _is_directive_only(p)]
    result = copy.deepcopy(original)
    for item in patch:
        _merge_list_item(result, item, merge_key, (*path, "[]"))
    return result


def _merge_list_item(result: list[Any], item: Any, merge_key: str, path: tuple[str, ...]) -> None:
    if not isinstance(item, dict) or merge_key not in item:
        raise PatchError(f"map: {item} does not contain declared merge key: {merge_key}", code=400)
    index = next(
        (
            i
            for i, old in enumerate(result)
            if isinstance(old, dict) and old.get(merge_key) == item[merge_key]
        ),
        None,
    )
    if item.get(_DIRECTIVE) == "delete":
        if index is not None:
            del result[index]
        return
    if index is None:
        result.append(_strip_directives(item))
    else:
        result[index] = _merge_map(result[index], item, path)


def _apply_set_orders(result: dict[str, Any], body: dict[str, Any], path: tuple[str, ...]) -> None:
    # Approximates strategicpatch's ordering: listed elements first, in the listed order.
    for key, order in body.items():
        if not key.startswith(_SET_ORDER) or not isinstance(order, list):
            continue
        name = key[len(_SET_ORDER) :]
        items = result.get(name)
        if not isinstance(items, list):
            continue
        merge_key = _MERGE_KEYS.get((*path, name))
        ids = [o.get(merge_key) if merge_key and isinstance(o, dict) else o for o in order]

        def rank(item: Any, ids: list[Any] = ids, merge_key: str | None = merge_key) -> int:
            ident = item.get(merge_key) if merge_key and isinstance(item, dict) else item
            return ids.index(ident) if ident in ids else len(ids)

        result[name] = sorted(items, key=rank)


def _is_directive_only(item: Any) -> bool:
    return isinstance(item, dict) and set(item) == {_DIRECTIVE}


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value if not _is_directive_only(v)]
    return copy.deepcopy(value)
