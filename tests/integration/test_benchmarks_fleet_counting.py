"""The fleet benchmark's byte counts and its kubelet baseline's content type (issue 20).

``benchmarks/_fleetnode.py`` counts the request bodies a node sends on both of its ways
(urllib3 for the official client's calls, ``kube/asyncpatch.py`` for the status PATCH);
a way it does not count would make our bytes per change look smaller than they are.
Checked here against the API stand-in through ``kube.Api``, as a fleet node sends.
``benchmarks.fleet.protobuf_pod_meta`` is how the kubelet baseline shows it was answered
in protobuf (the kubelet's default content type): it reads a pod's name, uid and
resourceVersion from the apiserver's protobuf envelope and refuses anything else.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import urllib3.connectionpool

from benchmarks import _common as c
from benchmarks import _fleetnode, fleet
from kubelet_dra.kube import api as kube_api
from kubelet_dra.kube import asyncpatch
from kubelet_dra.testing import fakeapi


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """``_fleetnode.count_request_bytes`` installed for one test, undone after it."""
    pool = urllib3.connectionpool.HTTPConnectionPool
    monkeypatch.setattr(pool, "urlopen", pool.urlopen)
    monkeypatch.setattr(asyncpatch.Transport, "_send", asyncpatch.Transport._send)
    found = [0, 0]
    monkeypatch.setattr(_fleetnode, "_SENT_BYTES", found)
    _fleetnode.count_request_bytes()
    return found


def _ops(uid: str, value: str) -> list[dict[str, str]]:
    return [
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "add", "path": "/status/message", "value": value},
    ]


async def test_a_nodes_bytes_count_the_event_loop_patch_and_the_official_client(
    counted: list[int],
) -> None:
    with fakeapi.FakeApiServer() as server:
        uid = server.create_pod(fakeapi.make_pod("p1", "node-1"))["metadata"]["uid"]
        client = server.api_client()
        api = kube_api.Api(client)
        try:
            # The stand-in is plain HTTP: the status PATCH goes through asyncpatch.
            assert api._async_transport() is not None
            fast, slow = _ops(uid, "a" * 500), _ops(uid, "b" * 300)
            await api.json_patch_pod_status_async("default", "p1", fast)
            assert counted == [len(json.dumps(fast)), 1]  # the asyncpatch path
            await asyncio.to_thread(api.json_patch_pod_status, "default", "p1", slow)
            assert counted == [len(json.dumps(fast)) + len(json.dumps(slow)), 2]  # urllib3
        finally:
            await api.aclose()
            client.close()
    patches = [r for r in server.requests if r.is_status_write]
    assert len(patches) == 2 and all(r.status == 200 for r in patches)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes | int) -> bytes:
    if isinstance(payload, int):
        return _varint(number << 3) + _varint(payload)
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def test_the_kubelet_baseline_reads_its_pod_from_protobuf_and_refuses_json() -> None:
    meta = _field(1, b"p1") + _field(5, b"uid-1") + _field(6, b"4217") + _field(7, 3)
    pod = _field(1, meta) + _field(2, _field(1, b"x" * 200))  # metadata, a spec
    type_meta = _field(1, b"v1") + _field(2, b"Pod")
    answer = fleet.PROTOBUF_MAGIC + _field(1, type_meta) + _field(2, pod) + _field(4, b"")
    assert fleet.protobuf_pod_meta(answer) == ("p1", "uid-1", "4217")
    as_json = json.dumps({"kind": "Pod", "metadata": {"name": "p1"}}).encode()
    with pytest.raises(c.CheckFailed, match="not answered in protobuf"):
        fleet.protobuf_pod_meta(as_json)
