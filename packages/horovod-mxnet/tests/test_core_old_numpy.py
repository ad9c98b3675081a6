"""horovod-core from numpy 1.23: MXNet 1.9.1 pins numpy < 1.24, so this virtualenv is where the
core's framework-neutral API (horovod.common with numpy arrays) meets an old numpy. The shared
collective suite at np=2, every op and dtype (bool results included), against numpy references."""

import numpy as np

from horovod_testing import run_ranks
from horovod_testing.collectives import NumpyAdapter, run_collective_suite


def test_numpy_is_old_here():
    # The point of this file: MXNet's virtualenv keeps numpy 1.23.
    assert tuple(int(p) for p in np.__version__.split(".")[:2]) < (1, 24), np.__version__


def test_collective_suite_with_old_numpy():
    results = run_ranks(2, run_collective_suite, NumpyAdapter, timeout=300)
    for counts in results:
        assert counts["check_allreduce"] >= 700
        assert counts["check_allgather"] == 30
        assert counts["check_alltoall"] == 48
        assert counts["check_broadcast"] == 120
