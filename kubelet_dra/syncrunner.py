"""``SyncRunner``: a manager on its own event-loop thread, for agents that are not async.

No kubelet counterpart (the kubelet is Go; its callers need no bridge). Every
call that touches the manager goes through :meth:`SyncRunner.call`, which runs
it on the manager's loop, so the manager itself stays single-threaded.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubelet_dra.manager import DRAHealthManager


class SyncRunner:
    """Run a manager on its own thread for agents that are not async.

    ``with SyncRunner(DRAHealthManager(...)) as runner: runner.call(fn)``;
    :meth:`call` runs a function (or awaits a coroutine) on the manager's loop
    and returns its result.
    """

    def __init__(self, manager: DRAHealthManager, *, timeout: float = 30.0) -> None:
        self.manager = manager
        self.timeout = timeout
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="kubelet-dra", daemon=True
        )

    def __enter__(self) -> SyncRunner:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start the loop's thread and the manager on it."""
        self._thread.start()
        self.call(self.manager.start)

    def stop(self) -> None:
        """Close the manager, then stop the loop and join its thread."""
        try:
            self.call(self.manager.close)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(self.timeout)

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the manager's loop (awaiting it if it is a coroutine)."""

        async def run() -> Any:
            result = fn(*args)
            if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                return await result
            return result

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(self.timeout)
