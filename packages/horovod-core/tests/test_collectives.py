"""Every collective and dtype through numpy arrays, at np = 1, 2 and 3, against numpy references."""

import pytest

from horovod_testing import run_ranks
from horovod_testing.collectives import NumpyAdapter, run_collective_suite


@pytest.mark.parametrize("np_", [1, 2, 3])
def test_collectives_numpy(np_):
    results = run_ranks(np_, run_collective_suite, NumpyAdapter, timeout=180)
    assert len(results) == np_
    for counts in results:
        assert counts["check_allreduce"] >= 700
        assert counts["check_broadcast"] == 60 * np_
        assert counts["check_allgather"] == 30


@pytest.mark.parametrize("threshold", ["0", "64"])
def test_fusion_threshold_does_not_change_results(threshold):
    # 0 disables fusion; 64 bytes forces groups to split into several fused operations.
    run_ranks(2, run_collective_suite, NumpyAdapter, env={"HOROVOD_FUSION_THRESHOLD": threshold}, timeout=180)
