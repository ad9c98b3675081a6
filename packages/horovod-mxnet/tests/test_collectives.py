"""Every collective of horovod.mxnet against numpy references: the project's shared collective
and process-set suites (horovod_testing) through an NDArray adapter, plus what is particular to
MXNet: bool arrays, the asynchronous engine, array lifetime and the result types."""

import gc
import os
import re
import shutil
import tempfile

import numpy as np
import pytest
from horovod_testing.collectives import rank_input, reference_allreduce, run_collective_suite
from horovod_testing.process_sets import run_process_set_suite
from jobs import SIZES, results, worker


class MXNetAdapter:
    """Runs the shared checks through horovod.mxnet's public functions on CPU NDArrays."""

    allreduce_dtypes = ['uint8', 'int8', 'int32', 'int64', 'float16', 'float32', 'float64']
    gather_dtypes = allreduce_dtypes + ['bool']
    alltoall_dtypes = gather_dtypes
    reducescatter_dtypes = ['int32', 'int64', 'float16', 'float32', 'float64']

    def __init__(self):
        import horovod.mxnet as hvd
        import mxnet as mx
        self.hvd, self.mx = hvd, mx

    def init(self, process_sets=None):
        self.hvd.init(process_sets=process_sets)

    def add_process_set(self, ranks):
        return self.hvd.add_process_set(ranks)

    def remove_process_set(self, process_set):
        return self.hvd.remove_process_set(process_set)

    def rank(self):
        return self.hvd.rank()

    def size(self):
        return self.hvd.size()

    def tensor(self, array, dtype):
        return self.mx.nd.array(np.asarray(array, dtype=dtype), dtype=dtype)

    def to_numpy(self, tensor):
        assert isinstance(tensor, self.mx.nd.NDArray), type(tensor)
        return tensor.asnumpy()

    def _set(self, process_set):
        return self.hvd.global_process_set if process_set is None else process_set

    def allreduce(self, tensor, op, prescale, postscale, name, inplace, process_set=None):
        fn = self.hvd.allreduce_ if inplace else self.hvd.allreduce
        result = fn(tensor, name=name, op=op, prescale_factor=prescale,
                    postscale_factor=postscale, process_set=self._set(process_set))
        assert (result is tensor) == inplace
        return result

    def grouped_allreduce(self, tensors, op, name, inplace, process_set=None):
        fn = self.hvd.grouped_allreduce_ if inplace else self.hvd.grouped_allreduce
        return fn(tensors, name=name, op=op, process_set=self._set(process_set))

    def allgather(self, tensor, name, process_set=None):
        return self.hvd.allgather(tensor, name=name, process_set=self._set(process_set))

    def grouped_allgather(self, tensors, name, process_set=None):
        return self.hvd.grouped_allgather(tensors, name=name,
                                          process_set=self._set(process_set))

    def broadcast(self, tensor, root_rank, name, inplace, process_set=None):
        fn = self.hvd.broadcast_ if inplace else self.hvd.broadcast
        return fn(tensor, root_rank, name=name, process_set=self._set(process_set))

    def alltoall(self, tensor, splits, name, process_set=None):
        if splits is not None:
            # Half of the cases give the splits as an int32 NDArray.
            if sum(splits) % 2:
                splits = self.mx.nd.array(splits, dtype='int32')
            return self.hvd.alltoall(tensor, splits, name=name,
                                     process_set=self._set(process_set))
        output = self.hvd.alltoall(tensor, name=name, process_set=self._set(process_set))
        # Without splits the result is the output alone; every member sent an equal share.
        n = self._set(process_set).size()
        share = tensor.shape[0] // n
        return output, self.mx.nd.array([share] * n, dtype='int32')

    def reducescatter(self, tensor, op, name, process_set=None, prescale=1.0, postscale=1.0):
        return self.hvd.reducescatter(tensor, op=op, name=name,
                                      process_set=self._set(process_set),
                                      prescale_factor=prescale, postscale_factor=postscale)

    def grouped_reducescatter(self, tensors, op, name, process_set=None):
        return self.hvd.grouped_reducescatter(tensors, op=op, name=name,
                                              process_set=self._set(process_set))


@worker
def shared_collective_suite():
    return run_collective_suite(MXNetAdapter)


@worker
def shared_process_set_suite():
    import horovod.mxnet as hvd
    if hvd.size() == 1:
        return None
    return run_process_set_suite(MXNetAdapter)


@worker
def mxnet_specifics():
    """Things the shared suite cannot see: the engine must read an input only after MXNet has
    finished writing it, MXNet must see the results, bool round trips, results are NDArrays of
    the input's context, and arrays handed to an op may be dropped by the caller at once."""
    import horovod.mxnet as hvd
    import mxnet as mx
    rank, size = hvd.rank(), hvd.size()
    checks = {}

    # A slow MXNet computation still pending when the op is called: the op must wait for it.
    def chain():
        a = mx.nd.array(rank_input(rank, 'float32', (200, 200), salt=40) / 8)
        result = mx.nd.dot(a, a)
        for _ in range(3):
            result = mx.nd.dot(result, a) / 10
        return result

    reference = chain().asnumpy()  # every rank's reference from its own finished MXNet result
    fresh = chain()
    gathered = hvd.allgather(fresh, name='pending')
    every = hvd.allgather(mx.nd.array(reference), name='pending_reference').asnumpy()
    checks['pending_input'] = bool(np.array_equal(gathered.asnumpy(), every))

    # An in-place result used by MXNet operations queued right after the call.
    x = mx.nd.array(rank_input(rank, 'float32', (64,), salt=41))
    hvd.allreduce_(x, op=hvd.Sum, name='then_used')
    doubled = (x * 2).asnumpy()
    expected = reference_allreduce([rank_input(r, 'float32', (64,), salt=41) for r in range(size)],
                                   1, 1.0, 1.0, 'float32')
    checks['result_seen_by_mxnet'] = bool(np.array_equal(doubled, expected * 2))

    # An in-place op on a view (rows 1-2 of a larger array) writes those rows only.
    base = np.arange(12, dtype=np.float32).reshape(4, 3) + rank
    x = mx.nd.array(base)
    hvd.allreduce_(x[1:3], op=hvd.Sum, prescale_factor=2.0, name='view')
    expected = base.copy()
    expected[1:3] = sum(2 * (np.arange(12, dtype=np.float32).reshape(4, 3)[1:3] + r)
                        for r in range(size))
    checks['view'] = bool(np.array_equal(x.asnumpy(), expected))

    # bool goes through allgather, broadcast (both forms) and alltoall unchanged.
    flags = mx.nd.array(rank_input(rank, 'bool', (6,), salt=42), dtype='bool')
    gathered = hvd.allgather(flags, name='bool')
    root_flags = rank_input(size - 1, 'bool', (6,), salt=42)
    copy = hvd.broadcast(flags, size - 1, name='bool')
    hvd.broadcast_(flags, size - 1, name='bool_inplace')
    checks['bool'] = (gathered.dtype == np.bool_ and copy.dtype == np.bool_
                      and flags.dtype == np.bool_
                      and np.array_equal(gathered.asnumpy(), np.concatenate(
                          [rank_input(r, 'bool', (6,), salt=42) for r in range(size)]))
                      and np.array_equal(copy.asnumpy(), root_flags)
                      and np.array_equal(flags.asnumpy(), root_flags))

    # Results are fresh NDArrays on the CPU context; the caller's references can go at once.
    outputs = []
    for i in range(5):
        t = mx.nd.array(rank_input(rank, 'float64', (1000,), salt=50 + i))
        outputs.append(hvd.allgather(t * 1, name=f'lifetime.{i}'))
        del t
    gc.collect()  # drops the engine's array objects; the NDArrays must keep their buffers
    junk = [mx.nd.ones((1000,)) * 7 for _ in range(50)]
    ok = all(np.array_equal(out.asnumpy(), np.concatenate(
        [rank_input(r, 'float64', (1000,), salt=50 + i) for r in range(size)]))
        for i, out in enumerate(outputs))
    checks['lifetime'] = ok and len(junk) == 50
    checks['context'] = all(out.context == mx.cpu() for out in outputs)

    # The received splits of an alltoall with splits are an int32 CPU NDArray.
    x = mx.nd.array(np.arange(2 * size, dtype=np.float32) + 100 * rank)
    out, received = hvd.alltoall(x, splits=[2] * size, name='splits_type')
    checks['received_splits'] = (isinstance(received, mx.nd.NDArray)
                                 and received.dtype == np.int32
                                 and received.asnumpy().tolist() == [2] * size
                                 and out.asnumpy().tolist() == [
                                     float(100 * r + 2 * rank + k)
                                     for r in range(size) for k in range(2)])

    # The deprecated average argument maps to Average / Sum.
    x = mx.nd.array([float(rank + 1)] * 3)
    averaged = hvd.allreduce(x, average=True, name='average_true').asnumpy()
    summed = hvd.allreduce(x, average=False, name='average_false').asnumpy()
    total = size * (size + 1) / 2
    checks['average_argument'] = (averaged.tolist() == [total / size] * 3
                                  and summed.tolist() == [total] * 3)

    # Unnamed ops get automatic names that match across ranks; priorities are accepted.
    y = mx.nd.array([float(rank)])
    results = [hvd.allreduce(y, op=hvd.Sum, priority=p).asscalar() for p in (0, 5, -3)]
    checks['unnamed'] = results == [total - size] * 3
    return checks


@worker
def engine_names():
    """The names the engine sees (from rank 0's timeline): ``horovod_<op>.<name>``, automatic
    ``noname`` counters, ``_<i>of<n>`` for grouped members, trainer prefixes and optimizer
    indices."""
    import horovod.mxnet as hvd
    import mxnet as mx
    folder = tempfile.mkdtemp(prefix='hvd-mxnet-timeline-')
    try:
        return _engine_names(hvd, mx, os.path.join(folder, 'timeline.json'))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _engine_names(hvd, mx, path):
    hvd.start_timeline(path)
    x = mx.nd.ones((2 * hvd.size(), 2))
    hvd.allreduce(x, name='named')
    hvd.allreduce_(x)
    hvd.grouped_allreduce([x, x], name='group')
    hvd.allgather(x)
    hvd.grouped_allgather([x, x])
    hvd.broadcast(x, 0, name='root')
    hvd.alltoall(x, name='exchange')
    hvd.reducescatter(x)
    hvd.grouped_reducescatter([x, x], name='rs')
    net = mx.gluon.nn.Dense(2, in_units=2)
    net.initialize()
    for prefix, groups in (('solo.', 0), ('grouped.', 1)):
        trainer = hvd.DistributedTrainer(net.collect_params(), 'sgd', prefix=prefix,
                                         num_groups=groups)
        with mx.autograd.record():
            loss = net(x).sum()
        loss.backward()
        trainer.step(1)
    optimizer = hvd.DistributedOptimizer(mx.optimizer.SGD(), num_groups=1)
    optimizer.update([3, 4], [x, x], [x.copy(), x.copy()], [None, None])
    hvd.stop_timeline()
    if hvd.rank() != 0:
        return None
    with open(path) as f:
        return sorted(set(re.findall(r'horovod_[a-z]+\.[A-Za-z0-9_.:]+', f.read())))


@pytest.mark.parametrize('np_', SIZES)
def test_engine_names(np_):
    names = results(engine_names, np_)[0]
    expected = {'horovod_allreduce.named', 'horovod_allreduce.group_1of2',
                'horovod_allreduce.group_2of2', 'horovod_broadcast.root',
                'horovod_alltoall.exchange', 'horovod_reducescatter.rs_1of2',
                'horovod_reducescatter.rs_2of2'}
    if np_ > 1:  # with one rank the trainer and the optimizer send nothing
        expected |= {'horovod_allreduce.solo.0', 'horovod_allreduce.solo.1',
                     'horovod_allreduce.grouped.0:grouped.1_1of2',
                     'horovod_allreduce.grouped.0:grouped.1_2of2',
                     'horovod_allreduce.3:4_1of2', 'horovod_allreduce.3:4_2of2'}
    assert expected <= set(names), sorted(expected - set(names))
    # Unnamed ops: a counter per kind (its value depends on the bodies that ran before).
    for pattern in (r'horovod_allreduce\.noname\.\d+', r'horovod_allgather\.noname\.\d+',
                    r'horovod_allgather\.noname\.\d+_2of2',
                    r'horovod_reducescatter\.noname\.\d+'):
        assert any(re.fullmatch(pattern, n) for n in names), (pattern, names)


@pytest.mark.parametrize('np_', SIZES)
def test_shared_collective_suite(np_):
    counts = results(shared_collective_suite, np_)
    for per_rank in counts:
        assert per_rank == counts[0]
    expected = {'check_allreduce', 'check_grouped_allreduce', 'check_allgather',
                'check_broadcast', 'check_empty_tensors', 'check_grouped_allgather',
                'check_alltoall', 'check_reducescatter', 'check_grouped_reducescatter'}
    assert set(counts[0]) == expected, counts[0]
    assert all(cases > 0 for cases in counts[0].values()), counts[0]


@pytest.mark.parametrize('np_', [n for n in SIZES if n > 1])
def test_shared_dynamic_process_set_suite(np_):
    for counts in results(shared_process_set_suite, np_):
        assert counts['registry'] == 8 and counts['concurrent'] == 40, counts
        assert counts['member_ops'] + counts['non_member_ops'] > 0, counts


@pytest.mark.parametrize('np_', SIZES)
def test_mxnet_specifics(np_):
    for checks in results(mxnet_specifics, np_):
        assert checks and all(checks.values()), checks
