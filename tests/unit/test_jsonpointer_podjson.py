"""The shared JSON pointer resolution and the pod JSON accessors."""

from __future__ import annotations

import pytest

from kubelet_dra.status import jsonpointer, podjson

DOC = {"a/b": {"m~n": [10, {"x": None}]}, "list": ["zero"]}


@pytest.mark.parametrize(
    ("pointer", "value"),
    [
        ("", DOC),
        ("/a~1b/m~0n/0", 10),
        ("/a~1b/m~0n/1/x", None),  # present and null is not missing
        ("/list/0", "zero"),
    ],
)
def test_resolve_finds_values(pointer: str, value: object) -> None:
    assert jsonpointer.resolve(DOC, pointer) == value


@pytest.mark.parametrize(
    "pointer",
    ["/list/1", "/list/-1", "/list/-", "/list/²", "/nope", "/list/0/deeper", "no-slash"],
)
def test_resolve_says_missing(pointer: str) -> None:
    assert jsonpointer.resolve(DOC, pointer) is jsonpointer.MISSING


def test_parse_unescapes_and_refuses_a_relative_pointer() -> None:
    assert jsonpointer.parse("/a~1b/~01") == ["a/b", "~1"]
    with pytest.raises(ValueError, match="invalid JSON pointer"):
        jsonpointer.parse("a/b")


def test_pod_accessors_give_zero_values_for_missing_or_null_parts() -> None:
    bare: dict[str, object] = {"metadata": None, "spec": None}
    assert podjson.uid(bare) == "" and podjson.name(bare) == ""
    assert podjson.namespace(bare) == "default"
    assert podjson.node_name(bare) == "" and podjson.phase(bare) == ""
    assert podjson.resource_claims(bare) == () and podjson.resource_version_number(bare) == 0
    pod = {
        "metadata": {"uid": "u", "name": "p", "namespace": "ns", "resourceVersion": "17"},
        "spec": {"nodeName": "n", "resourceClaims": [{"name": "gpu"}]},
        "status": {"phase": "Running", "resourceClaimStatuses": [{"name": "gpu"}]},
    }
    assert (podjson.uid(pod), podjson.name(pod), podjson.namespace(pod)) == ("u", "p", "ns")
    assert podjson.resource_version_number(pod) == 17 and podjson.node_name(pod) == "n"
    assert podjson.find_named(podjson.resource_claims(pod), "gpu") == {"name": "gpu"}
    assert podjson.find_named(podjson.resource_claim_statuses(pod), "other") is None
    assert podjson.resource_version_number({"metadata": {"resourceVersion": "abc"}}) == 0
