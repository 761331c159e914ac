"""Shared fixtures of the integration tests (see ``_driver_fixtures`` for the driver ones)."""

from ._driver_fixtures import fake_clock, registry, sockdir, stack

__all__ = ["fake_clock", "registry", "sockdir", "stack"]
