"""Process sets (core.md §2.1, §5) through numpy arrays: every collective on subsets of the ranks,
membership errors, disjoint sets at once, id reuse, static registration."""

import pytest

from horovod_testing import run_ranks
from horovod_testing.collectives import NumpyAdapter
from horovod_testing.process_sets import run_process_set_suite, run_static_process_set_suite


def _dynamic_sets(np_):
    # The sets run_process_set_suite adds: even ranks, {0, size-1} and [size-1], without repeats
    # or the global set.
    sets = []
    for ranks in (list(range(0, np_, 2)), sorted({0, np_ - 1}), [np_ - 1]):
        if ranks != list(range(np_)) and ranks not in sets:
            sets.append(ranks)
    return sets


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_dynamic_process_sets(np_):
    results = run_ranks(np_, run_process_set_suite, NumpyAdapter, timeout=240)
    assert len(results) == np_
    sets = _dynamic_sets(np_)
    for rank, counts in enumerate(results):
        assert counts["registry"] == 8, counts
        assert counts["concurrent"] == 40, counts
        memberships = sum(rank in ranks for ranks in sets)
        assert counts["identity"] == 3 * len(sets), counts
        assert counts["member_ops"] >= 55 * memberships, (rank, counts)
        assert counts["non_member_ops"] == 6 * (len(sets) - memberships), (rank, counts)


@pytest.mark.parametrize("np_", [2, 3])
def test_static_process_sets(np_):
    results = run_ranks(np_, run_static_process_set_suite, NumpyAdapter, timeout=240)
    assert len(results) == np_
    for counts in results:
        assert counts["registry"] == 6, counts
        assert counts["member_ops"] > 50 and counts["non_member_ops"] == 6, counts
