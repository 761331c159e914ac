"""Fixtures shared by every test directory (one copy each; directory conftests add theirs).

- ``api``: a running :class:`~kubelet_dra.testing.FakeApiServer`, empty;
- ``sockdir``: a short temporary directory for unix sockets (paths are limited to
  107 bytes, so not pytest's long ``tmp_path``), removed after the test;
- ``registry``: ``<sockdir>/reg``, created, where drivers put registration sockets;
- ``fake_clock``: a :class:`~kubelet_dra.clock.FakeClock` for tests that move time
  themselves instead of sleeping.

Helpers that are not fixtures live in modules with a leading underscore
(``tests/integration/_driver_fixtures.py``, ``_sidecar_process.py``, ...); waiting on
real time is :func:`kubelet_dra.testing.eventually`.
"""

from __future__ import annotations

import pathlib
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from kubelet_dra import clock
from kubelet_dra.testing import FakeApiServer


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def sockdir() -> Iterator[pathlib.Path]:
    path = pathlib.Path(tempfile.mkdtemp(prefix="kd", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def registry(sockdir: pathlib.Path) -> pathlib.Path:
    path = sockdir / "reg"
    path.mkdir()
    return path


@pytest.fixture
def fake_clock() -> clock.FakeClock:
    return clock.FakeClock()
