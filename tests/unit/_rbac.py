"""RBAC evaluation for tests: does a ClusterRole allow a request the code makes?

:func:`rbac_allows` reimplements the rule matching of the API server's RBAC
authorizer (``plugin/pkg/auth/authorizer/rbac``: ``VerbMatches``,
``APIGroupMatches``, ``ResourceMatches`` with ``*`` and ``*/<subresource>``,
``ResourceNameMatches``) for resource requests, and ``NonResourceURLMatches``
for the rest. :func:`request_attributes` turns an HTTP method and path into the
attributes the authorizer sees, the way ``RequestInfoFactory`` in
``k8s.io/apiserver/pkg/endpoints/request`` does (``GET`` of a collection is
``list``, with ``?watch=true`` it is ``watch``, ``PATCH`` is ``patch``...).

A test that records the requests the sidecar makes (the API stand-in records
every one) checks them all with::

    rules = cluster_role_rules()
    for method, path in recorded:
        assert request_allowed(rules, method, path), (method, path)
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

DEPLOY_DIR = pathlib.Path(__file__).resolve().parents[2] / "deploy"
CLUSTER_ROLE_FILE = DEPLOY_DIR / "clusterrole.yaml"

Rule = Mapping[str, Any]

# Paths every authenticated user may GET through the default ClusterRoles
# system:discovery and system:public-info-viewer (bootstrap policy).
DEFAULT_NON_RESOURCE_URLS = (
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/openapi",
    "/openapi/*",
    "/version",
    "/version/",
    "/healthz",
    "/livez",
    "/readyz",
)

_METHOD_VERBS = {
    "GET": "get",
    "HEAD": "get",
    "POST": "create",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
}
_NAMESPACE_SUBRESOURCES = {"status", "finalize"}
_TRUE = {"true", "1"}


@dataclasses.dataclass(frozen=True)
class RequestAttributes:
    """What the authorizer sees of one request (``RequestInfo``)."""

    verb: str
    group: str = ""
    version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    is_resource_request: bool = True
    path: str = ""


def cluster_role_rules(path: pathlib.Path = CLUSTER_ROLE_FILE) -> list[dict[str, Any]]:
    """The ``rules`` of the shipped ClusterRole (``deploy/clusterrole.yaml``)."""
    role = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert role["kind"] == "ClusterRole", path
    return list(role.get("rules") or [])


def _field(rule: Rule, camel: str, snake: str) -> list[str]:
    value = rule.get(camel, rule.get(snake))
    return list(value or [])


def _resource_matches(rule_resources: Iterable[str], resource: str, subresource: str) -> bool:
    combined = f"{resource}/{subresource}" if subresource else resource
    for ruled in rule_resources:
        if ruled in ("*", combined):
            return True
        if subresource and ruled == f"*/{subresource}":
            return True
    return False


def rbac_allows(
    rules: Iterable[Rule],
    verb: str,
    group: str,
    resource: str,
    subresource: str = "",
    name: str = "",
) -> bool:
    """Whether any rule allows ``verb`` on ``group``/``resource``[/``subresource``].

    ``rules`` are PolicyRules as dicts (camelCase from YAML, or the snake_case
    of the kubernetes client's ``to_dict()``). ``name`` matters only for rules
    with ``resourceNames``, which never match ``create``/``list``/``watch`` of a
    collection (no name).
    """
    for rule in rules:
        verbs = _field(rule, "verbs", "verbs")
        if "*" not in verbs and verb not in verbs:
            continue
        groups = _field(rule, "apiGroups", "api_groups")
        if "*" not in groups and group not in groups:
            continue
        if not _resource_matches(_field(rule, "resources", "resources"), resource, subresource):
            continue
        names = _field(rule, "resourceNames", "resource_names")
        if names and name not in names:
            continue
        return True
    return False


def _non_resource_matches(patterns: Iterable[str], path: str) -> bool:
    for pattern in patterns:
        if pattern in ("*", path):
            return True
        if pattern.endswith("*") and path.startswith(pattern[:-1]):
            return True
    return False


def rbac_allows_non_resource(rules: Iterable[Rule], verb: str, path: str) -> bool:
    """Whether any rule's ``nonResourceURLs`` allows ``verb`` on ``path``."""
    for rule in rules:
        verbs = _field(rule, "verbs", "verbs")
        if "*" not in verbs and verb not in verbs:
            continue
        if _non_resource_matches(_field(rule, "nonResourceURLs", "non_resource_ur_ls"), path):
            return True
    return False


def _exact_name(selectors: Iterable[str]) -> str:
    for selector in selectors:
        for term in selector.split(","):
            key, op, value = term.partition("==") if "==" in term else term.partition("=")
            if key.strip() == "metadata.name" and op and not key.endswith("!"):
                return value.strip()
    return ""


def request_attributes(method: str, path: str) -> RequestAttributes:
    """Map an HTTP request to authorizer attributes, like ``RequestInfoFactory``.

    ``path`` may carry a query string. Examples::

        GET    /api/v1/pods?watch=true                 -> watch  ""  pods
        GET    /api/v1/namespaces/x/pods/y             -> get    ""  pods       (name y)
        PATCH  /api/v1/namespaces/x/pods/y/status      -> patch  ""  pods status
        GET    /apis/resource.k8s.io/v1/namespaces/x/resourceclaims/y
                                                       -> get    resource.k8s.io resourceclaims
        POST   /api/v1/namespaces/default/events       -> create ""  events
        GET    /version                                -> non-resource get /version
    """
    method = method.upper()
    url = urlsplit(path)
    query = parse_qs(url.query)
    parts = [p for p in url.path.split("/") if p]
    lower = method.lower()
    if len(parts) < 2 or parts[0] not in ("api", "apis"):
        return RequestAttributes(verb=lower, is_resource_request=False, path=url.path)
    if parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    else:
        if len(parts) < 3:
            return RequestAttributes(verb=lower, is_resource_request=False, path=url.path)
        group, version, rest = parts[1], parts[2], parts[3:]
    if not rest:
        # Discovery of one group version (/api/v1, /apis/resource.k8s.io/v1).
        return RequestAttributes(verb=lower, is_resource_request=False, path=url.path)

    verb = _METHOD_VERBS.get(method, lower)
    # Deprecated /watch/ prefix: GET /api/v1/watch/namespaces/x/pods
    if rest[0] == "watch" and method == "GET":
        verb, rest = "watch", rest[1:]

    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        # /namespaces/<ns>[/status|/finalize] is the namespaces resource itself.
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]

    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""

    if not name and verb == "get":
        verb = "watch" if query.get("watch", [""])[0].lower() in _TRUE else "list"
        # A list or watch selecting metadata.name=<x> is authorized against that name.
        name = _exact_name(query.get("fieldSelector", []))
    elif not name and verb == "delete":
        verb = "deletecollection"
    return RequestAttributes(
        verb=verb,
        group=group,
        version=version,
        resource=resource,
        subresource=subresource,
        namespace=namespace,
        name=name,
        path=url.path,
    )


def request_allowed(
    rules: Iterable[Rule],
    method: str,
    path: str,
    *,
    default_non_resource: bool = True,
) -> bool:
    """Whether ``rules`` allow the HTTP request ``method path``.

    Non-resource paths (``/version``, discovery) are also allowed when
    ``default_non_resource`` and the default ClusterRoles grant them to every
    authenticated user (:data:`DEFAULT_NON_RESOURCE_URLS`).
    """
    rules = list(rules)
    attrs = request_attributes(method, path)
    if not attrs.is_resource_request:
        if rbac_allows_non_resource(rules, attrs.verb, attrs.path):
            return True
        return (
            default_non_resource
            and attrs.verb in ("get", "head")
            and _non_resource_matches(DEFAULT_NON_RESOURCE_URLS, attrs.path)
        )
    return rbac_allows(
        rules, attrs.verb, attrs.group, attrs.resource, attrs.subresource, attrs.name
    )
