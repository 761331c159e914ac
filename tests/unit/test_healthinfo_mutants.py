"""The health cache's survivors of the mutation run after commit 31f19df.

31f19df made a plain renewal skip the heap: ``HealthCache._apply`` schedules a
device only when its deadline moves (new, revived or earlier), and skips a device
that is neither moved, visible nor due for persisting. Leases are wall-clock times
(``kubelet_dra.clock``), so a clock stepped back makes a plain renewal's deadline
earlier than the one before: the case no other test reaches, where a renewal is
moved without being visible or persisted. The other survivors of that run are
declared equivalent in ``tests/mutation/score.py`` (docs/testing.md gives why).
"""

from __future__ import annotations

from kubelet_dra import models
from kubelet_dra.state import healthinfo
from tests.unit._cache_sink import Sink

H = models.HealthStatus
T0 = 1_000_000.0
DRV = "drv"


def rep(device: str, *, message: str = "") -> models.DeviceReport:
    return models.DeviceReport("pool", device, H.HEALTHY, message, 0)


def key(device: str) -> models.DeviceKey:
    return models.DeviceKey(DRV, "pool", device)


def test_a_renewal_after_the_clock_stepped_back_expires_at_its_earlier_deadline() -> None:
    # With a sink, the renewal 10 s "before" the first report is neither visible nor
    # due for persisting (the persisted copy is not older than half the lease): only
    # its earlier deadline (T0 + 20 instead of T0 + 30) makes it need the heap.
    sink = Sink()
    cache = healthinfo.HealthCache(sink=sink)
    cache.update(DRV, [rep("a", message="ok")], now=T0)
    sink.calls.clear()
    assert cache.update(DRV, [rep("a", message="ok")], now=T0 - 10) == []
    assert sink.calls == []
    assert cache.next_deadline() == T0 + 20
    assert cache.expire(T0 + 20.5) == [key("a")]
    assert cache.get(key("a"), T0 + 20.5).health is H.UNKNOWN


def test_a_device_revived_after_the_clock_stepped_back_is_scheduled_again() -> None:
    # Expired at T0 + 31 (its heap entry popped), then the wall clock steps back and the
    # driver reports it at T0 + 20: its old deadline (T0 + 30) lies between now and the
    # new one, so "the deadline did not move earlier" held, and until 2026-12-04 the
    # revived device was left without a heap entry: no next deadline, and no expiry at
    # T0 + 51 although it reads Unknown then (found reading the mutation survivors).
    cache = healthinfo.HealthCache()
    cache.update(DRV, [rep("a")], now=T0)
    assert cache.expire(T0 + 31) == [key("a")]
    cache.update(DRV, [rep("a")], now=T0 + 20)
    assert cache.get(key("a"), T0 + 21).health is H.HEALTHY
    deadline = cache.next_deadline()
    assert deadline is not None and deadline <= T0 + 50
    assert cache.expire(T0 + 51) == [key("a")]
    assert cache.get(key("a"), T0 + 51).health is H.UNKNOWN
