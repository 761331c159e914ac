"""Injected time: the one place the pipeline asks what time it is or waits.

The kubelet reads ``time.Now()`` inside ``healthinfo.go``, so its tests had to
rewrite internal timestamps to make a lease run out. Here every component takes
a :class:`Clock`; tests pass a :class:`FakeClock` and advance it, so leases,
deadlines and backoff are tested without sleeping.

Times are Unix seconds (``float``): leases survive restarts, so they must be
wall-clock times that mean the same thing to the next process.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Any, Protocol


class Clock(Protocol):
    """What the pipeline needs from time."""

    def now(self) -> float:
        """Current wall-clock time in Unix seconds."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time."""
        ...


class Alarm:
    """A wake-up flag that the injected clock can also set: the one "wait until a time or
    until woken" of the pipeline (the status writer's loop, the lease deadline task and the
    taint bridge's reconcile loop each hold one).

    :meth:`set` wakes now; :meth:`arm` sets the flag ``delay`` seconds of the clock from
    now (re-armable: an earlier time already armed stays, it rings first and the caller
    arms again for what is left); :meth:`sleep` waits for whichever comes first and leaves
    no timer behind. Clearing the flag is the caller's, where its loop reads it.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._flag = asyncio.Event()
        self._timer: asyncio.Task[None] | None = None
        self._at = 0.0

    def set(self) -> None:
        self._flag.set()

    def clear(self) -> None:
        self._flag.clear()

    def is_set(self) -> bool:
        return self._flag.is_set()

    async def wait(self) -> None:
        """Until the flag is set (by :meth:`set` or an armed time)."""
        await self._flag.wait()

    def arm(self, delay: float) -> None:
        """Set the flag in ``delay`` seconds of the clock (an earlier armed time stays)."""
        at = self._clock.now() + delay
        if self._timer is not None and not self._timer.done():
            if self._at <= at:
                return
            self._timer.cancel()
        self._at = at
        self._timer = asyncio.ensure_future(self._ring(delay))

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def sleep(self, delay: float | None) -> None:
        """Wait ``delay`` seconds (``None``: no limit) or until set, whichever is first."""
        if delay is not None:
            self.arm(delay)
        try:
            await self._flag.wait()
        finally:
            self.disarm()

    async def aclose(self) -> None:
        """Cancel an armed time and wait until its timer has finished."""
        timer, self._timer = self._timer, None
        await cancel_and_wait(timer)

    async def _ring(self, delay: float) -> None:
        await self._clock.sleep(delay)
        self._flag.set()


async def cancel_and_wait(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel ``tasks`` (``None`` entries skipped) and wait until each has finished.

    Their results and errors are dropped: the one way a component stops its own tasks.
    """
    live = [task for task in tasks if task is not None]
    for task in live:
        task.cancel()
    if live:
        await asyncio.gather(*live, return_exceptions=True)


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class FakeClock:
    """A clock that moves only when a test calls :meth:`advance`.

    ``sleep`` parks the caller until the clock has been advanced past its
    wake-up time, so code that waits for a deadline can be driven
    deterministically. ``sleepers`` lets a test wait until the code under test
    is actually parked before advancing.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._waiters: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self.sleep_calls: list[float] = []

    def now(self) -> float:
        return self._now

    @property
    def sleepers(self) -> int:
        return sum(1 for _, _, fut in self._waiters if not fut.done())

    async def sleep(self, seconds: float) -> None:
        self.sleep_calls.append(seconds)
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (self._now + seconds, next(self._seq), fut))
        await fut

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper whose time has come."""
        self._now += seconds
        while self._waiters and self._waiters[0][0] <= self._now:
            _, _, fut = heapq.heappop(self._waiters)
            if not fut.done():
                fut.set_result(None)

    async def wait_for_sleepers(self, count: int = 1, *, timeout: float = 5.0) -> None:
        """Yield to the loop until at least ``count`` tasks sleep on this clock."""
        deadline = time.monotonic() + timeout
        while self.sleepers < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"expected {count} sleepers, have {self.sleepers}")
            await asyncio.sleep(0.001)
