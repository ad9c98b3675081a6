"""One worker body for every binding's broadcast_object / allgather_object (run it with
run_ranks(np, object_checks, 'horovod.torch'), and check_object_results on the results)."""

import importlib
import threading


def object_checks(module):
    """Runs on each rank: the documented idioms and failures of the object collectives of the
    binding ``module`` (``'horovod.torch'``, ``'horovod.tensorflow'``, ``'horovod.keras'``, ...).
    Returns a dict of outcomes; each failure is recorded as (exception type name, message)."""
    hvd = importlib.import_module(module)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    out = {}
    # The documented idiom: only the root has the object, the others pass None.
    out['idiom'] = hvd.broadcast_object({'weights': [1.5, 2.5], 'from': r} if r == 0 else None, root_rank=0)
    out['last_root'] = hvd.broadcast_object(('last', r) if r == n - 1 else None, root_rank=n - 1)
    # Objects of different types on different ranks.
    out['gathered'] = hvd.allgather_object(r if r % 2 else f'rank{r}')
    lock = threading.Lock()  # cloudpickle cannot serialise it
    out['broadcast_failure'] = _outcome(lambda: hvd.broadcast_object(lock if r == 0 else None, root_rank=0))
    out['allgather_failure'] = _outcome(lambda: hvd.allgather_object(lock if r == n - 1 else r))
    # The ranks are still in step: a correct collective after the failures.
    out['after'] = hvd.allgather_object(10 * r)
    out['after_broadcast'] = hvd.broadcast_object([r] * 3 if r == 0 else 'ignored', root_rank=0)
    return out


def _outcome(call):
    try:
        return ('returned', call())
    except Exception as e:  # noqa: BLE001 - the test compares types and messages
        return (type(e).__name__, str(e))


def check_object_results(results):
    """Asserts on run_ranks' list of object_checks results."""
    n = len(results)
    for r, out in enumerate(results):
        assert out['idiom'] == {'weights': [1.5, 2.5], 'from': 0}, (r, out['idiom'])
        assert out['last_root'] == ('last', n - 1), (r, out['last_root'])
        assert out['gathered'] == [i if i % 2 else f'rank{i}' for i in range(n)], (r, out['gathered'])
        kind, message = out['broadcast_failure']
        if r == 0:
            assert kind == 'TypeError' and 'pickle' in message, (r, kind, message)
        else:
            assert kind == 'ObjectTransferError', (r, kind, message)
            assert 'root rank 0' in message and 'TypeError' in message and 'pickle' in message, message
        kind, message = out['allgather_failure']
        if r == n - 1:
            assert kind == 'TypeError' and 'pickle' in message, (r, kind, message)
        else:
            assert kind == 'ObjectTransferError', (r, kind, message)
            assert f'rank {n - 1}: TypeError' in message, message
        assert out['after'] == [10 * i for i in range(n)], (r, out['after'])
        assert out['after_broadcast'] == [0, 0, 0], (r, out['after_broadcast'])


SUBSET = [0, 1]


def subset_object_checks(module):
    """Runs on each rank of a job of 3 or more: broadcast_object's idiom and a root that cannot
    serialise its object, on the process set of global ranks 0 and 1 (bindings whose
    broadcast_object takes ``process_set``), then a global allgather_object."""
    hvd = importlib.import_module(module)
    subset = hvd.ProcessSet(SUBSET)
    hvd.init(process_sets=[subset])
    r = hvd.rank()
    out = {}
    if r in SUBSET:
        out['idiom'] = hvd.broadcast_object({'from': r} if r == 0 else None, root_rank=0, process_set=subset)
        lock = threading.Lock()  # cloudpickle cannot serialise it
        out['failure'] = _outcome(lambda: hvd.broadcast_object(lock if r == 0 else None, root_rank=0,
                                                                process_set=subset))
        out['after'] = hvd.broadcast_object([r] * 2 if r == 0 else None, root_rank=0, process_set=subset)
    out['global'] = hvd.allgather_object(r)
    return out


def check_subset_object_results(results):
    """Asserts on run_ranks' list of subset_object_checks results."""
    n = len(results)
    for r, out in enumerate(results):
        assert out['global'] == list(range(n)), (r, out['global'])
        if r not in SUBSET:
            assert set(out) == {'global'}, (r, out)
            continue
        assert out['idiom'] == {'from': 0}, (r, out['idiom'])
        kind, message = out['failure']
        if r == 0:
            assert kind == 'TypeError' and 'pickle' in message, (r, kind, message)
        else:
            assert kind == 'ObjectTransferError' and 'root rank 0' in message, (r, kind, message)
        assert out['after'] == [0, 0], (r, out['after'])
