"""One worker body for every binding: the mistakes that used to hang a job forever (issue "never
hang") end as errors on every rank, through the binding's public API. Run it with
run_ranks(np, hang_checks, 'horovod.torch', on_subset, env=HANG_ENV) and check the results with
check_hang_results(results, on_subset).

Two mistakes are made here; the object collectives' two are in objects.py:
- ``operation``: rank 0 of the set calls ``allreduce(t, name='m')`` while the others call
  ``allgather(t, name='m')``: a mismatch, reported at negotiation without waiting for the timeout;
- ``skip``: rank 0 of the set allreduces ``a`` that the others skip, then every rank allreduces
  ``b``: a deadlock, reported on every rank once the deadlock timeout has passed.
After each, a correct collective on the set and then on the global set must work."""

import importlib
import time

import numpy as np

DEADLOCK_TIMEOUT_S = 2.0
HANG_ENV = {'HOROVOD_DEADLOCK_TIMEOUT_SECONDS': str(DEADLOCK_TIMEOUT_S)}
SUBSET = [0, 1]


def _framework(module):
    """(make: list of floats -> the binding's float32 tensor, values: tensor -> list of floats)."""
    if module == 'horovod.torch':
        import torch
        return (lambda v: torch.tensor(v, dtype=torch.float32)), (lambda t: t.tolist())
    if module in ('horovod.tensorflow', 'horovod.keras', 'horovod.tensorflow.keras'):
        import tensorflow as tf
        return (lambda v: tf.constant(v, dtype=tf.float32)), (lambda t: t.numpy().tolist())
    if module == 'horovod.mxnet':
        import mxnet as mx
        return (lambda v: mx.nd.array(v, dtype=np.float32)), (lambda t: t.asnumpy().tolist())
    raise ValueError(f'unknown binding module {module!r}')


def _outcome(call):
    start = time.monotonic()
    try:
        return ('returned', call(), time.monotonic() - start)
    except Exception as e:  # noqa: BLE001 - the test compares types and messages
        return (type(e).__name__, str(e), time.monotonic() - start)


def hang_checks(module, on_subset):
    """Runs on each rank: both mistakes on the global set, or on the set of global ranks 0 and 1
    when ``on_subset``. Returns a dict: ``operation`` and ``skip`` are (exception type name or
    'returned', message or value, seconds), ``after`` the set's correct allreduce (None outside
    the set), ``global`` the global set's."""
    hvd = importlib.import_module(module)
    make, values = _framework(module)
    subset = hvd.ProcessSet(SUBSET) if on_subset else None
    hvd.init(process_sets=[subset] if on_subset else None)
    rank = hvd.rank()
    pset = subset if on_subset else hvd.global_process_set
    member = not on_subset or rank in SUBSET
    out = {'operation': None, 'skip': None, 'after': None}
    if member:
        first = rank == 0  # global rank 0 is rank 0 of either set

        def operation():
            t = make([1.0, 2.0, 3.0])
            if first:
                return values(hvd.allreduce(t, name='m', op=hvd.Sum, process_set=pset))
            return values(hvd.allgather(t, name='m', process_set=pset))

        def skip():
            if first:
                values(hvd.allreduce(make([1.0]), name='a', op=hvd.Sum, process_set=pset))
            return values(hvd.allreduce(make([2.0]), name='b', op=hvd.Sum, process_set=pset))

        out['operation'] = _outcome(operation)
        out['skip'] = _outcome(skip)
        out['after'] = values(hvd.allreduce(make([float(rank), 10.0 * rank]), name='after', op=hvd.Sum,
                                            process_set=pset))
    out['global'] = values(hvd.allreduce(make([rank + 1.0]), name='global', op=hvd.Sum))
    return out


def check_hang_results(results, on_subset):
    """Asserts on run_ranks' list of hang_checks results."""
    n = len(results)
    members = SUBSET if on_subset else list(range(n))
    for rank, out in enumerate(results):
        assert out['global'] == [float(sum(r + 1.0 for r in range(n)))], (rank, out['global'])
        if rank not in members:
            assert out['operation'] is None and out['skip'] is None and out['after'] is None, (rank, out)
            continue
        assert out['after'] == [float(sum(members)), 10.0 * sum(members)], (rank, out['after'])

        kind, message, seconds = out['operation']
        assert kind != 'returned', (rank, out['operation'])
        assert 'Mismatched operations' in message, (rank, kind, message)
        assert "the name 'm'" in message and 'allreduce.m' in message and 'allgather.m' in message, message
        assert seconds < 10 * DEADLOCK_TIMEOUT_S + 20, (rank, seconds)

        kind, message, seconds = out['skip']
        assert kind != 'returned', (rank, out['skip'])
        assert 'Deadlock' in message and 'HOROVOD_DEADLOCK_TIMEOUT_SECONDS' in message, (rank, kind, message)
        # Names what rank 0 waits on and what the others wait on.
        assert 'rank 0' in message and '.a (ALLREDUCE' in message and '.b (ALLREDUCE' in message, message
        assert DEADLOCK_TIMEOUT_S <= seconds < 10 * DEADLOCK_TIMEOUT_S + 20, (rank, seconds)


def hang_test(module):
    """The pytest test of a binding: both mistakes at np 2, np 3 and on a process set at np 3.
    A package's test module binds it: ``test_mistakes_raise_on_every_rank_then_collectives_work =
    hang_test('horovod.torch')``."""
    import pytest

    from horovod_testing import run_ranks

    @pytest.mark.parametrize('np_,on_subset', [(2, False), (3, False), (3, True)], ids=['np2', 'np3', 'np3-set'])
    def test(np_, on_subset):
        check_hang_results(run_ranks(np_, hang_checks, module, on_subset, env=HANG_ENV, timeout=300), on_subset)

    return test
