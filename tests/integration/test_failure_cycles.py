"""A failed API call leaves nothing for the garbage collector (``errors.drop_frames``).

In an API outage every failed request used to leave a reference cycle (exception,
traceback, frames, a local holding the exception) and every retry round a second one
(tenacity's retrying object and its retry state). Until the periodic collection
freed them, memory allocated meanwhile landed beside them in CPython's arenas,
which then outlived the outage (docs/memory.md). These tests fail requests through
the official client against a real socket that closes each connection, with the
collector off, and count what a collection then finds unreachable: nothing.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import os
import socket
import struct
import threading
import traceback
import types
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import kubernetes.client
import pytest

from kubelet_dra import clock, errors
from kubelet_dra.kube import api as kube_api
from kubelet_dra.kube import calls

FAILURES = 10


@contextlib.contextmanager
def _closing_server(*, reset: bool = False) -> Iterator[str]:
    """An HTTP address whose server reads each request and closes without answering
    (``reset``: with a TCP reset, as a server killed mid-request does)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)
                if reset:
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        server.close()


@contextlib.asynccontextmanager
async def _async_api(*, async_patch: bool, reset: bool) -> AsyncIterator[kube_api.Api]:
    with _api(async_patch=async_patch, reset=reset) as api:
        try:
            yield api
        finally:
            await api.aclose()


@contextlib.contextmanager
def _api(*, async_patch: bool = False, reset: bool = False) -> Iterator[kube_api.Api]:
    with _closing_server(reset=reset) as host:
        config = kubernetes.client.Configuration()
        config.host = host
        client = kube_api._client(config)
        try:
            yield kube_api.Api(client, async_patch=async_patch)
        finally:
            client.close()


@contextlib.contextmanager
def _left_in_cycles() -> Iterator[collections.Counter[str]]:
    """With the collector off in the block: the types of the objects it left in cycles."""
    found: collections.Counter[str] = collections.Counter()
    gc.collect()
    gc.disable()
    try:
        yield found
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        found.update(type(o).__name__ for o in gc.garbage)
        found.update(
            f"frame in {_owner(o.f_code.co_filename)}"
            for o in gc.garbage
            if isinstance(o, types.FrameType)
        )
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def _owner(filename: str) -> str:
    for owner in ("kubelet_dra", "tenacity", "urllib3", "asyncio"):
        if f"{os.sep}{owner}{os.sep}" in filename:
            return owner
    return "other"


def _fails(call: Callable[[], Any]) -> Callable[[], None]:
    def fail() -> None:
        with pytest.raises(kube_api.CallError, match="connection lost"):
            call()

    return fail


def _watch(api: kube_api.Api) -> None:
    for _ in api.watch_node_pods("node-a", "1", timeout=5, on_open=lambda _: None):
        pass


@pytest.mark.parametrize("verb", ["list", "get", "patch", "watch"])
def test_a_call_that_fails_leaves_no_cycle(verb: str) -> None:
    with _api() as api:
        fail = _fails(
            {
                "list": lambda: api.list_node_pods("node-a"),
                "get": lambda: api.get_claim("ns", "claim"),
                "patch": lambda: api.json_patch_pod_status("ns", "pod", []),
                "watch": lambda: _watch(api),
            }[verb]
        )
        fail()  # the first call fills the client's and the interpreter's caches
        with _left_in_cycles() as found:
            for _ in range(FAILURES):
                fail()
    assert found == {}


class _Counts:
    def __init__(self) -> None:
        self.requests = 0
        self.results: collections.Counter[str] = collections.Counter()


@pytest.mark.parametrize("ending", ["close", "reset"])
@pytest.mark.parametrize("path", ["thread", "event-loop"])
async def test_a_call_retried_until_it_gives_up_leaves_no_cycle(path: str, ending: str) -> None:
    """Through a worker thread (a claim GET) and on the loop (the status PATCH)."""
    fake = clock.FakeClock()

    async def no_wait(seconds: float) -> None:
        fake.advance(seconds)

    fake.sleep = no_wait  # type: ignore[method-assign]
    counts = _Counts()
    caller = calls.RetryingCaller(
        limiter=calls.TokenBucket(qps=1e6, burst=10**6, clock=fake),
        clock=fake,
        counts=counts,
        max_attempts=3,
    )

    async def fail() -> None:
        call = (
            caller.call(api.get_claim, "ns", "claim")
            if path == "thread"
            else caller.call(api.json_patch_pod_status_async, "ns", "pod", [])
        )
        with pytest.raises(kube_api.CallError, match="connection lost"):
            await call

    async with _async_api(async_patch=path == "event-loop", reset=ending == "reset") as api:
        await fail()
        with _left_in_cycles() as found:
            for _ in range(FAILURES):
                await fail()
            await asyncio.sleep(0)  # the loop's close callbacks (connection_lost) run
    assert counts.requests == 3 * (FAILURES + 1), "each call made its three attempts"
    if path == "event-loop":
        # What is left is asyncio's own: a closed socket transport keeps a bound
        # method of itself (CPython's selector transport), one per connection, a few
        # hundred bytes with its closed socket; and now and then a reset that arrives
        # while asyncio reads for itself stays in its own frames with the stream it
        # fails. The periodic collection frees both. No frame of ours, tenacity's or
        # urllib3's, and no exception of ours, may be among them.
        assert found["_SelectorSocketTransport"] <= counts.requests
        ours = {"frame in kubelet_dra", "frame in tenacity", "frame in urllib3", "frame in other"}
        ours |= {"CallError", "TransportError", "_Closed", "RetryError", "AsyncRetrying"}
        assert not ours & set(found), found
        return
    assert found == {}


def test_drop_frames_frees_a_cycle_through_a_frame_and_keeps_the_lines() -> None:
    def fails() -> None:
        mine: list[object] = [0] * 100
        try:
            raise ValueError("deep")
        except ValueError as exc:
            mine.append(exc)  # the exception now reaches itself through this frame
            raise RuntimeError("outer") from exc

    gc.collect()
    gc.disable()
    try:
        with pytest.raises(RuntimeError) as caught:
            fails()
        errors.drop_frames(caught.value)
        cause = caught.value.__cause__
        assert cause is not None
        names = [frame.name for frame in traceback.extract_tb(cause.__traceback__)]
        del caught, cause
        assert gc.collect() == 0
    finally:
        gc.enable()
    assert names == ["fails"], "the traceback still names the line"
