"""Seeded generator of conformance scenarios (placeholder)."""
from __future__ import annotations

from tests.conformance import _scenario as sc


def scenario(seed: int) -> sc.Scenario:
    raise NotImplementedError
