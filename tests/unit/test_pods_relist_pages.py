"""A relist reads the node's pods a page at a time (``kube.pods.NodePods._relist``).

Why it pages (docs/memory.md): a relist is the sidecar's largest burst of short-lived
objects, and what a burst leaves alive pins the allocator's pages. So the check that
matters is that a page is dead before the next one is decoded: the fake API hands out
each page as a ``dict`` subclass (which takes a weak reference) and, when asked for the
next page, looks whether the one before is still alive. The real HTTP paging (limit,
continue, one snapshot) is in ``tests/integration/test_kube_sources.py``.
"""

from __future__ import annotations

import weakref
from typing import Any

import pytest

from kubelet_dra.clock import FakeClock
from kubelet_dra.kube import api as kube_api
from kubelet_dra.kube import pods as kube_pods
from kubelet_dra.status import claims


class _Page(dict[str, Any]):
    """A list answer that can be watched dying."""


class _Writer:
    def __init__(self) -> None:
        self.updated: list[str] = []
        self.deleted: list[str] = []

    def pod_updated(self, pod: Any) -> None:
        self.updated.append(pod["metadata"]["uid"])

    def pod_deleted(self, uid: str) -> None:
        self.deleted.append(uid)


def _pod(uid: str, rv: str = "1") -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "name": uid, "namespace": "default", "resourceVersion": rv},
        "spec": {"nodeName": "n0"},
    }


class _Api:
    """Serves ``uids`` in pages of the asked size; records each call's (limit, token)."""

    def __init__(self, uids: list[str]) -> None:
        self.uids = uids
        self.calls: list[tuple[int, str]] = []
        self.before: weakref.ref[_Page] | None = None
        self.alive_at_next: list[bool] = []
        self.expire: set[str] = set()  # continue tokens the server answers 410 to, once

    def list_node_pods(self, node: str, *, limit: int = 0, token: str = "") -> _Page:
        self.calls.append((limit, token))
        if token and token in self.expire:
            self.expire.discard(token)
            raise kube_api.Gone("list pods: HTTP 410 the continue token is too old", status=410)
        if token:
            assert self.before is not None
            self.alive_at_next.append(self.before() is not None)
        start = int(token or 0)
        end = start + limit if limit else len(self.uids)
        page = _Page(
            items=[_pod(uid) for uid in self.uids[start:end]],
            metadata={"resourceVersion": "7", "continue": str(end) if end < len(self.uids) else ""},
        )
        self.before = weakref.ref(page)
        return page


def _node_pods(api: _Api, writer: _Writer, page_size: int) -> kube_pods.NodePods:
    return kube_pods.NodePods(
        api=api,  # type: ignore[arg-type]
        node_name="n0",
        index=claims.ClaimIndex(),
        writer=writer,  # type: ignore[arg-type]
        clock=FakeClock(),
        page_size=page_size,
    )


async def test_each_page_is_dead_before_the_next_is_read() -> None:
    api = _Api([f"u{n}" for n in range(25)])
    pods = _node_pods(api, _Writer(), page_size=10)
    assert await pods._relist() == "7"
    assert api.calls == [(10, ""), (10, "10"), (10, "20")]
    assert api.alive_at_next == [False, False]
    assert all(pods.get(f"u{n}") is not None for n in range(25)) and pods.pods_synced


async def test_a_relist_drops_the_pods_no_page_named_and_keeps_the_rest() -> None:
    api = _Api([f"u{n}" for n in range(25)])
    writer = _Writer()
    pods = _node_pods(api, writer, page_size=10)
    await pods._relist()
    api.uids = [uid for uid in api.uids if uid not in ("u3", "u14", "u24")]
    writer.updated.clear()
    await pods._relist()
    assert sorted(writer.deleted) == ["u14", "u24", "u3"]
    # Same resourceVersion: the pods held are kept, nothing is planned again.
    assert writer.updated == []
    assert [uid for uid in (f"u{n}" for n in range(25)) if pods.get(uid) is None] == [
        "u3", "u14", "u24",
    ]  # fmt: skip


async def test_page_size_zero_lists_in_one_answer() -> None:
    api = _Api([f"u{n}" for n in range(25)])
    pods = _node_pods(api, _Writer(), page_size=0)
    await pods._relist()
    assert api.calls == [(0, "")]
    assert all(pods.get(f"u{n}") is not None for n in range(25))


async def test_a_snapshot_expired_between_pages_is_listed_again_in_one_answer() -> None:
    api = _Api([f"u{n}" for n in range(25)])
    writer = _Writer()
    pods = _node_pods(api, writer, page_size=10)
    await pods._relist()
    api.uids = api.uids[:5] + api.uids[6:]  # u5 goes while the next relist runs
    api.expire = {"20"}
    await pods._relist()
    assert api.calls[3:] == [(10, ""), (10, "10"), (10, "20"), (0, "")]
    assert writer.deleted == ["u5"]
    assert all(pods.get(uid) is not None for uid in api.uids) and pods.get("u5") is None


async def test_a_410_on_the_first_page_is_the_callers_to_handle() -> None:
    class _Expired(_Api):
        def list_node_pods(self, node: str, *, limit: int = 0, token: str = "") -> _Page:
            raise kube_api.Gone("list pods: HTTP 410", status=410)

    pods = _node_pods(_Expired([]), _Writer(), page_size=10)
    with pytest.raises(kube_api.Gone):
        await pods._relist()
