"""What the runner needs from a kubelet twin, and a client of the twin's protocol.

:class:`TwinLike` is the command set of ``PROTOCOL.md`` as async methods; every
method returns the reply object (``ok``, ``error`` and the op's fields).
:class:`ProcessTwin` runs a twin binary and speaks that protocol over its
stdin/stdout, so any binary that implements the protocol plugs in. How a
binary is built per kubelet line is the twin's business (``_twin``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

Reply = dict[str, Any]
_LINE_LIMIT = 512 * 1024 * 1024  # a checkpoint of 20,000 devices is several MB on one line


class TwinLike(Protocol):
    version: str

    async def start(self, state_dir: str, node_name: str) -> Reply: ...

    async def claims(self, claims: Sequence[Mapping[str, Any]]) -> Reply: ...

    async def register(self, driver: str, endpoint: str, services: Sequence[str]) -> Reply: ...

    async def deregister(self, driver: str, endpoint: str) -> Reply: ...

    async def prepare(self, pod: Mapping[str, Any]) -> Reply: ...

    async def unprepare(self, pod: Mapping[str, Any]) -> Reply: ...

    async def sync(
        self, pods: Sequence[Mapping[str, Any]], devices: Sequence[Sequence[str]] = ()
    ) -> Reply: ...

    async def pause_updates(self) -> Reply: ...

    async def state(self) -> Reply: ...

    async def stop(self) -> Reply: ...


class TwinCrashed(Exception):
    """The twin process died or answered something that is not the protocol."""


class TwinTimeout(TwinCrashed):
    """The twin did not answer within its timeout: on a loaded machine a matter of
    timing, not of what the kubelet computes (the runner retries it as such)."""


class ProcessTwin:
    """A twin binary driven over stdin/stdout (one JSON object per line each way)."""

    def __init__(
        self, binary: str | os.PathLike[str], *, args: Sequence[str] = (), timeout: float = 60.0
    ) -> None:
        self.binary = str(binary)
        self.args = tuple(args)
        self.timeout = timeout
        self.version = ""
        self._proc: asyncio.subprocess.Process | None = None
        self._stderr: asyncio.Task[bytes] | None = None
        self._lock = asyncio.Lock()

    async def _spawn(self) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            self.binary,
            *self.args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=_LINE_LIMIT,
        )
        assert self._proc.stderr is not None
        self._stderr = asyncio.create_task(self._proc.stderr.read())

    async def call(self, op: str, **fields: Any) -> Reply:
        async with self._lock:
            if self._proc is None:
                await self._spawn()
            proc = self._proc
            assert proc is not None and proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(json.dumps({"op": op, **fields}).encode() + b"\n")
                await proc.stdin.drain()
                line = await asyncio.wait_for(proc.stdout.readline(), self.timeout)
            except TimeoutError:
                raise TwinTimeout(f"{op}: no answer within {self.timeout}s") from None
            except ConnectionError as exc:
                raise TwinCrashed(
                    f"{op}: {type(exc).__name__} {await self.stderr_tail()}"
                ) from None
            if not line:
                raise TwinCrashed(f"{op}: the twin exited; stderr: {await self.stderr_tail()}")
            try:
                reply: Reply = json.loads(line)
            except ValueError:
                raise TwinCrashed(f"{op}: not a JSON reply: {line[:200]!r}") from None
            return reply

    async def stderr_tail(self, limit: int = 1500) -> str:
        if self._proc is None or self._stderr is None:
            return ""
        if self._proc.returncode is None:
            # Its stdout closed first: a crashing Go program is still writing its
            # goroutine dump to stderr. Wait for the exit, else the panic line is lost.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._proc.wait(), 5)
        if self._proc.returncode is None:
            return "(still running)"
        with contextlib.suppress(Exception):
            text = (await asyncio.wait_for(self._stderr, 5)).decode(errors="replace")
            # A Go panic's own line comes before its goroutine dump: keep it in front, so
            # a declaration can name the crash (the tail alone may have lost it).
            panic = next((ln for ln in text.splitlines() if ln.startswith("panic: ")), "")
            tail = text[-limit:]
            return f"{panic}\n{tail}" if panic and panic not in tail else tail
        return ""

    async def start(self, state_dir: str, node_name: str) -> Reply:
        reply = await self.call("start", stateDir=state_dir, nodeName=node_name)
        self.version = str(reply.get("version", ""))
        return reply

    async def claims(self, claims: Sequence[Mapping[str, Any]]) -> Reply:
        return await self.call("claims", claims=list(claims))

    async def register(self, driver: str, endpoint: str, services: Sequence[str]) -> Reply:
        return await self.call(
            "register", driver=driver, endpoint=endpoint, services=list(services)
        )

    async def deregister(self, driver: str, endpoint: str) -> Reply:
        return await self.call("deregister", driver=driver, endpoint=endpoint)

    async def prepare(self, pod: Mapping[str, Any]) -> Reply:
        return await self.call("prepare", pod=pod)

    async def unprepare(self, pod: Mapping[str, Any]) -> Reply:
        return await self.call("unprepare", pod=pod)

    async def sync(
        self, pods: Sequence[Mapping[str, Any]], devices: Sequence[Sequence[str]] = ()
    ) -> Reply:
        """Each pod's status and each of ``devices`` as the kubelet's getHealthInfo reads
        it (``devices`` in the reply, in the same order)."""
        return await self.call("sync", pods=list(pods), devices=[list(d) for d in devices])

    async def state(self) -> Reply:
        return await self.call("state")

    async def pause_updates(self) -> Reply:
        return await self.call("pause_updates")

    async def stop(self) -> Reply:
        try:
            return await self.call("stop")
        finally:
            await self.kill()

    async def kill(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                if proc.stdin is not None:
                    proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self._stderr is not None:
            self._stderr.cancel()
            await asyncio.gather(self._stderr, return_exceptions=True)
