"""Small synchronous gRPC helpers for talking to the interop driver over unix sockets with
the project's generated code (``kubelet_dra._proto``): a registration client and a health
stream reader that can wait for the next response with a timeout.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from kubelet_dra._proto.dra_health.v1 import api_pb2 as health_v1
from kubelet_dra._proto.dra_health.v1 import api_pb2_grpc as health_v1_grpc
from kubelet_dra._proto.dra_health.v1alpha1 import api_pb2 as health_v1alpha1
from kubelet_dra._proto.dra_health.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc

HEALTH_APIS: dict[str, tuple[ModuleType, ModuleType]] = {
    "v1": (health_v1, health_v1_grpc),
    "v1alpha1": (health_v1alpha1, health_v1alpha1_grpc),
}


def unix_channel(path: Path) -> grpc.Channel:
    return grpc.insecure_channel(f"unix://{path}")


class StreamEnded(Exception):
    """The health stream ended; ``code``/``details`` are its final gRPC status."""

    def __init__(self, code: grpc.StatusCode | None, details: str | None) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


_END = object()


class HealthStream:
    """One ``NodeWatchResources`` call read by a background thread into a queue."""

    def __init__(self, socket: Path, api: str) -> None:
        messages, stubs = HEALTH_APIS[api]
        self.api = api
        self.channel = unix_channel(socket)
        stub = stubs.DRAResourceHealthStub(self.channel)
        self.call: Any = stub.NodeWatchResources(messages.NodeWatchResourcesRequest())
        self._queue: queue.Queue[Any] = queue.Queue()
        self.code: grpc.StatusCode | None = None
        self.details: str | None = None
        self._thread = threading.Thread(target=self._pump, name=f"health-{api}", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        try:
            for response in self.call:
                self._queue.put(response)
        except grpc.RpcError as exc:
            self.code = exc.code()
            self.details = exc.details()
        else:
            self.code = grpc.StatusCode.OK
        self._queue.put(_END)

    def next(self, timeout: float = 5.0) -> Any:
        """The next response; raises StreamEnded when the stream ended, queue.Empty on timeout."""
        item = self._queue.get(timeout=timeout)
        if item is _END:
            self._queue.put(_END)
            raise StreamEnded(self.code, self.details)
        return item

    def drain(self) -> list[Any]:
        """Responses already received and not yet consumed."""
        out: list[Any] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return out
            if item is _END:
                self._queue.put(_END)
                return out
            out.append(item)

    def wait_end(self, timeout: float = 5.0) -> StreamEnded:
        """Skip responses until the stream ends; return its final status."""
        while True:
            try:
                self.next(timeout)
            except StreamEnded as end:
                return end

    def close(self) -> None:
        self.call.cancel()
        self._thread.join(5)
        self.channel.close()
