"""Fixtures shared by the unit tests."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest


@pytest.fixture
def far_time_zone(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's local time is UTC+05:45 (a POSIX TZ string: no tz database needed),
    for checking that times written to the API are UTC whatever the node's zone."""
    monkeypatch.setenv("TZ", "XYZ-05:45")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()
