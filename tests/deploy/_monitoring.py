"""The monitoring files of ``deploy/monitoring``: their copies and the PromQL in them.

``deploy/monitoring/rules.yaml`` is the one source of the alerts. Generated from it:

- ``deploy/monitoring/prometheusrule.yaml``: the same groups as a ``PrometheusRule``;
- ``deploy/helm/kubelet-dra-health/files/rules.yaml``: a byte copy (Helm reads only files
  inside the chart).

``python -m tests.deploy._monitoring`` rewrites both; ``tests/deploy/test_monitoring.py``
fails while either differs from what this module generates.

The PromQL helpers find the metric selectors (names and label matchers) in the alert rules
and in the Grafana dashboard, which ``tests/integration/test_monitoring_metrics.py`` checks
against what a running sidecar's ``/metrics`` exposes. They are a small lexer, not a PromQL
parser: it is enough for names and matchers, and promtool checks the syntax.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "monitoring"
RULES = MONITORING / "rules.yaml"
PROMETHEUS_RULE = MONITORING / "prometheusrule.yaml"
DASHBOARD = MONITORING / "dashboard.json"
CHART_RULES = ROOT / "deploy" / "helm" / "kubelet-dra-health" / "files" / "rules.yaml"

_HEADER = """\
# Generated from rules.yaml by `python -m tests.deploy._monitoring`; do not edit.
# The alerts as a PrometheusRule (the Prometheus Operator's CRD). Add the labels your
# Prometheus selects rules by (for example release: prometheus), or install the Helm chart
# with metrics.prometheusRule.enabled=true, which renders the same rules.
"""


def rules() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return loaded


def prometheus_rule_text() -> str:
    obj = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "kubelet-dra-health",
            "namespace": "kubelet-dra-health",
            "labels": {"app.kubernetes.io/name": "kubelet-dra-health"},
        },
        "spec": rules(),
    }
    return _HEADER + yaml.safe_dump(obj, sort_keys=False, width=4096)


# -- PromQL -------------------------------------------------------------------------

#: Grafana's variables, replaced by values PromQL accepts.
GRAFANA_VARIABLES = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$__range": "1h",
    "${instance}": ".*",
    "$instance": ".*",
}
_KEYWORDS = {
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "inf",
    "nan",
}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^}]*)\}")
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![a-zA-Z0-9_:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![a-zA-Z0-9_:])")
_LABEL_VALUES = re.compile(r"^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*(\w+)\s*\)$")


@dataclasses.dataclass(frozen=True)
class Selector:
    """One metric name in a query and the label matchers written next to it."""

    metric: str
    matchers: tuple[tuple[str, str, str], ...] = ()  # (label, operator, value)


def substitute(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def selectors(expr: str) -> list[Selector]:
    """The metric selectors of a PromQL expression (after :func:`substitute`).

    A ``{...}`` block gives its matchers to the name before it; every other identifier
    that is not a function call, a keyword or inside a grouping clause is a metric name.
    ``label_values(metric, label)`` (Grafana's templating) counts as ``metric{label}``.
    """
    expr = substitute(expr.strip())
    templating = _LABEL_VALUES.match(expr)
    if templating:
        return [Selector(templating[1], ((templating[2], "exists", ""),))]
    found: list[Selector] = []

    def take(match: re.Match[str]) -> str:
        matchers = tuple(_MATCHER.findall(match[2]))
        name = match[1]
        if name is None:  # {__name__="x"} or a nameless selector: not used here
            raise ValueError(f"selector without a metric name in {expr!r}")
        found.append(Selector(name, matchers))
        return " "

    rest = _SELECTOR.sub(take, expr)
    rest = _STRING.sub(" ", rest)
    rest = re.sub(r"\[[^\]]*\]", " ", rest)
    rest = _GROUPING.sub(" ", rest)
    for match in _IDENTIFIER.finditer(rest):
        name = match[1]
        following = rest[match.end() :].lstrip()
        if following.startswith("(") or name.lower() in _KEYWORDS:
            continue
        found.append(Selector(name))
    return found


def rule_expressions() -> dict[str, str]:
    """Alert name -> expression, from rules.yaml."""
    return {
        rule["alert"]: rule["expr"]
        for group in rules()["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def dashboard_expressions() -> dict[str, str]:
    """ "<panel title> <refId>" (or "templating <name>") -> PromQL, for every query."""
    out: dict[str, str] = {}
    board = dashboard()
    panels = list(board["panels"])
    while panels:
        panel = panels.pop(0)
        panels += panel.get("panels", [])
        for target in panel.get("targets", []):
            out[f"{panel['title']} {target['refId']}"] = target["expr"]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            out[f"templating {variable['name']}"] = (
                query["query"] if isinstance(query, dict) else query
            )
    return out


def main() -> int:
    PROMETHEUS_RULE.write_text(prometheus_rule_text(), encoding="utf-8")
    CHART_RULES.write_bytes(RULES.read_bytes())
    print(f"wrote {PROMETHEUS_RULE.relative_to(ROOT)} and {CHART_RULES.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
