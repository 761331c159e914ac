"""API requests under one QPS/burst limit, retried while the failure is transient.

Part of ``kube``. Kubelet counterparts: client-go's token bucket rate limiter
(``util/flowcontrol``), which every kubelet request passes (here only the writes
do: status PATCHes, Events and the taint bridge's rules), and the retries
its status manager makes. Retries run through tenacity on the injected clock,
with jitter from an injected ``random.Random``; which failures are retried is
``api.is_transient``'s rule (5xx, 429, lost connections), and a server's
``Retry-After`` wins over the backoff.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import random
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import tenacity

from kubelet_dra import clock as clock_mod
from kubelet_dra import errors
from kubelet_dra.kube import api as kube_api


class TokenBucket:
    """QPS/burst limiter on the injected clock (client-go's token bucket), two classes.

    Ordinary requests (status writes, DeviceTaintRule writes; pod lists and claim
    reads only when ``NodePods`` is given the bucket, which the manager does not)
    queue in FIFO order. ``acquire(spare=True)`` (Events) takes a token only when no ordinary
    request is waiting and more than half the burst would be left: Events use
    what the status writes leave, so Events never delay the status they
    describe, and under a sustained stream of changes they wait until it
    calms down (the kubelet's
    client shares one bucket between both, which is what made our latency
    with ``write_window=0`` 17 times its floor when changes came faster than
    the QPS).
    """

    def __init__(self, *, qps: float, burst: int, clock: clock_mod.Clock) -> None:
        self.qps, self.burst = qps, burst
        self._clock = clock
        self._tokens = float(burst)
        self._stamp = clock.now()
        self._lock = asyncio.Lock()
        self._spare_lock = asyncio.Lock()
        self._waiting = 0  # ordinary requests waiting for or holding the lock
        self._idle = asyncio.Event()  # set while no ordinary request waits
        self._idle.set()
        self._reserve = burst // 2  # tokens Events leave for status writes

    async def acquire(self, *, spare: bool = False) -> None:
        """Take one token, waiting (on the injected clock) until one is there.

        ``spare``: also wait until no ordinary request is waiting.
        """
        if spare:
            await self._acquire_spare()
            return
        self._waiting += 1
        self._idle.clear()
        try:
            async with self._lock:
                self._refill()
                while self._tokens < 1:
                    await self._clock.sleep((1 - self._tokens) / self.qps)
                    self._refill()
                self._tokens -= 1
        finally:
            self._waiting -= 1
            if not self._waiting:
                self._idle.set()

    async def _acquire_spare(self) -> None:
        async with self._spare_lock:
            while True:
                if self._waiting:
                    await self._idle.wait()
                    continue
                self._refill()
                if self._tokens >= 1 + self._reserve:
                    self._tokens -= 1
                    return
                # Look again when enough tokens will have come; an ordinary
                # request arriving meanwhile takes them first.
                await self._clock.sleep((1 + self._reserve - self._tokens) / self.qps)

    def _refill(self) -> None:
        now = self._clock.now()
        self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.qps)
        self._stamp = now


class Counts(Protocol):
    """Where requests and retries are counted (the writer's ``WriterStats``)."""

    requests: int
    results: collections.Counter[str]


RETRY_AFTER_SPREAD = 0.25
"""A retry after a ``Retry-After`` waits that long plus up to this fraction more."""


class RetryingCaller:
    """Runs ``Api`` calls, each under the limiter, with retries.

    A blocking call runs in a worker thread, a coroutine function on the loop
    (the status PATCH, ``Api.json_patch_pod_status_async``). The first attempt
    is made without building tenacity's retry state: nearly every call
    succeeds at once, and that set-up was a tenth of a status write's time on
    the event loop. A transient failure goes on under tenacity with
    the same attempts, backoff and counts.
    """

    def __init__(
        self,
        *,
        limiter: TokenBucket,
        clock: clock_mod.Clock,
        counts: Counts,
        max_attempts: int = 5,
        rng: random.Random | None = None,
    ) -> None:
        self._limiter, self._clock, self._counts = limiter, clock, counts
        self._max_attempts = max_attempts
        self._rng = rng or random.Random()

    async def call(
        self,
        fn: Callable[..., dict[str, Any]] | Callable[..., Awaitable[dict[str, Any]]],
        *args: Any,
        spare: bool = False,
    ) -> dict[str, Any]:
        """``fn(*args)``, retried while it fails transiently, up to ``max_attempts`` times.

        ``spare``: take only tokens no ordinary request waits for (Events).
        """
        try:
            return await self._attempt(fn, args, spare)
        except Exception as exc:
            if self._max_attempts <= 1 or not kube_api.is_transient(exc):
                raise
            delay = self._delay(exc, 1)
            errors.drop_frames(exc)  # the first failure is dropped here: no cycle left
        self._counts.results["retried"] += 1
        await self._clock.sleep(delay)
        try:
            return await self._retry(fn, args, spare)
        except Exception as exc:
            # tenacity's retry state holds the outcome, whose traceback holds the
            # frames that hold the retry state: a cycle per failed round, unless the
            # finished frames let go of it (errors.drop_frames).
            errors.drop_frames(exc)
            raise

    async def _retry(
        self, fn: Callable[..., Any], args: tuple[Any, ...], spare: bool
    ) -> dict[str, Any]:
        """The attempts after the first, under tenacity."""
        retrying = tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception(kube_api.is_transient),
            wait=self._wait,
            stop=tenacity.stop_after_attempt(self._max_attempts - 1),
            sleep=self._clock.sleep,
            before_sleep=self._count_retry,
            reraise=True,
        )
        try:
            answer: dict[str, Any] = await retrying(self._attempt, fn, args, spare)
            return answer
        finally:
            # The retrying object keeps its next actions, bound methods of itself: a
            # cycle the collector alone would free. Dropping them frees it at once.
            retrying.iter_state.reset()

    async def _attempt(
        self, fn: Callable[..., Any], args: tuple[Any, ...], spare: bool
    ) -> dict[str, Any]:
        await self._limiter.acquire(spare=spare)
        self._counts.requests += 1
        answer: dict[str, Any]
        if inspect.iscoroutinefunction(fn):
            answer = await fn(*args)
        else:
            answer = await asyncio.to_thread(fn, *args)
        return answer

    def _wait(self, state: tenacity.RetryCallState) -> float:
        # tenacity counts from the second attempt (the first was made above).
        exc = state.outcome.exception() if state.outcome else None
        return self._delay(exc, state.attempt_number + 1)

    def _delay(self, exc: BaseException | None, attempt: int) -> float:
        retry_after = getattr(exc, "retry_after", None)
        if retry_after is not None:
            # Never sooner than the server asked, and up to a quarter later: every node
            # refused in one burst gets the same Retry-After (APF's grows to 32 s),
            # and retrying exactly on it brings them back in lockstep (seen in the fleet
            # benchmark with APF on). client-go waits exactly Retry-After.
            return float(retry_after) * (1.0 + RETRY_AFTER_SPREAD * self._rng.random())
        return float(min(5.0, 0.1 * 2 ** (attempt - 1)) * self._rng.uniform(0.5, 1.0))

    def _count_retry(self, state: tenacity.RetryCallState) -> None:
        self._counts.results["retried"] += 1
