"""The values reference in the chart's README is what ``tests.deploy.chart_readme``
generates from values.yaml and values.schema.json (no helm needed)."""

from __future__ import annotations

import yaml

from . import chart_readme, test_helm_chart


def test_readme_values_reference_is_generated() -> None:
    current = chart_readme.README.read_text(encoding="utf-8")
    assert current == chart_readme.render(current), (
        "the chart's README is out of date: run python -m tests.deploy.chart_readme"
    )


def test_reference_has_a_row_per_value() -> None:
    """Every value the chart's tests cover one by one (their leaves) has its row."""
    values = yaml.safe_load((chart_readme.CHART / "values.yaml").read_text(encoding="utf-8"))
    readme = chart_readme.README.read_text(encoding="utf-8")
    for path in test_helm_chart._leaves(values):
        assert f"| `{path}` |" in readme, path


def test_comments_belong_to_the_key_below() -> None:
    text = "a:\n  # about b\n  # more\n  b: 1\n\n  # loose\n\n  c: 2\n# d's\nd: {}\n"
    assert chart_readme.comments(text) == {"a.b": "about b more", "d": "d's"}
