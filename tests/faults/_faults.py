"""Helpers of the fault-injection suite: round counts, the cluster, pod checks, leak counts.

Round counts: every fault test is parametrized with a ``short`` version (the
default run and CI) and a ``long`` one marked ``slow``. The long version's
rounds come from ``KUBELET_DRA_FAULT_ROUNDS`` (default :data:`LONG_ROUNDS`),
and the API outage of the long version from ``KUBELET_DRA_FAULT_OUTAGE``
seconds (default 60).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import pathlib
import random
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from kubelet_dra import manager, models, settings
from kubelet_dra.state import store
from kubelet_dra.testing import FakeApiServer, FakeDriver, eventually, make_claim, make_pod
from tests.integration._sidecar_process import pod_health, settings_for

__all__ = [
    "DRIVER",
    "NODE",
    "World",
    "add_pod",
    "converged",
    "fd_kinds",
    "manager_settings",
    "open_fds",
    "pod_health",
    "resource_id",
    "stored_records",
    "task_names",
    "unknown_writes",
    "versions",
    "writes_per_pod",
]

DRIVER = "gpu.example.com"
NODE = "node-1"
LONG_ROUNDS = 50


def long_rounds(default: int = LONG_ROUNDS) -> int:
    return int(os.environ.get("KUBELET_DRA_FAULT_ROUNDS", str(default)))


def versions(short: int, *, per_round: float = 5.0, long: int | None = None) -> list[Any]:
    """``short`` and ``long`` round counts as pytest params (``long`` marked slow).

    Each gets a timeout of 60 s plus ``per_round`` seconds a round.
    """
    many = long if long is not None else long_rounds()
    return [
        pytest.param(short, id="short", marks=pytest.mark.timeout(60 + per_round * short)),
        pytest.param(
            many,
            id="long",
            marks=[pytest.mark.slow, pytest.mark.timeout(60 + per_round * many)],
        ),
    ]


def device(
    index: int, health: str = "Healthy", message: str = "", timeout: int = 0
) -> dict[str, Any]:
    return {
        "pool": "pool",
        "device": f"gpu-{index}",
        "health": health,
        "message": message,
        "timeout_seconds": timeout,
    }


def resource_id(index: int) -> str:
    return f"{DRIVER}/pool/gpu-{index}"


def add_pod(api: FakeApiServer, name: str, index: int) -> None:
    """A pod on our node with one claim holding device ``gpu-<index>``."""
    api.create_claim(make_claim(f"claim-{name}", results=[(DRIVER, "pool", f"gpu-{index}", "gpu")]))
    api.create_pod(make_pod(name, NODE, claims=[f"claim-{name}"]))


class World:
    """What the driver reports and which pod holds which device: the expected pod status."""

    def __init__(self, devices: int, rng: random.Random) -> None:
        self.rng = rng
        self.health = {i: ("Healthy", "") for i in range(devices)}
        self.pods: dict[str, int] = {}

    def reports(self, timeout: int = 0) -> list[dict[str, Any]]:
        return [device(i, h, m, timeout) for i, (h, m) in sorted(self.health.items())]

    def mutate(self, count: int | None = None) -> None:
        chosen = self.rng.sample(
            sorted(self.health), count or self.rng.randint(1, len(self.health))
        )
        for i in chosen:
            if self.rng.random() < 0.5:
                self.health[i] = ("Healthy", "")
            else:
                self.health[i] = ("Unhealthy", f"XID {self.rng.randint(1, 200)} ✗")

    def expected_health(self, index: int) -> tuple[str, str]:
        return self.health[index]

    def expected(self, pod: str) -> dict[str, tuple[str, str]]:
        health, message = self.health[self.pods[pod]]
        return {resource_id(self.pods[pod]): (health, message)}

    def wrong_pods(self, api: FakeApiServer) -> dict[str, Any]:
        """Pods whose status differs from what the driver reports (empty when converged)."""
        wrong = {}
        for pod in self.pods:
            seen = pod_health(api, pod)
            if seen != self.expected(pod):
                wrong[pod] = seen
        return wrong

    def converged(self, api: FakeApiServer) -> bool:
        """For ``eventually``: true once no pod is wrong; until then it says which are."""
        wrong = self.wrong_pods(api)
        assert not wrong, f"pods not yet as reported (resourceID -> health, message): {wrong}"
        return True


def unknown_writes(api: FakeApiServer, since: float = 0.0) -> list[str]:
    """Accepted status writes (after ``since``) after which the pod gave a resource ``Unknown``.

    Read from the pod as the stand-in stored it after each write
    (``RequestRecord.stored``), so a JSON patch, a merge patch and a whole
    object all count, whatever the body's shape. An accepted write without a
    stored pod is an error here, never skipped.
    """
    found = []
    for record in api.status_writes():
        if record.timestamp < since or not 200 <= record.status < 300:
            continue
        if not isinstance(record.stored, dict):
            raise AssertionError(f"accepted status write without the stored pod: {record.path}")
        for resource in _unknown_resources(record.stored):
            found.append(f"{record.path}: {resource}")
    return found


def _unknown_resources(pod: dict[str, Any]) -> list[str]:
    status = pod.get("status") or {}
    return [
        str(resource.get("resourceID"))
        for field in ("initContainerStatuses", "containerStatuses")
        for container in status.get(field) or []
        for entry in container.get("allocatedResourcesStatus") or []
        for resource in entry.get("resources") or []
        if resource.get("health") == "Unknown"
    ]


def stored_records(state_dir: pathlib.Path) -> dict[str, models.DeviceHealth]:
    """Device name -> record in the sidecar's state file.

    Read as a restarted sidecar loads it (committed rows, the WAL included),
    through a store that is not open for writing: the file stays as the kill
    left it for the next sidecar.
    """
    reader = store.HealthStore(state_dir / store.FILE_NAME, db=None)
    return {key.device: record for key, record in reader.load()}


def writes_per_pod(api: FakeApiServer) -> dict[str, int]:
    counts: dict[str, int] = {}
    for record in api.status_writes():
        name = record.path.rsplit("/", 2)[-2]
        counts[name] = counts.get(name, 0) + 1
    return counts


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def fd_kinds() -> collections.Counter[str]:
    """Open descriptors by kind: ``tcp``, ``unix``, ``anon_inode:[eventfd]``, ``pipe``, ``file``.

    Kinds, not numbers: a closed descriptor's number is reused at once, so two
    listings compared by number show churn, not leaks.
    """
    tcp = _socket_inodes("tcp") | _socket_inodes("tcp6")
    unix = _socket_inodes("unix")
    kinds: collections.Counter[str] = collections.Counter()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed between the listing and the read
            continue
        kinds[_kind(target, tcp, unix)] += 1
    return kinds


def _kind(target: str, tcp: set[str], unix: set[str]) -> str:
    if target in tcp:
        return "tcp"
    if target in unix:
        return "unix"
    if target.startswith("socket:"):
        return "socket"  # neither TCP nor unix (netlink, UDP, ...)
    if target.startswith("anon_inode:"):
        return target
    return "pipe" if target.startswith("pipe:") else "file"


def _socket_inodes(table: str) -> set[str]:
    try:
        lines = pathlib.Path(f"/proc/net/{table}").read_text().splitlines()[1:]
    except OSError:
        return set()
    column = 6 if table == "unix" else 9  # the inode column of each table
    return {f"socket:[{row[column]}]" for row in map(str.split, lines) if len(row) > column}


def task_names() -> list[str]:
    return sorted(t.get_name() for t in asyncio.all_tasks() if not t.done())


def manager_settings(sockdir: pathlib.Path, api: FakeApiServer, **extra: Any) -> settings.Settings:
    """In-process pipeline settings, with quick registration retries for restart rounds."""
    quick = {
        "stream_backoff_max": 0.3,
        "get_info_timeout": 0.5,
        "registration_backoff_initial": 0.1,
        "registration_backoff_max": 0.5,
    }
    return settings_for(sockdir, api, **{**quick, **extra})


@contextlib.asynccontextmanager
async def converged(
    api: FakeApiServer, sockdir: pathlib.Path, world: World
) -> AsyncIterator[tuple[FakeDriver, manager.DRAHealthManager]]:
    """A driver reporting ``world`` and a manager on ``api``, once every pod shows it."""
    async with (
        FakeDriver(name=DRIVER, registry=sockdir / "reg") as driver,
        manager.DRAHealthManager(manager_settings(sockdir, api)) as mgr,
    ):
        await driver.set_health(*world.reports())
        await eventually(lambda: world.converged(api), what="first convergence", timeout=15)
        yield driver, mgr


def names(prefix: str, count: int) -> Sequence[str]:
    return [f"{prefix}-{i}" for i in range(count)]
