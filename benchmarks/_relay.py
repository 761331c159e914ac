"""The latency scenario's same-topology floor: a bare relay process.

``python -m benchmarks._relay`` opens the health stream to a driver's socket
(``grpc.aio``, as the sidecar does) and, for every report it receives, sends one
pre-built status PATCH over a kept-alive ``http.client`` connection to the API
stand-in, alternating between the bodies it was given (the benchmark gives two of
the writer's full form and size, each valid after the other). No cache, no claims, no
status computation: what is left is the path the sidecar's reports travel
(driver process → this process → API stand-in process), with the same two
process crossings, the same gRPC stack and a request of the writer's size.

It prints ``ready`` (one line) once the connection to the stand-in is open and
the stream has been asked for; the benchmark waits for the driver to see the
stream. It runs until the stream ends or it is terminated.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import pathlib
import sys
from collections.abc import Sequence

import grpc

from kubelet_dra._proto.dra_health.v1 import api_pb2 as pb
from kubelet_dra._proto.dra_health.v1 import api_pb2_grpc as pb_grpc


async def relay(
    socket: str, host: str, port: int, path: str, bodies: list[bytes], token: str
) -> int:
    headers = {
        "Content-Type": "application/json-patch+json",
        "Authorization": f"Bearer {token}",
        "Accept": "application/json",
    }
    conn = http.client.HTTPConnection(host, port)
    conn.connect()
    sent = 0
    async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
        call = pb_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            pb.NodeWatchResourcesRequest()
        )
        print("ready", flush=True)
        async for _report in call:
            # Blocking on purpose: nothing else runs here, and it is the floor's client.
            conn.request("PATCH", path, bodies[sent % len(bodies)], headers)
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                print(f"PATCH answered {response.status}", file=sys.stderr, flush=True)
                return 1
            sent += 1
    conn.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks._relay")
    parser.add_argument("--socket", required=True, help="the driver's DRA socket")
    parser.add_argument("--api", required=True, help="host:port of the API stand-in")
    parser.add_argument("--path", required=True, help="the status PATCH's path and query")
    parser.add_argument("--bodies", required=True, help="a JSON file: a list of request bodies")
    args = parser.parse_args(argv)
    bodies = [b.encode() for b in json.loads(pathlib.Path(args.bodies).read_text())]
    token = sys.stdin.readline().strip()  # not on the command line, where ps shows it
    host, _, port = args.api.rpartition(":")
    try:
        return asyncio.run(relay(args.socket, host, int(port), args.path, bodies, token))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
