"""Fixtures of the integration tests (the shared ones are in ``tests/conftest.py``).

- ``stack``: a health cache and a started ``PluginManager`` on the fake clock, with
  the ``Changes`` it notified;
- ``cluster_objects``: puts ``_sidecar_process.cluster`` (two pods on our node, one
  elsewhere, their claims) into ``api``; a module uses it with
  ``pytestmark = pytest.mark.usefixtures("cluster_objects")``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator

import pytest

from kubelet_dra import clock
from kubelet_dra.plugin import plugins
from kubelet_dra.state import healthinfo
from kubelet_dra.testing import FakeApiServer

from ._driver_fixtures import Changes, NoJitter, make_settings
from ._sidecar_process import cluster


@pytest.fixture
async def stack(
    fake_clock: clock.FakeClock,
) -> AsyncIterator[tuple[healthinfo.HealthCache, plugins.PluginManager, Changes]]:
    cache = healthinfo.HealthCache()
    changes = Changes()
    manager = plugins.PluginManager(
        cache, settings=make_settings(), clock=fake_clock, on_change=changes, rng=NoJitter()
    )
    async with manager:
        yield cache, manager, changes


@pytest.fixture
def cluster_objects(api: FakeApiServer) -> None:
    cluster(api)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running in a thread of its own, as the sidecar's pipeline loop is
    beside the metrics server's threads."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()
