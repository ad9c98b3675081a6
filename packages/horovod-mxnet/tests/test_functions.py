"""broadcast_parameters (dicts, ParameterDicts, deferred initialisation), broadcast_object and
allgather_object, against what each rank can compute on its own."""

import numpy as np
import pytest
from horovod_testing.collectives import rank_input
from jobs import SIZES, results, worker


def _deferred_net(seed):
    import mxnet as mx
    mx.random.seed(seed)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(4, activation='relu'), mx.gluon.nn.Dense(2))
    net.initialize(mx.init.Uniform(1.0))
    return net


def _values(params):
    # In creation order, which two nets of one structure share (their names may not sort
    # alike: they carry a per-process counter).
    return [p.data().asnumpy() for p in params.values()]


@worker
def broadcast_parameters_cases():
    import horovod.mxnet as hvd
    import mxnet as mx
    rank, size = hvd.rank(), hvd.size()
    root = size - 1
    checks = {}

    # A dict of NDArrays, sent in place from the root (with a prefix, twice: no name clash).
    arrays = {f'w{i}': mx.nd.array(rank_input(rank, 'float32', (3, i + 1), salt=60 + i))
              for i in range(3)}
    arrays['step'] = mx.nd.array([rank], dtype='int64')
    before = {k: v for k, v in arrays.items()}
    hvd.broadcast_parameters(arrays, root_rank=root, prefix='first.')
    hvd.broadcast_parameters(arrays, root_rank=root, prefix='second.')
    checks['dict'] = (all(arrays[k] is before[k] for k in arrays)
                      and all(np.array_equal(arrays[f'w{i}'].asnumpy(),
                                             rank_input(root, 'float32', (3, i + 1), salt=60 + i))
                              for i in range(3))
                      and arrays['step'].asnumpy().tolist() == [root])

    # An initialised gluon ParameterDict.
    net = mx.gluon.nn.Dense(3, in_units=5)
    mx.random.seed(1000 + rank)
    net.initialize(mx.init.Uniform(1.0))
    hvd.broadcast_parameters(net.collect_params(), root_rank=root)
    mx.random.seed(1000 + root)
    expected = mx.gluon.nn.Dense(3, in_units=5)
    expected.initialize(mx.init.Uniform(1.0))
    checks['parameter_dict'] = all(
        np.array_equal(a, b) for a, b in zip(_values(net.collect_params()),
                                             _values(expected.collect_params()), strict=True))

    # Deferred initialisation: shapes become known at the first forward pass, which then
    # broadcasts; the reference is the root's own initialisation, redone here.
    net = _deferred_net(2000 + rank)
    hvd.broadcast_parameters(net.collect_params(), root_rank=root, prefix='deferred.')
    data = mx.nd.array(rank_input(rank, 'float32', (2, 6), salt=61))
    net(data).wait_to_read()
    reference = _deferred_net(2000 + root)
    reference(data).wait_to_read()
    checks['deferred'] = all(
        np.array_equal(a, b) for a, b in zip(_values(net.collect_params()),
                                             _values(reference.collect_params()), strict=True))
    # Built on every rank, so that every rank creates the same blocks: gluon names parameters
    # with a per-process counter, and the trainers of later bodies order parameters by name.
    alone = _values(_deferred_net_forward(2000 + rank, data))
    checks['deferred_differs_without'] = rank == root or not all(
        np.array_equal(a, b) for a, b in zip(alone, _values(reference.collect_params()),
                                             strict=True))
    return checks


def _deferred_net_forward(seed, data):
    net = _deferred_net(seed)
    net(data).wait_to_read()
    return net.collect_params()


@worker
def object_cases():
    import horovod.mxnet as hvd
    rank, size = hvd.rank(), hvd.size()
    root = size // 2
    payload = {'rank': rank, 'text': 'x' * (100 * rank), 'fn': (lambda v, r=rank: v + r)}
    received = hvd.broadcast_object(payload, root_rank=root, name='payload')
    default_root = hvd.broadcast_object([rank, 'zero'])
    gathered = hvd.allgather_object({'rank': rank, 'blob': b'\x00' * (3 * rank)})
    return {
        'broadcast': (received['rank'], len(received['text']), received['fn'](1)),
        'default_root': default_root,
        'gathered': [(g['rank'], len(g['blob'])) for g in gathered],
    }


@pytest.mark.parametrize('np_', SIZES)
def test_broadcast_parameters(np_):
    for checks in results(broadcast_parameters_cases, np_):
        assert len(checks) == 4 and all(checks.values()), checks


@pytest.mark.parametrize('np_', SIZES)
def test_broadcast_and_allgather_object(np_):
    root = np_ // 2
    for out in results(object_cases, np_):
        assert out['broadcast'] == (root, 100 * root, 1 + root)
        assert out['default_root'] == [0, 'zero']
        assert out['gathered'] == [(r, 3 * r) for r in range(np_)]
