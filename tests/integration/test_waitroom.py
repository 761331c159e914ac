"""The metrics port's waiting room (``kubelet_dra.waitroom``) on real socket pairs.

Deadlines run on an injected clock: a connection's time is up when the clock says so,
whatever the real time, and one that sent a byte leaves for ``ready`` at once. ~0 s.
"""

from __future__ import annotations

import queue
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from kubelet_dra.testing import eventually_sync
from kubelet_dra.waitroom import WaitingRoom


class _Room:
    def __init__(self) -> None:
        self.now = 0.0
        self.out: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.room = WaitingRoom(
            0.5,
            ready=lambda sock, address: self.out.put(("ready", address)),
            idle=lambda sock, address: self.out.put(("idle", address)),
            drop=lambda sock, address: self.out.put(("drop", address)),
            clock=lambda: self.now,
        )

    def next(self) -> tuple[str, Any]:
        return self.out.get(timeout=10)


@pytest.fixture
def room() -> Iterator[_Room]:
    r = _Room()
    r.room.start()
    yield r
    r.room.close()


def _pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair()


def test_a_connection_leaves_when_it_sends_and_is_let_go_when_its_time_is_up(
    room: _Room,
) -> None:
    a_server, a_client = _pair()
    b_server, b_client = _pair()
    room.room.add(a_server, "a")
    eventually_sync(lambda: room.room.waiting() == 1, timeout=10)  # a's deadline is 0.5
    room.now = 0.6  # past a's deadline (0.5); adding b wakes the room to see it
    room.room.add(b_server, "b")
    assert room.next() == ("idle", "a")
    assert room.out.empty() and room.room.waiting() == 1  # b's time runs to 1.1
    b_client.send(b"G")
    assert room.next() == ("ready", "b")
    assert room.room.waiting() == 0
    for s in (a_server, a_client, b_server, b_client):
        s.close()


def test_closing_the_room_drops_what_waits_and_refuses_what_comes_after() -> None:
    r = _Room()
    r.room.start()
    server, client = _pair()
    r.room.add(server, "waiting")
    r.room.close()
    assert r.next() == ("drop", "waiting")
    late, late_client = _pair()
    r.room.add(late, "late")
    assert r.next() == ("drop", "late")
    for s in (server, client, late, late_client):
        s.close()
