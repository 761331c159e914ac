"""JSON pointers (RFC 6901): the one implementation the writer and the API stand-in share.

No kubelet counterpart: the API server resolves the pointers of a JSON patch
with evanphx/json-patch. The status writer resolves them to check which
``test`` operations of a refused patch still hold; ``testing.FakeApiServer``
resolves them to apply patches. A list index is decimal digits below the
list's length; ``-`` (past the end) is only meaningful to ``add`` and is left
to the caller.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = _Missing()
"""What :func:`resolve` and :func:`child` return where the document has no such value."""


def parse(pointer: str) -> list[str]:
    """The reference tokens of ``pointer`` (``""`` is the whole document).

    Raises ``ValueError`` for a non-empty pointer that does not start with ``/``.
    """
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise ValueError(f"invalid JSON pointer: {pointer!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in pointer[1:].split("/")]


def child(node: Any, token: str) -> Any:
    """The member or element ``token`` of ``node``, or :data:`MISSING`."""
    if isinstance(node, dict):
        return node.get(token, MISSING)
    if isinstance(node, list) and token.isascii() and token.isdigit() and int(token) < len(node):
        return node[int(token)]
    return MISSING


def walk(doc: Any, tokens: Iterable[str]) -> Any:
    """The value the reference tokens name in ``doc``, or :data:`MISSING`."""
    for token in tokens:
        doc = child(doc, token)
        if doc is MISSING:
            break
    return doc


def resolve(doc: Any, pointer: str) -> Any:
    """The value ``pointer`` names in ``doc``, or :data:`MISSING` (a bad pointer too)."""
    try:
        return walk(doc, parse(pointer))
    except ValueError:
        return MISSING
