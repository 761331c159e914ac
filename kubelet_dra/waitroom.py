"""The metrics port's waiting room: accepted connections that have not sent a byte yet.

No kubelet file mirrors this: the kubelet serves its ports with Go's ``net/http``, where an
idle connection costs a parked goroutine of a few kilobytes. ``http.server`` costs a thread
per connection, and starting a thousand threads on a loaded node takes seconds, during which
a scrape waits its turn. So a connection gets a thread only once it has something to read:
until then one thread watches every waiting connection with the OS selector (epoll), and
closes those that send nothing within the timeout. :class:`WaitingRoom` has its callbacks.
"""

from __future__ import annotations

import collections
import contextlib
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

Callback = Callable[[socket.socket, Any], None]


class WaitingRoom:
    """Hold accepted sockets on one thread until each is readable or its time is up."""

    def __init__(
        self,
        timeout: float,
        *,
        ready: Callback,
        idle: Callback,
        drop: Callback,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout = timeout
        self._ready, self._idle, self._drop = ready, idle, drop
        self._clock = clock
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._lock = threading.Lock()
        self._incoming: list[tuple[socket.socket, Any]] = []
        # Deadlines are the connect time plus one fixed timeout, so arrival order is deadline
        # order and a deque is the heap; a connection that left for a thread stays in it
        # until its deadline comes round and is skipped then.
        self._deadlines: collections.deque[tuple[float, socket.socket]] = collections.deque()
        self._waiting: dict[socket.socket, Any] = {}
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="metrics-waiting", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def add(self, sock: socket.socket, address: Any) -> None:
        """Hand over an accepted socket (any thread); the room owns it from now."""
        with self._lock:
            if self._closed:
                closed = True
            else:
                closed = False
                self._incoming.append((sock, address))
        if closed:
            self._drop(sock, address)
            return
        with contextlib.suppress(BlockingIOError):  # a full pipe is a wake-up already sent
            self._wake_w.send(b"\0")

    def waiting(self) -> int:
        """Connections in the room now (read from any thread; a moment old)."""
        return len(self._waiting)

    def close(self) -> None:
        """Stop the thread and drop every connection still waiting."""
        with self._lock:
            self._closed = True
        with contextlib.suppress(BlockingIOError):
            self._wake_w.send(b"\0")
        if self._thread.is_alive():
            self._thread.join()
        elif self._thread.ident is None:  # never started: nothing ran _shut
            self._shut()

    def _run(self) -> None:
        try:
            while not self._is_closed():
                for key, _ in self._selector.select(self._wait_for()):
                    if key.fileobj is self._wake_r:
                        self._take_incoming()
                    else:
                        self._leave(key.fileobj, self._ready)  # type: ignore[arg-type]
                self._expire()
        finally:
            self._shut()

    def _is_closed(self) -> bool:
        with self._lock:
            return self._closed

    def _wait_for(self) -> float | None:
        while self._deadlines and self._deadlines[0][1] not in self._waiting:
            self._deadlines.popleft()
        if not self._deadlines:
            return None
        return max(0.0, self._deadlines[0][0] - self._clock())

    def _take_incoming(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while self._wake_r.recv(4096):
                pass
        with self._lock:
            incoming, self._incoming = self._incoming, []
        deadline = self._clock() + self.timeout
        for sock, address in incoming:
            try:
                self._selector.register(sock, selectors.EVENT_READ)
            except (OSError, ValueError):  # closed by the peer's reset before we looked
                self._drop(sock, address)
                continue
            self._waiting[sock] = address
            self._deadlines.append((deadline, sock))

    def _expire(self) -> None:
        now = self._clock()
        while self._deadlines and self._deadlines[0][0] <= now:
            _, sock = self._deadlines.popleft()
            if sock in self._waiting:
                self._leave(sock, self._idle)

    def _leave(self, sock: socket.socket, then: Callback) -> None:
        address = self._waiting.pop(sock)
        self._selector.unregister(sock)
        then(sock, address)

    def _shut(self) -> None:
        with self._lock:
            incoming, self._incoming = self._incoming, []
        for sock, address in [*incoming, *self._waiting.items()]:
            self._waiting.pop(sock, None)
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(sock)
            self._drop(sock, address)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
