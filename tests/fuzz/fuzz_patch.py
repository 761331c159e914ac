"""Fuzz target: the FakeApiServer's patch engines (``kubelet_dra.testing.fakeapi._patch``).

They stand in for the kube-apiserver's patch handler
(``apiserver/pkg/endpoints/handlers/patch.go``: evanphx/json-patch for
RFC 6902 and RFC 7386, ``apimachinery/pkg/util/strategicpatch``). For each of
the three patch types, on any JSON document and patch:

- a patch that cannot be applied raises ``PatchError`` with a 400 or 422
  code (what the real server answers), nothing else;
- neither the stored object nor the patch is changed in place;
- the result is plain JSON that shares no list or object with the inputs
  (a later patch of the stored object must not change the request's body);
- a merge patch applied twice gives what it gave once (RFC 7386 is
  idempotent), and a JSON patch's ``test`` of the whole result holds.

Input: a JSON document, ``\\0``, a JSON patch; the first byte picks the type.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from tests.fuzz import _harness

with _harness.instrumented(__name__ == "__main__"):
    from kubelet_dra.testing.fakeapi import _patch as patching

_ENGINES = (patching.merge_patch, patching.json_patch, patching.strategic_merge_patch)


def _containers(value: Any, found: set[int]) -> set[int]:
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict | list):
            found.add(id(node))
            stack.extend(node.values() if isinstance(node, dict) else node)
    return found


def _decode(raw: bytes) -> Any:
    value = json.loads(raw)
    if _harness.depth(value) > _harness.MAX_JSON_DEPTH:
        raise ValueError("too deep")
    return value


def test_one(data: bytes) -> None:
    if not data:
        return
    head, _, tail = data[1:].partition(b"\0")
    try:
        doc, patch = _decode(head), _decode(tail)
    except (ValueError, RecursionError):
        return
    engine = _ENGINES[data[0] % len(_ENGINES)]
    before = (copy.deepcopy(doc), copy.deepcopy(patch))
    try:
        result = engine(doc, patch)
    except patching.PatchError as exc:
        assert exc.code in (400, 422), exc.code
        assert (doc, patch) == before, "a refused patch changed its inputs"
        return
    assert (doc, patch) == before, "a patch changed its inputs"
    assert json.loads(json.dumps(result)) == result
    shared = _containers(result, set()) & _containers(doc, _containers(patch, set()))
    assert not shared, "the result shares a list or an object with the inputs"
    if engine is patching.merge_patch:
        assert patching.merge_patch(result, patch) == result
    if engine is patching.json_patch:
        assert patching.json_patch(result, [{"op": "test", "path": "", "value": result}]) == result


if __name__ == "__main__":
    _harness.main(test_one, __file__)
