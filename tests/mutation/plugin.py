"""A pytest plugin for the mutation run only: property tests with fewer, fixed examples.

``tox -e mutation`` loads it (``-p tests.mutation.plugin``, pyproject's
``[tool.mutmut]``). Every Hypothesis test runs at most :data:`MAX_EXAMPLES`
examples, derandomized and without the example database, so that a mutant's
verdict is the same on every run and a surviving mutant of ``healthinfo`` costs
seconds, not the minute of the full property suite (docs/testing.md). The
default test run does not load it.
"""

from __future__ import annotations

import hypothesis
import pytest

MAX_EXAMPLES = 25


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        test = getattr(item, "obj", None)
        current = getattr(test, "_hypothesis_internal_use_settings", None)
        if current is None:
            continue
        # Hypothesis reads this attribute when the test is called, not when decorated.
        test._hypothesis_internal_use_settings = hypothesis.settings(  # type: ignore[union-attr]
            current,
            max_examples=min(current.max_examples, MAX_EXAMPLES),
            derandomize=True,
            database=None,
            deadline=None,
            suppress_health_check=list(hypothesis.HealthCheck),
        )
