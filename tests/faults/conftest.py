"""Fixtures of the fault-injection suite; every test here is marked ``faults``.

Each fault has a short version (in the default ``pytest`` run and CI) and a
long one marked ``slow`` (``tox -e faults`` or ``pytest tests/faults -m slow``);
``KUBELET_DRA_FAULT_ROUNDS`` sets the rounds of every long version.
"""

from __future__ import annotations

import pathlib

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = pathlib.Path(__file__).parent
    for item in items:
        if here in pathlib.Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.faults)
