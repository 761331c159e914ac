"""The command as a user runs it: ``demo`` end to end, ``run`` with JSON logs and ``-v``."""

from __future__ import annotations

import asyncio
import json
import pathlib
import re
import signal

from kubelet_dra.testing import FakeApiServer, FakeDriver

from ._sidecar_process import (
    DRIVER,
    SidecarProcess,
    cluster,
    device,
    health_of,
    run_python,
)


def test_demo_plays_every_step_and_exits_0() -> None:
    done = run_python("-m", "kubelet_dra", "demo", "--duration", "8")
    assert "summary: 7/7 steps seen in the API" in done.stdout
    assert "NOT SEEN" not in done.stdout
    # The YAML excerpt shows the driver's message where kubectl would.
    assert "message: ECC uncorrectable error count exceeded (XID 48)" in done.stdout
    assert "reason: DeviceUnhealthy" in done.stdout
    # The pipeline's logs (a stream error when the script kills the driver) go to
    # a file the last line names, not between the tables.
    assert done.stderr == ""
    assert "WARNING" not in done.stdout
    last = done.stdout.splitlines()[-1]
    assert last.startswith("    pipeline log ("), last
    log = pathlib.Path(last.rsplit(": ", 1)[1])
    assert " INFO " in log.read_text()
    log.unlink()
    readme = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
    missing = [b for b in readme_demo_blocks(readme) if not contains_run(done.stdout, b)]
    assert not missing, f"README demo excerpt blocks not in the demo's output: {missing}"


_VARIES = [
    (re.compile(r"after [\d.]+ s"), "after N s"),
    (re.compile(r"^ok +[\d.]+ s"), "ok N s"),
    (re.compile(r"lastTransitionTime: '[^']*'"), "lastTransitionTime: T"),
    (re.compile(r"\d+ pod status writes"), "N pod status writes"),
    (re.compile(r"pipeline log \(\d+ warnings?; -v prints it inline\): \S+"), "pipeline log F"),
]


def _normal(line: str) -> str:
    line = " ".join(line.split())
    for pattern, replacement in _VARIES:
        line = pattern.sub(replacement, line)
    return line


def readme_demo_blocks(readme: str) -> list[list[str]]:
    """The README's demo excerpt as runs of lines ("..." and blank lines cut it)."""
    section = readme[readme.index("## What the demo shows") :]
    end = section.find("\n#", 3)
    section = section if end < 0 else section[:end]
    blocks: list[list[str]] = [[]]
    for line in section.splitlines():
        if not line.startswith("    ") or line.strip() == "...":
            blocks.append([])
        else:
            blocks[-1].append(_normal(line))
    return [b for b in blocks if b]


def contains_run(output: str, block: list[str]) -> bool:
    lines = [_normal(line) for line in output.splitlines()]
    return any(lines[i : i + len(block)] == block for i in range(len(lines)))


async def test_json_logs_are_one_object_per_line_and_v_adds_debug(sockdir: pathlib.Path) -> None:
    with FakeApiServer() as api:
        cluster(api)
        flags = ["--log-format", "json", "-v"]
        async with (
            FakeDriver(DRIVER, registry=sockdir / "reg") as driver,
            SidecarProcess(sockdir, api, flags=flags) as sidecar,
        ):
            await driver.set_health(device("gpu-0"))
            await sidecar.until(lambda: health_of(api, "train-a", "gpu-0") == "Healthy")
            code, _ = await sidecar.stop(signal.SIGTERM)
    assert code == 0, sidecar.log
    entries = [json.loads(line) for line in sidecar.stderr]
    levels = {entry["level"] for entry in entries}
    assert {"info", "debug"} <= levels
    assert any(DRIVER in entry["msg"] for entry in entries)


async def test_default_text_logs_have_no_debug_lines(sockdir: pathlib.Path) -> None:
    with FakeApiServer() as api:
        cluster(api)
        async with SidecarProcess(sockdir, api) as sidecar:
            await sidecar.until(lambda: any("sidecar running" in line for line in sidecar.stderr))
            code, _ = await sidecar.stop(signal.SIGTERM)
    assert code == 0, sidecar.log
    assert sidecar.stderr
    assert not any(" DEBUG " in line for line in sidecar.stderr)
    assert all(" INFO " in line or " WARNING " in line for line in sidecar.stderr), sidecar.log


async def test_a_taken_metrics_port_exits_2_with_one_line(sockdir: pathlib.Path) -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with FakeApiServer() as api:
            sidecar = SidecarProcess(sockdir, api, flags=["--metrics-address", f"127.0.0.1:{port}"])
            async with sidecar:
                assert sidecar.proc is not None
                code = await asyncio.wait_for(sidecar.proc.wait(), 10)
    finally:
        server.close()
        await server.wait_closed()
    await asyncio.sleep(0)
    assert code == 2
    errors = [line for line in sidecar.stderr if "error" in line.lower()]
    assert len(errors) == 1 and f"127.0.0.1:{port}" in errors[0], sidecar.log
