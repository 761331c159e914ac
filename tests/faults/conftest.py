"""Fixtures of the fault-injection suite; every test here is marked ``faults``.

Each fault has a short version (in the default ``pytest`` run and CI) and a
long one marked ``slow`` (``tox -e faults`` or ``pytest tests/faults -m slow``);
``KUBELET_DRA_FAULT_ROUNDS`` sets the rounds of every long version.
"""

from __future__ import annotations

import pathlib
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from kubelet_dra.testing import FakeApiServer


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = pathlib.Path(__file__).parent
    for item in items:
        if here in pathlib.Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.faults)


@pytest.fixture
def sockdir() -> Iterator[pathlib.Path]:
    # Unix socket paths are limited to 107 bytes: a short /tmp/kd* directory.
    path = pathlib.Path(tempfile.mkdtemp(prefix="kd", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server
