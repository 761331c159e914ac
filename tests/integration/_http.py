"""A plain HTTP GET for the metrics server's tests: the status and the body, errors included."""

from __future__ import annotations

import urllib.error
import urllib.request


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()
