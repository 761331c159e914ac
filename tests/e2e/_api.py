"""Plain JSON calls to the e2e kube-apiserver (the tests' view; the sidecar uses its own client).

The e2e tests act as the control plane would around a kubelet (create a claim, allocate and
reserve it, bind the pod) and read pods back as JSON. ``Api`` sends those requests with the
admin token over the server's TLS; an error answer raises :class:`ApiError` with its body.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any

from kubelet_dra.status.podjson import MutableObj as Obj
from tests.interop._apiserver import KubeApiServer

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


class ApiError(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text[:2000]}")
        self.status = status


class Api:
    def __init__(self, server: KubeApiServer, token: str | None = None) -> None:
        self.url = server.url
        self.token = token or server.admin_token
        self._tls = ssl.create_default_context(cafile=str(server.ca_file))

    def call(
        self, method: str, path: str, body: Any = None, ctype: str = "application/json"
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("Content-Type", ctype)
        try:
            with urllib.request.urlopen(request, context=self._tls, timeout=30) as answer:
                return json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, exc.read().decode(errors="replace")) from None

    def get(self, path: str) -> Obj:
        found: Obj = self.call("GET", path)
        return found

    def maybe(self, path: str) -> Obj | None:
        try:
            return self.get(path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def create(self, path: str, obj: Obj) -> Obj:
        made: Obj = self.call("POST", path, obj)
        return made

    def put(self, path: str, obj: Obj) -> Obj:
        done: Obj = self.call("PUT", path, obj)
        return done

    def patch(self, path: str, patch: Any, ctype: str = MERGE) -> Obj:
        done: Obj = self.call("PATCH", path, patch, ctype)
        return done

    def delete(self, path: str) -> None:
        try:
            self.call("DELETE", path)
        except ApiError as exc:
            if exc.status != 404:
                raise
