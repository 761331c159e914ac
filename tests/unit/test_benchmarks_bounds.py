"""The storm and apiload benchmarks' bounds (issue 20): what a writer may send, exactly.

``storm.bucket_excess`` is how far a request log goes over a full token bucket (burst 100,
50 QPS) in its worst interval; ``apiload.storm_bounds`` the pods x flips and bucket bounds
of an apiload storm. A bound one request too loose would let a writer over the bucket
pass; these pin them on hand-made logs (no processes run).
"""

from __future__ import annotations

from benchmarks import apiload, storm


def test_a_full_bucket_takes_its_burst_at_once_and_then_its_qps() -> None:
    burst = [0.0] * storm.BURST
    assert storm.bucket_excess(burst) == 0  # exactly the burst at one instant
    assert storm.bucket_excess([*burst, 0.0]) == 1  # one more than the bucket holds
    # After the burst, one request every 1/QPS seconds fits exactly; twice as fast does not.
    paced = [*burst, *(k / storm.QPS for k in range(1, 51))]
    assert storm.bucket_excess(paced) <= 1e-9
    hurried = [*burst, *(k / (2 * storm.QPS) for k in range(1, 51))]
    assert storm.bucket_excess(hurried) >= 24


def test_the_worst_interval_counts_wherever_it_is() -> None:
    # A quiet second, then a burst and one more: the excess is the late interval's.
    late = [0.0, *([5.0] * (storm.BURST + 1))]
    assert storm.bucket_excess(late) == 1
    assert storm.bucket_excess([]) == float("-inf")


def test_an_apiload_storm_allows_one_write_per_pod_and_flip_and_the_full_bucket() -> None:
    writes, bucket = apiload.storm_bounds(10, 20.0)
    assert writes == 10 * (20.0 / apiload.FLIP + 1) == 410
    assert bucket == apiload.BURST + apiload.QPS * 20.0 == 1_100
    assert apiload.storm_bounds(110, 2.0) == (550, 200)
