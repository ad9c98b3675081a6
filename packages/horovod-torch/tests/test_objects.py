"""broadcast_object / allgather_object of horovod.torch: the same default names on every rank whatever
the local object (the idiom ``broadcast_object(obj if rank() == 0 else None)``), and a rank that
cannot serialise its object makes the others raise instead of wait."""

import pytest

from horovod_testing import run_ranks
from horovod_testing.objects import (check_object_results, check_subset_object_results, object_checks,
                                     subset_object_checks)


@pytest.mark.parametrize('np_', [2, 3])
def test_object_collectives(np_):
    check_object_results(run_ranks(np_, object_checks, 'horovod.torch', timeout=300))


def test_broadcast_object_on_a_process_set():
    check_subset_object_results(run_ranks(3, subset_object_checks, 'horovod.torch', timeout=300))
