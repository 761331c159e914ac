"""The PodResources names client: the kubelet's answers read right, and its loop on a fake clock.

The loop runs over real gRPC on a unix socket (:class:`FakePodResources`), with time
injected: backoff delays are what the clock was asked to sleep, never real waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import random
from collections.abc import AsyncIterator

import pytest

from kubelet_dra import clock as clock_mod
from kubelet_dra import settings as settings_mod
from kubelet_dra._proto.podresources.v1 import api_pb2 as pb
from kubelet_dra.plugin import streams
from kubelet_dra.state import podresources
from kubelet_dra.status import claims
from kubelet_dra.testing import (
    FakePodResources,
    PodResourcesDevice,
    eventually,
    make_claim,
    make_pod,
)

K = claims.ClaimKey
N = claims.NameKey
D = PodResourcesDevice


def _resource(driver: str, device: str, *ids: str, share: str | None = None) -> pb.ClaimResource:
    return pb.ClaimResource(
        cdi_devices=[pb.CDIDevice(name=i) for i in ids],
        driver_name=driver,
        pool_name="pool",
        device_name=device,
        share_id=share,
    )


def _pod(*resources: pb.DynamicResource) -> pb.PodResources:
    container = pb.ContainerResources(name="main", dynamic_resources=list(resources))
    return pb.PodResources(name="p", namespace="ns", containers=[container])


# -- the kubelet's answers ------------------------------------------------------


def test_each_device_gets_its_own_ids_out_of_the_kubelets_growing_list() -> None:
    # As GetDynamicResources builds it: device n of a driver lists devices 0..n's IDs.
    claim = pb.DynamicResource(claim_name="c", claim_namespace="ns", claim_resources=[
        _resource("tpu", "t0", "tpu=common", "tpu=chip0"),
        _resource("tpu", "t1", "tpu=common", "tpu=chip0", "tpu=common", "tpu=chip1"),
        _resource("gpu", "g0", "gpu=g0"),
    ])  # fmt: skip
    assert podresources.claim_names(_pod(claim)) == {
        K("ns", "c"): {
            N("tpu", "pool", "t0"): ("tpu=common", "tpu=chip0"),
            N("tpu", "pool", "t1"): ("tpu=common", "tpu=chip1"),
            N("gpu", "pool", "g0"): ("gpu=g0",),
        }
    }


def test_a_kubelet_that_lists_each_devices_own_ids_reads_the_same() -> None:
    claim = pb.DynamicResource(claim_name="c", claim_resources=[
        _resource("gpu", "g0", "gpu=g0"), _resource("gpu", "g1", "gpu=g1", share="s1"),
    ])  # fmt: skip
    assert podresources.claim_names(_pod(claim)) == {
        K("ns", "c"): {
            N("gpu", "pool", "g0"): ("gpu=g0",),
            N("gpu", "pool", "g1", "s1"): ("gpu=g1",),
        }
    }


def test_a_container_without_dynamic_resources_names_nothing() -> None:
    assert podresources.claim_names(_pod()) == {}
    assert podresources.claim_names(_pod(pb.DynamicResource(claim_name="c"))) == {}


# -- the index -------------------------------------------------------------------


def test_names_lay_over_the_api_claim_and_keep_its_request_names() -> None:
    index = claims.ClaimIndex()
    index.set_pod(make_pod("p", claims=["c"]))
    index.set_claim(make_claim("c", results=[("gpu", "pool", "g0", "req")]))
    delta = index.set_claim_names("default", "c", {N("gpu", "pool", "g0"): ("v.com/gpu=0",)})
    claim = index.claim(K("default", "c"))
    assert claim is not None and delta.pods
    (dev,) = claim.devices
    assert (dev.kubelet_id, dev.request_names) == ("v.com/gpu=0", ("req",))
    # The claim read again from the API keeps the names.
    index.set_claim(make_claim("c", results=[("gpu", "pool", "g0", "req")]))
    assert index.resource_ids(dev.key) == ("v.com/gpu=0", "v.com/gpu=0")


def test_names_go_with_the_last_pod_of_the_claim() -> None:
    index = claims.ClaimIndex()
    pod = make_pod("p", claims=["c"])
    pod["metadata"]["uid"] = "uid-p"
    index.set_pod(pod)
    index.set_claim_names("default", "c", {N("gpu", "pool", "g0"): ("v.com/gpu=0",)})
    assert index.claim_names("default", "c")
    index.remove_pod("uid-p")
    assert index.claim_names("default", "c") is None


# -- the loop, on a fake clock ------------------------------------------------------

SETTINGS = settings_mod.Settings(
    stream_backoff_initial=1.0, stream_backoff_max=30.0, stream_backoff_reset_after=60.0
)


class Names:
    def __init__(self) -> None:
        self.got: dict[claims.ClaimKey, claims.ClaimNames] = {}

    def __call__(self, key: claims.ClaimKey, names: claims.ClaimNames) -> None:
        self.got[key] = names


@contextlib.asynccontextmanager
async def running(
    client: podresources.PodResourcesClient,
) -> AsyncIterator[podresources.PodResourcesClient]:
    task = asyncio.create_task(client.run())
    try:
        yield client
    finally:
        await clock_mod.cancel_and_wait(task)


def _client(
    sock: pathlib.Path, names: Names, clock: clock_mod.FakeClock
) -> podresources.PodResourcesClient:
    return podresources.PodResourcesClient(
        sock, apply=names, settings=SETTINGS, clock=clock, rng=random.Random(7)
    )


def _expected_delays(n: int) -> list[float]:
    backoff = streams.Backoff(initial=1.0, cap=30.0, rng=random.Random(7))
    return [backoff.next() for _ in range(n)]


@pytest.fixture
def sock(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "pod-resources" / "kubelet.sock"


async def test_lists_at_start_and_again_after_a_restart_with_the_streams_backoff(
    sock: pathlib.Path,
) -> None:
    clock, names = clock_mod.FakeClock(), Names()
    fake = FakePodResources(sock)
    fake.set_claim("default", "c", [D("gpu", "pool", "g0", ("v.com/gpu=0",))])
    fake.set_pod("default", "p", {"main": ["c"]})
    async with fake, running(_client(sock, names, clock)) as client:
        await eventually(lambda: K("default", "c") in names.got)
        assert client.present and client.state is podresources.State.READY
        await fake.stop()  # the kubelet goes down: the client backs off on the clock
        fake.set_claim("default", "c", [D("gpu", "pool", "g0", ("v.com/gpu=renamed",))])
        await clock.wait_for_sleepers(1)
        clock.advance(clock.sleep_calls[-1])  # a failed attempt while the socket is gone
        await clock.wait_for_sleepers(1)
        await fake.start()
        clock.advance(clock.sleep_calls[-1])
        await eventually(
            lambda: (
                names.got[K("default", "c")] == {N("gpu", "pool", "g0"): ("v.com/gpu=renamed",)}
            ),
            what="the names of the List after the restart",
        )
        assert clock.sleep_calls == _expected_delays(len(clock.sleep_calls))
        assert client.reconnects == 2 and fake.calls["List"] == 2


async def test_a_pod_not_listed_is_asked_for_with_get_until_the_kubelet_knows_it(
    sock: pathlib.Path,
) -> None:
    clock, names = clock_mod.FakeClock(), Names()
    async with FakePodResources(sock) as fake, running(_client(sock, names, clock)) as client:
        await fake.wait_for_calls("List")
        client.pod_seen("default", "p", has_claims=True, running=False)
        await fake.wait_for_calls("Get")  # not known yet: a plain error, nothing learned
        await eventually(lambda: client.calls[("Get", "UNKNOWN")] == 1)
        assert not names.got
        fake.set_claim("default", "c", [D("gpu", "pool", "g0", ("v.com/gpu=0",))])
        fake.set_pod("default", "p", {"main": ["c"]})
        client.pod_seen("default", "p", has_claims=True, running=True)
        await eventually(lambda: K("default", "c") in names.got)
        # Named: later events of the pod ask nothing more (the next Get is another pod's).
        client.pod_seen("default", "p", has_claims=True, running=True)
        client.pod_seen("default", "q", has_claims=True, running=False)
        await eventually(lambda: client.calls[("Get", "UNKNOWN")] == 2)
        assert fake.calls["Get"] == 3
        assert client.fallback is None


async def test_unimplemented_falls_back_once_and_retries_at_the_cap(sock: pathlib.Path) -> None:
    clock, names = clock_mod.FakeClock(), Names()
    fake = FakePodResources(sock, unimplemented=True)
    async with fake, running(_client(sock, names, clock)) as client:
        await clock.wait_for_sleepers(1)
        assert client.fallback == podresources.FALLBACK_UNIMPLEMENTED and client.present
        assert clock.sleep_calls == [SETTINGS.stream_backoff_max]
        assert client.note() is not None and "UNIMPLEMENTED" in client.note()  # type: ignore[operator]


async def test_a_running_pod_without_dynamic_resources_means_the_gate_is_off(
    sock: pathlib.Path,
) -> None:
    clock, names = clock_mod.FakeClock(), Names()
    fake = FakePodResources(sock, dynamic_resources=False)
    fake.set_claim("default", "c", [D("gpu", "pool", "g0", ("v.com/gpu=0",))])
    fake.set_pod("default", "p", {"main": ["c"]})
    async with fake, running(_client(sock, names, clock)) as client:
        await fake.wait_for_calls("List")
        assert client.fallback is None  # not known to run yet: maybe just not prepared
        client.pod_seen("default", "p", has_claims=True, running=True)
        await eventually(lambda: client.fallback == podresources.FALLBACK_NO_DYNAMIC_RESOURCES)
        assert not names.got
