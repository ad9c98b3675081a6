"""Join (core.md §6.9) through numpy arrays: joined ranks contribute zeros to allreduces, other
collectives fail while a rank is joined, and join returns the last rank to join on every rank."""

import pytest

from horovod_testing import run_ranks
from horovod_testing.collectives import NumpyAdapter, run_join_suite


@pytest.mark.parametrize("cache", [None, "0"])
@pytest.mark.parametrize("np_", [1, 2, 3])
def test_join(np_, cache):
    env = {} if cache is None else {"HOROVOD_CACHE_CAPACITY": cache}
    results = run_ranks(np_, run_join_suite, NumpyAdapter, env=env, timeout=180)
    assert len(results) == np_
    for rank, (last, cases, _) in enumerate(results):
        assert last == np_ - 1, results
        # 4 allreduces per step before joining, 1 allgather after; then 4 failing ops and 1 allreduce.
        assert cases == 4 * 2 * rank + 1 + (5 if rank and np_ > 1 else 0), (rank, cases)
    if np_ > 1:
        assert len({second for _, _, second in results}) == 1 and results[0][2] in range(1, np_), results
