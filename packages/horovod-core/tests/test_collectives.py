"""Every collective and dtype through numpy arrays, at np = 1, 2, 3 and 4, against numpy references
(horovod_testing.collectives)."""

import pytest

from horovod_testing import run_ranks
from horovod_testing.collectives import NumpyAdapter, run_collective_suite

# np=4 oversubscribes small machines: it runs the new collectives and leaves the 700 allreduce cases to np <= 3.
_NP4_CHECKS = ["check_grouped_allreduce", "check_allgather", "check_empty_tensors", "check_grouped_allgather",
               "check_alltoall", "check_reducescatter", "check_grouped_reducescatter", "check_barrier"]


def _assert_counts(counts, np_, fusion_threshold=None):
    assert counts["check_grouped_allreduce"] == 6
    assert counts["check_allgather"] == 30
    assert counts["check_empty_tensors"] == 37
    assert counts["check_grouped_allgather"] == 1
    assert counts["check_alltoall"] == 48
    reducescatter_shapes = 3 if np_ > 1 else 2
    if fusion_threshold is None:
        assert counts["check_reducescatter"] == 5 * 2 * reducescatter_shapes * 2
    else:
        # Prescaled cases over the threshold are left out; one case checks that they fail.
        assert 5 * 2 * reducescatter_shapes < counts["check_reducescatter"] < 5 * 2 * reducescatter_shapes * 2
    assert counts["check_grouped_reducescatter"] == 2
    assert counts["check_barrier"] == 4


@pytest.mark.parametrize("np_", [1, 2, 3])
def test_collectives_numpy(np_):
    results = run_ranks(np_, run_collective_suite, NumpyAdapter, timeout=240)
    assert len(results) == np_
    for counts in results:
        assert counts["check_allreduce"] >= 700
        assert counts["check_broadcast"] == 60 * np_
        _assert_counts(counts, np_)


def test_collectives_numpy_np4():
    results = run_ranks(4, run_collective_suite, NumpyAdapter, _NP4_CHECKS, timeout=300)
    assert len(results) == 4
    for counts in results:
        assert sorted(counts) == sorted(_NP4_CHECKS)
        _assert_counts(counts, 4)


@pytest.mark.parametrize("threshold", ["0", "64"])
def test_fusion_threshold_does_not_change_results(threshold):
    # 0 disables fusion; 64 bytes forces groups to split into several fused operations.
    results = run_ranks(2, run_collective_suite, NumpyAdapter, env={"HOROVOD_FUSION_THRESHOLD": threshold},
                        timeout=240)
    for counts in results:
        assert counts["check_allreduce"] >= 700
        _assert_counts(counts, 2, fusion_threshold=int(threshold))
