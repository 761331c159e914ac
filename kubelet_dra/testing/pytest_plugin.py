"""The test kit as a pytest plugin: ``kdra_*`` fixtures for a driver's or a node agent's tests.

No kubelet counterpart: the fixtures assemble what a node gives the kubelet's DRA manager (a
plugin registry, a driver, an API server) around our manager. Loaded through the ``pytest11``
entry point ``kubelet_dra`` (``-p no:kubelet_dra`` turns it off). Every name starts with
``kdra_``, nothing is autouse and no hook changes collection, so a project that asks for no
fixture sees no difference; loading it imports only pytest (and pytest-asyncio): the kit is
imported by the first fixture a test asks for. ``docs/drivers.md`` lists the fixtures;
``@pytest.mark.kdra_driver(name=..., **kwargs)`` passes ``FakeDriver`` arguments.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import pathlib

    import kubernetes.client

    from kubelet_dra import DRAHealthManager, Settings
    from kubelet_dra.testing import FakeApiServer, FakeDriver, PodStore

try:
    import pytest_asyncio
except ImportError:  # the sync fixtures still work; the async ones say what is missing
    pytest_asyncio = None  # type: ignore[assignment]

DRIVER_MARK = "kdra_driver"
DEFAULT_DRIVER = "gpu.example.com"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{DRIVER_MARK}(name='{DEFAULT_DRIVER}', **kwargs): "
        "the FakeDriver arguments of the kdra_driver fixture (kubelet_dra.testing)",
    )


def _async_fixture(function: Callable[..., AsyncIterator[Any]]) -> Any:
    if pytest_asyncio is not None:
        return pytest_asyncio.fixture(function)

    def missing(request: pytest.FixtureRequest) -> None:
        pytest.fail(
            f"the {function.__name__} fixture needs pytest-asyncio "
            "(pip install kubelet-dra[pytest])",
            pytrace=False,
        )

    missing.__name__ = function.__name__
    missing.__doc__ = function.__doc__
    return pytest.fixture(missing)


@pytest.fixture
def kdra_sockdir() -> Iterator[pathlib.Path]:
    """A short new directory for unix sockets (paths stay under 108 bytes), removed after."""
    from kubelet_dra.testing import socket_dir

    with socket_dir() as path:
        yield path


@pytest.fixture
def kdra_registry(kdra_sockdir: pathlib.Path) -> pathlib.Path:
    """``<kdra_sockdir>/reg``, created: the plugin registry drivers register in."""
    path = kdra_sockdir / "reg"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture
def kdra_settings(kdra_sockdir: pathlib.Path, kdra_registry: pathlib.Path) -> Settings:
    """``Settings`` rooted in ``kdra_sockdir``; the manager answers registration (owner)."""
    from kubelet_dra import Role
    from kubelet_dra.testing import make_settings

    return make_settings(kdra_sockdir, plugins_registry=kdra_registry, role=Role.OWNER)


@pytest.fixture
def kdra_api() -> Iterator[FakeApiServer]:
    """A running ``FakeApiServer``, empty."""
    from kubelet_dra.testing import FakeApiServer

    with FakeApiServer() as api:
        yield api


@pytest.fixture
def kdra_kube_client(kdra_api: FakeApiServer) -> Iterator[kubernetes.client.ApiClient]:
    """The official client's ``ApiClient`` configured for ``kdra_api``; closed after."""
    with kdra_api.api_client() as client:
        yield client


@_async_fixture
async def kdra_driver(
    request: pytest.FixtureRequest, kdra_registry: pathlib.Path
) -> AsyncIterator[FakeDriver]:
    """A started ``FakeDriver`` registered in ``kdra_registry`` (see the ``kdra_driver`` mark)."""
    from kubelet_dra.testing import FakeDriver

    mark = request.node.get_closest_marker(DRIVER_MARK)
    args: tuple[Any, ...] = mark.args if mark else ()
    kwargs: dict[str, Any] = dict(mark.kwargs) if mark else {}
    if not args:
        kwargs.setdefault("name", DEFAULT_DRIVER)
    async with FakeDriver(*args, registry=kdra_registry, **kwargs) as driver:
        yield driver


@pytest.fixture
def kdra_pods(kdra_settings: Settings) -> PodStore:
    """The node agent's pods: ``add`` them, read ``health(uid)``; ``kdra_manager`` feeds it."""
    from kubelet_dra.testing import PodStore

    return PodStore(condition_type=kdra_settings.pod_condition_type)


@_async_fixture
async def kdra_manager(
    kdra_settings: Settings, kdra_pods: PodStore
) -> AsyncIterator[DRAHealthManager]:
    """A started ``DRAHealthManager`` as a node agent uses it; its updates go to ``kdra_pods``."""
    from kubelet_dra import DRAHealthManager

    async with DRAHealthManager(kdra_settings, on_status=kdra_pods.on_status) as manager:
        yield manager
