"""The image tier: build the OCI image twice and start it with podman (``tox -e image``)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "image: builds the OCI image (mmdebstrap, umoci) and runs it with podman"
    )
