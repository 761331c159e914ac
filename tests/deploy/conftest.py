"""The chart's tests run with Helm 4 and with Helm 3: ``helm_bin`` here is parametrized.

``helm_tool`` names the artifact of ``tests/interop/_build.py`` (``helm``: v4.3.2,
``helm3``: v3.22.0); the interop tests keep the session's Helm 4 ``helm_bin``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import tool

from ._chart import HELMS


@pytest.fixture(scope="session", params=list(HELMS), ids=["helm4", "helm3"])
def helm_tool(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="session")
def helm_bin(pytestconfig: pytest.Config, helm_tool: str) -> Path:
    """The ``helm`` of ``helm_tool``, built from the module proxy (else on PATH)."""
    return tool(pytestconfig, helm_tool)
