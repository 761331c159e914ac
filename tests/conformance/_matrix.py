"""Matrix writer (placeholder)."""
from __future__ import annotations

from typing import Any


def write(scenarios: Any, results: Any) -> None:
    raise NotImplementedError
