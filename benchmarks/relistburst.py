"""How much Python memory a relist of the node's pods holds at once: one answer or pages.

``python -m benchmarks.relistburst [--pods 30] [--page-sizes 0,5,10] [--rounds 9]``

Not one of ``python -m benchmarks``'s scenarios: a probe for ``docs/memory.md`` (issue
22's RSS step at a broken pod watch). A relist is the sidecar's largest burst of
short-lived objects; what outlives a burst pins the allocator pages it took, so the
burst's size is what bounds the step. This measures it on the sidecar's own code: a
FakeApiServer in a child process holds ``--pods`` pods on ``node-1`` shaped like the
soak's (a claim, a running status, three field managers' ``managedFields``: about 4 KB
of JSON each); in this process ``kube.NodePods`` lists them through ``kube.Api`` with
``tracemalloc`` on. Before each relist half of the pods change (a label), so the relist
keeps new copies of those, as after a watch that broke while the sidecar wrote.

Per relist: the **burst**, the traced peak during it above the traced memory before it
(every thread's allocations: the answer's bytes, the decoded pages, what is kept), and
what stayed after it. Printed per page size: medians after the first ``--warmup``
rounds, the ratio of the burst to the floor (page size 0: the whole list in one answer,
what the sidecar did before it paged), and the LIST requests per relist.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tracemalloc
from typing import Any

from benchmarks import rssprobe

NODE = "node-1"


def soak_like_pod(i: int) -> dict[str, Any]:
    """A pod as the soak's look on the wire (the size is what matters here)."""
    from kubelet_dra.testing import fakeapi

    pod = fakeapi.make_pod(
        f"relist-{i}", NODE, claims=[fakeapi.PodClaim("gpu", f"relist-{i}-gpu")],
        labels={"app": "soak", "index": str(i)},
    )  # fmt: skip
    # kubectl apply's copy of what it sent, and three managers' field sets: the parts of a
    # real pod that make it about 4 KB (the soak's are 4.9, 2.2 of it managedFields).
    pod["metadata"]["annotations"] = {
        "kubectl.kubernetes.io/last-applied-configuration": json.dumps(pod["spec"])
    }
    fields: dict[str, Any] = {f"f:{key}": {".": {}, f"f:{key}-detail": {}} for key in "abcdef"}
    pod["metadata"]["managedFields"] = [
        {"manager": manager, "operation": "Update", "apiVersion": "v1",
         "time": "2026-12-06T00:00:00Z", "fieldsType": "FieldsV1",
         "fieldsV1": {"f:metadata": {"f:labels": fields}, "f:status": {"f:conditions": fields}}}
        for manager in ("kubectl-client-side-apply", "kubelet", "kubelet-dra-health")
    ]  # fmt: skip
    return pod


PODS = "/api/v1/namespaces/default/pods"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"


def _claim(i: int) -> dict[str, Any]:
    from kubelet_dra.testing import fakeapi

    device = ("gpu.example.com", "pool", f"g{i}", "gpu")
    return fakeapi.make_claim(f"relist-{i}-gpu", results=[device])


def _request(client: Any, method: str, path: str, body: Any, content_type: str) -> None:
    headers = {"Content-Type": content_type, "Authorization": "Bearer fake-token"}
    response = client.call_api(method, client.configuration.host + path, headers, body)
    response.read()
    if response.status >= 300:
        raise RuntimeError(f"{method} {path}: HTTP {response.status}: {response.data[:200]!r}")


async def measure(url: str, pods: int, page_size: int, rounds: int) -> list[tuple[int, int, int]]:
    """``rounds`` relists at ``page_size``: (burst bytes, kept bytes, LIST requests) each."""
    from kubelet_dra import clock
    from kubelet_dra.kube import api as kube_api
    from kubelet_dra.kube import pods as kube_pods
    from kubelet_dra.status import claims

    client = rssprobe.fake_api_client(url)
    api = kube_api.Api(client)
    listed: list[str] = []  # one entry per LIST request
    page = api.list_node_pods

    def list_node_pods(node: str, **kwargs: Any) -> dict[str, Any]:
        listed.append(node)
        return page(node, **kwargs)

    api.list_node_pods = list_node_pods  # type: ignore[method-assign]
    node = kube_pods.NodePods(
        api=api, node_name=NODE, index=claims.ClaimIndex(), writer=_Writer(),  # type: ignore[arg-type]
        clock=clock.SystemClock(), page_size=page_size,
    )  # fmt: skip
    out = []
    try:
        for r in range(rounds):
            for i in range(0, pods, 2):
                patch = {"metadata": {"labels": {"round": f"{page_size}-{r}"}}}
                path = f"/api/v1/namespaces/default/pods/relist-{i}"
                _request(client, "PATCH", path, patch, "application/merge-patch+json")
            lists = len(listed)
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            await node._relist()
            now, peak = tracemalloc.get_traced_memory()
            out.append((peak - before, now - before, len(listed) - lists))
    finally:
        client.close()
    return out


class _Writer:
    def pod_updated(self, pod: Any) -> None:
        pass

    def pod_deleted(self, uid: str) -> None:
        pass

    def mark_dirty(self, uids: Any) -> None:
        pass


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.relistburst", description=__doc__)
    parser.add_argument("--pods", type=int, default=30)
    parser.add_argument("--page-sizes", default="0,5,10", help="comma list; 0 is the floor")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=2)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    ns = parse(argv)
    sizes = [int(s) for s in ns.page_sizes.split(",")]
    if 0 not in sizes:
        sizes.insert(0, 0)
    with rssprobe._child([sys.executable, "-c", rssprobe._FAKE_API]) as (_, url):
        with rssprobe.fake_api_client(url) as client:
            for i in range(ns.pods):
                # The claim first: a pod's missing claim would be read again and again
                # during the relists, and those reads are no part of a relist's burst.
                _request(client, "POST", CLAIMS, _claim(i), "application/json")
                _request(client, "POST", PODS, soak_like_pod(i), "application/json")
        tracemalloc.start()
        results = {s: asyncio.run(measure(url, ns.pods, s, ns.rounds)) for s in sizes}
        tracemalloc.stop()
    floor = statistics.median(b for b, _, _ in results[0][ns.warmup :])
    print(f"relist of {ns.pods} pods, {ns.rounds} relists each, medians after {ns.warmup}")
    print("| page size | burst KiB | ratio to one answer | kept KiB | LISTs per relist |")
    print("|---|---|---|---|---|")
    for size, all_rows in results.items():
        rows = all_rows[ns.warmup :]
        burst = statistics.median(b for b, _, _ in rows)
        kept = statistics.median(k for _, k, _ in rows)
        lists = statistics.median(n for _, _, n in rows)
        label = f"{size}" if size else "0 (one answer, the floor)"
        ratio = burst / floor
        print(f"| {label} | {burst / 1024:.0f} | {ratio:.2f} | {kept / 1024:.0f} | {lists:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
