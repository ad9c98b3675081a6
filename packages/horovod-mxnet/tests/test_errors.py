"""Bad input raises ValueError at the call, naming what was expected; ranks that disagree get
HorovodInternalError on every rank, and Horovod stays usable afterwards."""

import numpy as np
import pytest
from jobs import SIZES, results, worker


def _raises(kinds, fn, *words):
    """1 when ``fn()`` raises one of ``kinds`` whose message contains every word, else an
    AssertionError saying what happened."""
    try:
        fn()
    except kinds as e:
        missing = [w for w in words if w.lower() not in str(e).lower()]
        if missing:
            raise AssertionError(f'message {str(e)!r} lacks {missing}') from e
        return 1
    raise AssertionError(f'{fn} did not raise {kinds}')


@worker
def submission_errors():
    """Mistakes each rank sees on its own, without any collective starting."""
    import horovod.mxnet as hvd
    import mxnet as mx
    x = mx.nd.ones((4, 2))
    cases = {
        'not_ndarray': lambda: hvd.allreduce(np.ones(3), name='e1'),
        'list_for_grouped': lambda: hvd.grouped_allreduce(x, name='e2'),
        'empty_group': lambda: hvd.grouped_allgather([], name='e3'),
        'bool_allreduce': lambda: hvd.allreduce(mx.nd.ones((2,), dtype='bool'), name='e4'),
        'uint8_reducescatter': lambda: hvd.reducescatter(mx.nd.ones((2,), dtype='uint8')),
        'sparse': lambda: hvd.allreduce(x.tostype('row_sparse'), name='e5'),
        'root_type': lambda: hvd.broadcast(x, '0', name='e6'),
        'root_out_of_range': lambda: hvd.broadcast_(x, hvd.size() + 3, name='e7'),
        'priority_type': lambda: hvd.allgather(x, name='e8', priority=1.5),
        'splits_type': lambda: hvd.alltoall(x, splits='2', name='e9'),
        'splits_dtype': lambda: hvd.alltoall(x, splits=mx.nd.array([4] * hvd.size()),
                                             name='e10'),
        'splits_sum': lambda: hvd.alltoall(x, splits=[5] + [0] * (hvd.size() - 1), name='e11'),
        'scalar_reducescatter': lambda: hvd.reducescatter(mx.nd.array(np.float32(3.0))),
        'scalar_in_group': lambda: hvd.grouped_reducescatter([x, mx.nd.array(np.float32(1))]),
        'op_and_average': lambda: hvd.allreduce(x, average=True, op=hvd.Sum, name='e12'),
        'unknown_op': lambda: hvd.allreduce(x, op=17, name='e13'),
        'unregistered_set': lambda: hvd.allreduce(x, process_set=hvd.ProcessSet([0]),
                                                  name='e14'),
        'set_type': lambda: hvd.allgather(x, process_set=[0], name='e15'),
    }
    outcome = {name: _raises(ValueError, fn) for name, fn in cases.items()}
    # Upstream asserts on these ops; ours are ValueErrors that are AssertionErrors too.
    for kind in (ValueError, AssertionError):
        outcome[f'adasum_{kind.__name__}'] = _raises(
            kind, lambda: hvd.allreduce(x, op=hvd.Adasum, name='e16'), 'Adasum')
        outcome[f'reducescatter_min_{kind.__name__}'] = _raises(
            kind, lambda: hvd.reducescatter(x, op=hvd.Min, name='e17'), 'Average', 'Sum')
    outcome['parameters_type'] = _raises(ValueError,
                                         lambda: hvd.broadcast_parameters([x]), 'list')
    outcome['parameters_prefix'] = _raises(
        ValueError, lambda: hvd.broadcast_parameters({'x': x}, prefix=3), 'prefix')
    outcome['trainer_prefix'] = _raises(
        ValueError, lambda: hvd.DistributedTrainer({}, 'sgd', prefix=1), 'prefix')
    outcome['optimizer_type'] = _raises(
        ValueError, lambda: hvd.DistributedOptimizer('sgd'), 'Optimizer')
    outcome['predivide'] = _raises(
        ValueError, lambda: hvd.DistributedOptimizer(mx.optimizer.SGD(),
                                                     gradient_predivide_factor=0), 'positive')
    # Still usable after all of that.
    total = hvd.allreduce(mx.nd.ones((3,)), op=hvd.Sum, name='after_errors').asnumpy()
    outcome['usable'] = int(total.tolist() == [hvd.size()] * 3)
    return outcome


@worker
def mismatch_errors():
    """Ranks that disagree: every rank gets HorovodInternalError, and the next op works."""
    import horovod.mxnet as hvd
    import mxnet as mx
    rank, size = hvd.rank(), hvd.size()
    if size == 1:
        return None
    kinds = (hvd.HorovodInternalError, mx.base.MXNetError)
    outcome = {
        'allreduce_shape': _raises(kinds, lambda: hvd.allreduce(
            mx.nd.ones((2 + rank,)), name='shape'), 'shape'),
        'allreduce_dtype': _raises(kinds, lambda: hvd.allreduce(
            mx.nd.ones((2,), dtype='float32' if rank else 'float64'), name='dtype')),
        'allgather_tail': _raises(kinds, lambda: hvd.allgather(
            mx.nd.ones((2, 1 + rank)), name='tail')),
        'broadcast_root': _raises(kinds, lambda: hvd.broadcast(
            mx.nd.ones((2,)), root_rank=rank, name='root')),
        'reducescatter_shape': _raises(kinds, lambda: hvd.reducescatter(
            mx.nd.ones((size, 1 + rank)), name='rs_shape')),
    }
    x = mx.nd.array([float(rank)] * 2)
    total = hvd.allreduce(x, op=hvd.Sum, name='after_mismatch').asnumpy().tolist()
    outcome['usable'] = int(total == [size * (size - 1) / 2] * 2)
    return outcome


@pytest.mark.parametrize('np_', SIZES)
def test_submission_errors(np_):
    for outcome in results(submission_errors, np_):
        assert all(v == 1 for v in outcome.values()), outcome
        assert len(outcome) == 28, outcome


@pytest.mark.parametrize('np_', [n for n in SIZES if n > 1])
def test_mismatch_errors_on_every_rank(np_):
    for outcome in results(mismatch_errors, np_):
        assert outcome == {'allreduce_shape': 1, 'allreduce_dtype': 1, 'allgather_tail': 1,
                           'broadcast_root': 1, 'reducescatter_shape': 1, 'usable': 1}, outcome
