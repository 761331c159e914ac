"""Security: the sidecar's network surface, file modes, secrets in logs, symlinks, bounds.

- A full ``kubelet-dra-health -vv run`` (subprocess) with a driver, pods,
  injected API errors and a SIGTERM: its log, at the most verbose level, never
  shows the bearer token or the kubeconfig's credentials; it listens on one
  TCP socket only, the metrics address on loopback (its socket inodes from
  ``/proc/<pid>/fd`` matched against ``/proc/net/tcp{,6}``), and on no unix
  socket; the state dir it creates is 0700 and its files 0600.
- The registry watcher follows no symlink (to a socket or a directory) out of
  the registry: a driver outside it is never even asked ``GetInfo``.
- Bounds: memory under a flood of reports from a driver in another process;
  concurrent streams per driver (``plugins.MAX_ENDPOINTS_PER_DRIVER``).
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import secrets
import signal
import stat
import sys
import time

from kubelet_dra import clock, models
from kubelet_dra.plugin import getinfo, plugins, registration
from kubelet_dra.state import healthinfo
from kubelet_dra.testing import FakeApiServer, FakeDriver, eventually
from kubelet_dra.testing.fakedriver_control import FakeDriverClient

from ._driver_fixtures import Changes, make_settings, rss_mb
from ._sidecar_process import DRIVER, SidecarProcess, cluster, device, health_of, http_get


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _tcp_listeners(inodes: set[int]) -> list[tuple[str, int]]:
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                local, state, inode = fields[1], fields[3], int(fields[9])
                if state == "0A" and inode in inodes:  # TCP_LISTEN
                    address, port = local.split(":")
                    found.append((address, int(port, 16)))
    return found


def _unix_listeners(inodes: set[int]) -> list[str]:
    with open("/proc/net/unix") as lines:
        next(lines)
        rows = [line.split() for line in lines]
    # Flags 00010000: __SO_ACCEPTCON, a listening socket.
    return [r[-1] if len(r) > 7 else "" for r in rows if int(r[6]) in inodes and r[3] == "00010000"]


async def test_full_verbose_run_leaks_no_secret_and_opens_only_the_metrics_port(
    sockdir: pathlib.Path,
) -> None:
    token = "kd-secret-" + secrets.token_hex(16)
    with FakeApiServer(token=token) as api:
        cluster(api)
        api.conflict_first_write = True
        api.fail("PATCH", r"/status$", code=500, times=2)
        api.fail("GET", r"/resourceclaims/", code=429, retry_after=1, times=1)
        async with FakeDriver(name=DRIVER, registry=sockdir / "reg") as driver:
            await driver.set_health(device("gpu-0"), device("gpu-1", "Unhealthy", message="ECC"))
            async with SidecarProcess(sockdir, api, metrics=True, flags=["-vv"]) as sidecar:
                url = await sidecar.metrics_url()
                await sidecar.until(lambda: health_of(api, "train-b", "gpu-1") == "Unhealthy", 20)
                assert sidecar.proc is not None
                inodes = _socket_inodes(sidecar.proc.pid)
                listeners = _tcp_listeners(inodes)
                unix = _unix_listeners(inodes)

                async def ready() -> bool:
                    answer = await http_get(url + "/readyz")
                    assert answer[0] == 200, answer
                    return True

                await eventually(ready, what="/readyz 200", timeout=20, interval=0.05)
                running = {
                    p.name: stat.S_IMODE(p.stat().st_mode) for p in (sockdir / "state").iterdir()
                }
                exit_code, _ = await sidecar.stop(signal.SIGTERM)
            log = sidecar.log
    assert exit_code == 0
    port = int(url.rsplit(":", 1)[1])
    assert listeners == [("0100007F", port)], listeners  # 127.0.0.1, little-endian hex
    assert unix == [], unix
    kubeconfig = json.loads((sockdir / "kubeconfig").read_text())
    assert token not in log and "Bearer" not in log and "authorization" not in log.lower()
    assert json.dumps(kubeconfig["users"]) not in log
    assert "DEBUG" in log  # -vv really was verbose
    state = sockdir / "state"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in state.iterdir()}
    modes.update({f"{name} (running)": mode for name, mode in running.items()})
    assert modes and set(modes.values()) == {0o600}, modes
    print(
        f"\nsecurity run: {len(log.splitlines())} log lines at -vv, 0 secrets; listening on "
        f"127.0.0.1:{port} only; state dir 0700, files {sorted(modes)} 0600"
    )


async def test_no_symlink_out_of_the_registry_is_followed(sockdir: pathlib.Path) -> None:
    registry, outside = sockdir / "reg", sockdir / "outside"
    registry.mkdir()
    settings = make_settings()
    system = clock.SystemClock()
    seen: list[registration.PluginEvent] = []

    async def on_event(event: registration.PluginEvent) -> None:
        seen.append(event)

    async with (
        FakeDriver(name="inside.example.com", registry=registry) as inside,
        FakeDriver(name="outside.example.com", registry=outside) as out,
    ):
        (registry / "link.sock").symlink_to(out.registration_socket)
        (registry / "linked-dir").symlink_to(outside, target_is_directory=True)
        (registry / "sub").mkdir()
        (registry / "sub" / "up.sock").symlink_to(
            pathlib.Path("..", "..", "outside", out.registration_socket.name)
        )
        watcher = registration.RegistryWatcher(
            registry, role=settings.role, settings=settings, clock=system, on_event=on_event
        )
        async with watcher:
            for _ in range(5):
                await watcher.scan_once()
            await inside.wait_for_calls("GetInfo")
        assert [e.plugin.driver for e in seen] == ["inside.example.com"]
        assert out.calls["GetInfo"] == 0


async def test_report_flood_from_another_process_keeps_memory_bounded(
    sockdir: pathlib.Path,
) -> None:
    registry = sockdir / "reg"
    devices = [{"pool": "p", "device": f"d{i}", "health": "Healthy"} for i in range(500)]
    control = sockdir / "ctl.sock"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kubelet_dra", "fake-driver", "--registry", str(registry),
        "--control", str(control), "--devices", json.dumps(devices),
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).parents[2])},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        ready = json.loads(await asyncio.wait_for(proc.stdout.readline(), 20))
        info = getinfo.make_plugin_info(
            ready["driver"], ready["dra_socket"], ["v1.DRAPlugin", "v1.DRAResourceHealth"]
        )
        cache = healthinfo.HealthCache()
        async with (
            plugins.PluginManager(
                cache, settings=make_settings(), clock=clock.SystemClock(), on_change=Changes()
            ) as mgr,
            FakeDriverClient(control) as client,
        ):
            await mgr.handle(registration.PluginEvent(registration.EventKind.REGISTER, info))
            await eventually(lambda: len(cache) == 500, timeout=10)
            before = peak = rss_mb()
            await client.request("push", times=2000)
            started = time.monotonic()
            await client.request(
                "set_health", devices=[{"pool": "p", "device": "d0", "health": "Unhealthy"}]
            )
            while cache.get(_key(ready["driver"]), time.time()).health.value != "Unhealthy":
                peak = max(peak, rss_mb())
                assert time.monotonic() - started < 60, "the flood was never worked off"
                await asyncio.sleep(0.01)
            reports = mgr.drivers[ready["driver"]].reports
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    print(f"\nreport flood: {reports} reports of 500 devices, RSS +{peak - before:.0f} MB peak")
    assert reports >= 2000
    assert peak - before < 100


async def test_concurrent_streams_per_driver_are_bounded(sockdir: pathlib.Path) -> None:
    registry = sockdir / "reg"
    cache = healthinfo.HealthCache()
    bound, extra = plugins.MAX_ENDPOINTS_PER_DRIVER, 16
    async with (
        FakeDriver(registry=registry) as drv,
        plugins.PluginManager(
            cache, settings=make_settings(), clock=clock.SystemClock(), on_change=Changes()
        ) as mgr,
    ):
        aliases = sockdir / "aliases"
        aliases.mkdir()
        for i in range(bound + extra):  # endpoint paths of one driver
            alias = aliases / f"e{i}.sock"
            alias.symlink_to(drv.dra_socket)
            info = getinfo.make_plugin_info(drv.name, str(alias), drv.supported_versions)
            await mgr.handle(registration.PluginEvent(registration.EventKind.REGISTER, info))
        await drv.set_health({"pool": "p", "device": "d", "health": "Healthy"})
        await drv.wait_for_streams(bound)
        await eventually(lambda: drv.open_streams == bound)
        stopped = [p for p, s in mgr.endpoints.items() if s.state == plugins.StreamState.STOPPED]
        # The oldest streams stopped, the newest kept theirs.
        assert stopped == [str(aliases / f"e{i}.sock") for i in range(extra)]
        assert mgr.refused[drv.name, "too_many_endpoints"] == extra


def _key(driver: str) -> models.DeviceKey:
    return models.DeviceKey(driver, "p", "d0")
