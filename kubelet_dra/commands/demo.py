"""``kubelet-dra-health demo``: the whole pipeline on one machine, scripted.

Starts the API stand-in with a few pods and claims, a fake DRA driver with a
handful of devices, and the manager (as the sidecar runs it), then plays a
short script: a device turns Unhealthy with a message, recovers, a lease runs
out while the driver is silent, the driver dies and comes back. After each
step it waits until the API shows the expected state and prints what a user
would see (``kubectl get pod -o yaml`` style). It ends with a summary and
exits 0 when every step was observed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import pathlib
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any, TextIO

import yaml

from kubelet_dra import manager, settings
from kubelet_dra.status import podstatus
from kubelet_dra.testing import fakeapi, fakedriver

DRIVER = "gpu.example.com"
NODE = "demo-node"
POOL = "demo-node"
CONDITION = "DeviceHealthy"


def add_parser(subparsers: Any) -> None:
    demo = subparsers.add_parser("demo", help="run the whole pipeline on this machine")
    demo.add_argument("--duration", type=float, default=20.0, help="seconds (default 20)")
    demo.add_argument("--devices", type=int, default=4, help="devices of the fake driver")
    demo.add_argument("--pods", type=int, default=3, help="pods using them")
    demo.set_defaults(handler=_cmd_demo)


def _cmd_demo(ns: argparse.Namespace) -> int:
    if ns.verbose:
        return asyncio.run(Demo(ns.duration, ns.devices, ns.pods).run())
    # The script narrates: the pipeline's logs (a driver's stream error when the
    # script kills it, say) would land between its tables. -v keeps them inline.
    log = LogFile()
    try:
        code = asyncio.run(Demo(ns.duration, ns.devices, ns.pods).run())
    finally:
        note = log.close()
    if note:
        sys.stdout.write(note + "\n")
    return code


class LogFile:
    """Sends every log record to a file in the temp dir instead of stderr, counting warnings."""

    def __init__(self) -> None:
        fd, name = tempfile.mkstemp(prefix="kubelet-dra-demo-", suffix=".log")
        os.close(fd)
        self.path = pathlib.Path(name)
        self.warnings = 0
        self._handler = logging.FileHandler(self.path, encoding="utf-8")
        self._handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        )
        self._handler.addFilter(self._count)
        root = logging.getLogger()
        self._saved = root.handlers[:]
        root.handlers[:] = [self._handler]

    def _count(self, record: logging.LogRecord) -> bool:
        self.warnings += record.levelno >= logging.WARNING
        return True

    def close(self) -> str:
        """Restore the handlers; the line that names the file ("" and no file if empty)."""
        logging.getLogger().handlers[:] = self._saved
        self._handler.close()
        if self.path.stat().st_size == 0:
            self.path.unlink()
            return ""
        plural = "" if self.warnings == 1 else "s"
        return (
            f"    pipeline log ({self.warnings} warning{plural}; -v prints it inline): {self.path}"
        )


@dataclasses.dataclass
class Step:
    title: str
    ok: bool
    seconds: float


class Demo:
    def __init__(
        self, duration: float, devices: int, pods: int, *, out: TextIO = sys.stdout
    ) -> None:
        self.duration = max(duration, 8.0)
        self.devices = [f"gpu-{i}" for i in range(max(devices, 2))]
        self.pods = [f"train-{i}" for i in range(max(pods, 1))]
        self.out = out
        self.steps: list[Step] = []

    # -- set-up ------------------------------------------------------------------

    def _cluster(self, api: fakeapi.FakeApiServer) -> None:
        for i, pod in enumerate(self.pods):
            mine = [self.devices[i % len(self.devices)]]
            if len(self.devices) > len(self.pods):
                mine.append(self.devices[(i + len(self.pods)) % len(self.devices)])
            results = [(DRIVER, POOL, device, "gpus") for device in mine]
            api.create_claim(fakeapi.make_claim(f"{pod}-gpus", results=results, node=NODE))
            api.create_pod(fakeapi.make_pod(pod, NODE, claims=[f"{pod}-gpus"]))

    def _settings(self, root: pathlib.Path, api: fakeapi.FakeApiServer) -> settings.Settings:
        return settings.Settings(
            node_name=NODE,
            kubeconfig=api.write_kubeconfig(root / "kubeconfig"),
            plugins_registry=root / "registry",
            state_dir=root / "state",
            # The demo's node has no kubelet: never read (or wait for) the host's.
            kubelet_root_dir=None,
            pod_resources_socket=None,
            metrics_address="",
            registry_poll_interval=0.1,
            stream_backoff_initial=0.2,
            stream_backoff_max=1.0,
            write_window=0.05,
        )

    def _health(self, overrides: dict[str, tuple[str, str]], timeout: int = 0) -> list[Any]:
        return [
            {
                "pool": POOL,
                "device": device,
                "health": overrides.get(device, ("Healthy", ""))[0],
                "message": overrides.get(device, ("Healthy", ""))[1],
                "timeout_seconds": timeout,
            }
            for device in self.devices
        ]

    # -- the script --------------------------------------------------------------

    async def run(self) -> int:
        root = pathlib.Path(tempfile.mkdtemp(prefix="kdra-demo"))
        try:
            with fakeapi.FakeApiServer() as api:
                self._cluster(api)
                driver = fakedriver.FakeDriver(DRIVER, registry=root / "registry")
                async with driver, manager.DRAHealthManager(self._settings(root, api)):
                    await self._script(api, driver)
                writes = len(api.status_writes())
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return self._summary(writes)

    async def _script(self, api: fakeapi.FakeApiServer, driver: fakedriver.FakeDriver) -> None:
        beat = self.duration / 10
        sick, message = self.devices[1], "ECC uncorrectable error count exceeded (XID 48)"
        await driver.set_health(*self._health({}), resend=beat)
        await self._expect(api, "all devices Healthy", lambda h: all(v == "Healthy" for v in h))
        await asyncio.sleep(beat)
        await driver.set_health(*self._health({sick: ("Unhealthy", message)}), resend=beat)
        await self._expect(
            api, f"{sick} Unhealthy, with the driver's message", lambda h: "Unhealthy" in h
        )
        self._show_yaml(api, sick)
        await asyncio.sleep(beat)
        await driver.set_health(*self._health({}, timeout=max(1, int(beat * 2))), resend=beat)
        await self._expect(api, f"{sick} recovered", lambda h: all(v == "Healthy" for v in h))
        driver.set_silent(True)
        self._say(f"driver goes silent; leases of {max(1, int(beat * 2))} s run out...")
        await self._expect(api, "leases ran out: Unknown", lambda h: all(v == "Unknown" for v in h))
        driver.set_silent(False)
        lease = max(1, int(beat * 2))
        await driver.set_health(*self._health({}, timeout=lease), resend=beat)
        await self._expect(api, "reports resume: Healthy", lambda h: all(v == "Healthy" for v in h))
        await driver.stop()
        # The lease outlives the stream: health is kept until it runs out.
        self._say(f"driver process dies (its sockets disappear); leases of {lease} s run out...")
        await self._expect(
            api, "driver gone, leases ran out: Unknown", lambda h: all(v == "Unknown" for v in h)
        )
        await driver.start()
        await driver.set_health(*self._health({}), resend=beat)
        await self._expect(api, "driver back: Healthy", lambda h: all(v == "Healthy" for v in h))

    async def _expect(
        self, api: fakeapi.FakeApiServer, title: str, check: Callable[[list[str]], bool]
    ) -> None:
        started = time.monotonic()
        deadline = started + self.duration / 2
        while time.monotonic() < deadline:
            healths = [row[4] for row in self._rows(api)]
            if healths and check(healths):
                break
            await asyncio.sleep(0.02)
        seconds = time.monotonic() - started
        ok = bool(healths) and check(healths)
        self.steps.append(Step(title, ok, seconds))
        mark = "ok" if ok else "NOT SEEN"
        self._say(f"[{mark}] {title} (seen in the API after {seconds:.2f} s)")
        self._table(api)

    # -- output ------------------------------------------------------------------

    def _rows(self, api: fakeapi.FakeApiServer) -> list[tuple[str, str, str, str, str, str]]:
        rows = []
        for name in self.pods:
            status = api.get_pod("default", name).get("status") or {}
            for cs in status.get("containerStatuses") or []:
                for entry in cs.get("allocatedResourcesStatus") or []:
                    for res in entry.get("resources") or []:
                        rows.append(
                            (name, cs["name"], entry["name"], res["resourceID"],
                             res.get("health", ""), res.get("message", ""))
                        )  # fmt: skip
        return rows

    def _table(self, api: fakeapi.FakeApiServer) -> None:
        header = ("POD", "CONTAINER", "NAME", "RESOURCE ID", "HEALTH", "MESSAGE")
        rows = [header, *self._rows(api)]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
        for row in rows:
            cells = [c.ljust(w) for c, w in zip(row, widths, strict=False)]
            self.out.write("    " + "  ".join([*cells, row[-1]]).rstrip() + "\n")
        for name in self.pods:
            cond = podstatus.find_condition(api.get_pod("default", name).get("status"), CONDITION)
            if cond:
                self.out.write(f"    {name}: {CONDITION}={cond['status']} ({cond['reason']})\n")
        self.out.flush()

    def _show_yaml(self, api: fakeapi.FakeApiServer, device: str) -> None:
        for name in self.pods:
            status = api.get_pod("default", name).get("status") or {}
            if any(device in row[3] for row in self._rows(api) if row[0] == name):
                cs = status["containerStatuses"][0]
                view = {
                    "status": {
                        "conditions": [podstatus.find_condition(status, CONDITION)],
                        "containerStatuses": [
                            {"name": cs["name"], "allocatedResourcesStatus": cs.get(
                                "allocatedResourcesStatus")}
                        ],
                    }
                }  # fmt: skip
                self._say(f"kubectl get pod {name} -o yaml (excerpt):")
                text = yaml.safe_dump(view, sort_keys=False, width=100)
                self.out.write("".join(f"    {line}\n" for line in text.splitlines()))
                return

    def _say(self, text: str) -> None:
        self.out.write(f"\n{text}\n")
        self.out.flush()

    def _summary(self, writes: int) -> int:
        seen = sum(step.ok for step in self.steps)
        self._say(
            f"summary: {seen}/{len(self.steps)} steps seen in the API, "
            f"{writes} pod status writes for {len(self.pods)} pods"
        )
        for step in self.steps:
            self.out.write(
                f"    {'ok ' if step.ok else 'BAD'} {step.seconds:6.2f} s  {step.title}\n"
            )
        return 0 if seen == len(self.steps) else 1
