"""Bad API objects under a live pipeline: odd pods and claims never stop the good pods.

In process: FakeDriver -> DRAHealthManager -> FakeApiServer. Next to two good
pods the node runs pods and claims with missing or unexpected fields, claims
allocated to other drivers, claims that do not exist and claims deleted while
pods still reference them. The pipeline must stay up, keep the good pods
exact through health changes, and never write a pod of another node.
"""

from __future__ import annotations

import pathlib
import random
from typing import Any

from kubelet_dra.testing import FakeApiServer, eventually, make_claim, make_pod

from ..faults import _faults as fx

OTHER = "other.example.com"


def _odd_objects(api: FakeApiServer) -> list[str]:
    """Create the odd pods; return their names."""
    odd: list[str] = []

    def pod(name: str, mutate: Any = None, claims: list[str] | None = None) -> None:
        obj = make_pod(name, fx.NODE, claims=claims or [])
        if mutate is not None:
            mutate(obj)
        api.create_pod(obj)
        odd.append(name)

    pod("no-claims")
    pod("no-spec-claims", lambda p: p["spec"].pop("resourceClaims", None))
    pod("no-containers-resources", lambda p: p["spec"]["containers"][0].pop("resources", None))
    pod("no-status", lambda p: p.pop("status", None))
    pod("extra-fields", lambda p: p.update(future={"x": 1}) or p["spec"].update(futureField=[1]))
    pod(
        "claim-without-name",
        lambda p: p["spec"]["resourceClaims"][0].pop("resourceClaimName", None),
        claims=["gone-template"],
    )
    pod("claim-missing", claims=["never-created"])
    api.create_claim(make_claim("other-driver", results=[(OTHER, "pool", "x-0", "gpu")]))
    pod("other-driver", claims=["other-driver"])
    mixed = [(OTHER, "pool", "x-1", "gpu"), (fx.DRIVER, "pool", "gpu-2", "gpu")]
    api.create_claim(make_claim("mixed", results=mixed))
    pod("mixed", claims=["mixed"])
    api.create_claim(make_claim("deleted-later", results=[(fx.DRIVER, "pool", "gpu-3", "gpu")]))
    pod("claim-deleted", claims=["deleted-later"])
    unallocated = make_claim("unallocated")
    unallocated.pop("status", None)
    api.create_claim(unallocated)
    pod("claim-unallocated", claims=["unallocated"])
    bad_results = make_claim("bad-results", results=[(fx.DRIVER, "pool", "gpu-0", "gpu")])
    for result in bad_results["status"]["allocation"]["devices"]["results"]:
        result.pop("pool")
        result["unexpected"] = {"nested": True}
    api.create_claim(bad_results)
    pod("bad-results", claims=["bad-results"])
    return odd


async def test_odd_pods_and_claims_never_stop_the_good_ones(
    sockdir: pathlib.Path, api: FakeApiServer
) -> None:
    world = fx.World(4, random.Random(7))
    for i in range(2):
        fx.add_pod(api, f"good-{i}", i)
        world.pods[f"good-{i}"] = i
    odd = _odd_objects(api)
    api.create_pod(make_pod("elsewhere", "node-2", claims=["mixed"]))
    async with fx.converged(api, sockdir, world) as (driver, mgr):
        api.delete_claim("default", "deleted-later")
        for _ in range(3):
            world.mutate()
            await driver.set_health(*world.reports())
            await eventually(
                lambda: world.converged(api), what="good pods after a change", timeout=15
            )
        mixed = fx.pod_health(api, "mixed")
        assert mixed.get(fx.resource_id(2)) == world.expected_health(2)
        # Regression: a claim that does not exist (404) kept /readyz at
        # "claim cache not synced" for as long as a pod referenced it.
        await eventually(
            lambda: mgr.readiness() == {"store": "ok", "pods": "ok", "claims": "ok"}, timeout=5
        )
        readiness = mgr.readiness()
    assert not api.status_writes("default", "elsewhere")
    print(f"\nodd API objects: {len(odd)} odd pods next to 2 good ones; readiness {readiness}")
