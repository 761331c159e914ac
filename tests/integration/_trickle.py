"""A unix-socket proxy that passes a server's answers one byte at a time (issue 22).

No kubelet counterpart: a hostile neighbour for tests. What the client sends
goes through at once; what the server sends comes back ``every`` seconds a
byte, after the first ``free`` bytes (so a test can let the HTTP/2 handshake
through and trickle the stream, or trickle from the first byte).
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
from collections.abc import AsyncIterator


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


async def _trickle(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, every: float, free: int
) -> None:
    sent = 0
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            for i in range(len(data)):
                writer.write(data[i : i + 1])
                await writer.drain()
                sent += 1
                if sent > free:
                    await asyncio.sleep(every)
    writer.close()


@contextlib.asynccontextmanager
async def trickle_proxy(
    listen: pathlib.Path, upstream: pathlib.Path, *, every: float = 1.0, free: int = 0
) -> AsyncIterator[list[int]]:
    """Serve ``listen``; yields a list that gets one entry per connection accepted."""
    connections: list[int] = []
    tasks: set[asyncio.Task[None]] = set()
    writers: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections))
        writers.append(writer)
        up_reader, up_writer = await asyncio.open_unix_connection(str(upstream))
        writers.append(up_writer)
        both = [
            asyncio.create_task(_pump(reader, up_writer)),
            asyncio.create_task(_trickle(up_reader, writer, every, free)),
        ]
        tasks.update(both)
        await asyncio.gather(*both, return_exceptions=True)

    server = await asyncio.start_unix_server(handle, str(listen))
    try:
        yield connections
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for writer in writers:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        await server.wait_closed()
