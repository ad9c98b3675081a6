"""Mistakes that used to hang a job, made through horovod.mxnet's public API: one name used for
different collectives, and a tensor one rank skips, at np 2 and 3 and on a process set, end with an
error on every rank of the set (a mismatch at negotiation; a deadlock after
HOROVOD_DEADLOCK_TIMEOUT_SECONDS), after which correct collectives work."""

import pytest

from horovod_testing import run_ranks
from horovod_testing.hangs import HANG_ENV, check_hang_results, hang_checks


@pytest.mark.parametrize('np_,on_subset', [(2, False), (3, False), (3, True)], ids=['np2', 'np3', 'np3-set'])
def test_mistakes_raise_on_every_rank_then_collectives_work(np_, on_subset):
    results = run_ranks(np_, hang_checks, 'horovod.mxnet', on_subset, env=HANG_ENV, timeout=300)
    check_hang_results(results, on_subset)
