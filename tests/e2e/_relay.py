"""A byte relay between a TCP address and a unix socket: the e2e kubelet's way to its API.

The e2e kubelet runs in a network namespace of its own (``_node.py``), so that what it does
to a network (kubelet 1.37's ``initNetworkUtil`` adds iptables chains and a DROP rule
wherever ``iptables`` exists) stays there. Its kube-apiserver listens on the host's
loopback. A unix socket is reachable from both namespaces, so two relays join them:

- on the host, ``--listen unix:PATH --connect tcp:127.0.0.1:PORT``;
- in the kubelet's namespace, ``--listen tcp:127.0.0.1:PORT --connect unix:PATH``, the same
  address and port as the server's, so the kubelet's kubeconfig (and the server
  certificate's ``127.0.0.1``) stay as they are.

Bytes pass unread (the kubelet's TLS ends at the kube-apiserver). ``--ready FILE`` is
written once the listener is up. It runs by path with the standard library only, because
the kubelet's namespace starts it from a shell (``python _relay.py ...``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def _endpoint(spec: str) -> tuple[str, str, int]:
    """``unix:PATH`` or ``tcp:HOST:PORT`` -> (kind, host or path, port)."""
    kind, _, rest = spec.partition(":")
    if kind == "unix" and rest:
        return kind, rest, 0
    host, _, port = rest.rpartition(":")
    if kind == "tcp" and host and port.isdigit():
        return kind, host, int(port)
    raise SystemExit(f"relay: not unix:PATH or tcp:HOST:PORT: {spec!r}")


def _connector(spec: str) -> Callable[[], Awaitable[Streams]]:
    kind, where, port = _endpoint(spec)
    if kind == "unix":
        return lambda: asyncio.open_unix_connection(where)
    return lambda: asyncio.open_connection(where, port)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()  # a half close passes through, as it would on one socket
    except OSError:
        writer.close()


async def _serve(connect: Callable[[], Awaitable[Streams]], inbound: Streams) -> None:
    in_reader, in_writer = inbound
    try:
        out_reader, out_writer = await connect()
    except OSError:
        in_writer.close()  # the server is down: the client sees a reset and retries
        return
    await asyncio.gather(_pump(in_reader, out_writer), _pump(out_reader, in_writer))
    for writer in (in_writer, out_writer):
        writer.close()


def _mark_ready(path: str) -> None:
    with open(path, "w") as out:
        out.write(f"{os.getpid()}\n")


async def _main(listen: str, connect: str, ready: str | None) -> None:
    dial = _connector(connect)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _serve(dial, (reader, writer))

    kind, where, port = _endpoint(listen)
    if kind == "unix":
        with contextlib.suppress(FileNotFoundError):
            os.unlink(where)
        server = await asyncio.start_unix_server(handle, where)
    else:
        server = await asyncio.start_server(handle, where, port, reuse_address=True)
    if ready:
        _mark_ready(ready)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="unix:PATH or tcp:HOST:PORT")
    parser.add_argument("--connect", required=True, help="unix:PATH or tcp:HOST:PORT")
    parser.add_argument("--ready", help="a file written once the listener is up")
    args = parser.parse_args(argv)
    asyncio.run(_main(args.listen, args.connect, args.ready))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
