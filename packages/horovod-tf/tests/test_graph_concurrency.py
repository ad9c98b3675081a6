"""Many independent collectives evaluated by one graph run: a TF1 ``Session.run``, a
``tf.compat.v1.wrap_function`` and a ``tf.function``, each holding 30 allgathers of different
dtypes and tensor ranks, allreduces, broadcasts and a collective that consumes another's output,
under 1 and 2 inter-op threads. Odd ranks build some of the graphs in the reverse order, so that
the ranks schedule their nodes differently. A wait that held one of TensorFlow's inter-op threads
would let every rank fill its threads with waits on what the others have not submitted: the job
would never end (here: run_ranks's timeout fails the test). The TF1 graphs take the tf.data form
of the wait, tf.function the plain one that its automatic control dependencies make safe; both
are checked against numpy references."""

import numpy as np
import pytest

from horovod_testing import run_ranks

GATHER_DTYPES = ('float32', 'float64', 'int32', 'int64', 'uint8', 'int8', 'float16', 'int16', 'uint16', 'bool')
REDUCE_DTYPES = ('float32', 'float64', 'int32', 'int64', 'float16', 'uint8', 'int8')
N_ALLGATHER, N_ALLREDUCE, N_BROADCAST = 30, 7, 6


def _input(kind, i, rank):
    """Rank ``rank``'s input of collective ``kind`` number ``i`` (deterministic, rank-dependent):
    allgathers have ``rank + 1 + i % 3`` rows and ``i % 4`` more dimensions (tensor rank 1..4)."""
    rng = np.random.default_rng([rank, i, len(kind)])
    if kind == 'allgather':
        dtype = np.dtype(GATHER_DTYPES[i % len(GATHER_DTYPES)])
        shape = (rank + 1 + i % 3,) + (2,) * (i % 4)
    else:
        dtype = np.dtype(REDUCE_DTYPES[i % len(REDUCE_DTYPES)])
        shape = (3,) + (2,) * (i % 3)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(0, 10, shape).astype(dtype)


def _expected(kind, i, size):
    every = [_input(kind, i, r) for r in range(size)]
    if kind == 'allgather':
        return np.concatenate(every)
    if kind == 'allreduce':
        return np.sum(every, axis=0, dtype=every[0].dtype)
    return every[i % size]  # broadcast from root i % size


def body(threads):
    import tensorflow as tf
    tf.config.threading.set_inter_op_parallelism_threads(threads)

    import horovod.tensorflow as hvd
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    assert tf.config.threading.get_inter_op_parallelism_threads() == threads
    specs = ([('allgather', i) for i in range(N_ALLGATHER)] + [('allreduce', i) for i in range(N_ALLREDUCE)]
             + [('broadcast', i) for i in range(N_BROADCAST)])

    def build(order, tag):
        """The graph's outputs in ``specs`` order, ops created in ``order``; plus the chained
        collective: the allreduce of the first allgather's row count."""
        made = {}
        for k in order:
            kind, i = specs[k]
            x = tf.constant(_input(kind, i, rank))
            name = f'{tag}_{kind}{i}'
            if kind == 'allgather':
                made[k] = hvd.allgather(x, name=name)
            elif kind == 'allreduce':
                made[k] = hvd.allreduce(x, op=hvd.Sum, name=name)
            else:
                made[k] = hvd.broadcast(x, root_rank=i % size, name=name)
        rows = tf.shape(made[0], out_type=tf.int64)[:1]
        chained = hvd.allreduce(rows * (rank + 1), op=hvd.Sum, name=f'{tag}_chained')
        return [made[k] for k in range(len(specs))] + [chained]

    forward = list(range(len(specs)))
    # Odd ranks create the ops in the reverse order where the mode allows it (explicit names
    # match them); tf.function orders its stateful ops as the program creates them, so there
    # every rank must create them in the same order.
    mine = forward[::-1] if rank % 2 else forward
    rows0 = sum(r + 1 for r in range(size))
    expected = [_expected(kind, i, size) for kind, i in specs] + [
        np.array([rows0 * sum(r + 1 for r in range(size))])]

    def check(outputs, mode):
        assert len(outputs) == len(expected), (mode, len(outputs))
        for (kind_i, got, want) in zip(specs + [('chained', 0)], outputs, expected, strict=True):
            got = np.asarray(got)
            if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(got, want):
                raise AssertionError(f'{mode} {kind_i}: got {got!r}, expected {want!r}')
        return len(outputs)

    checked = {}
    for mode, order in (('session', forward), ('session_reversed', mine)):
        graph = tf.Graph()
        with graph.as_default():
            outputs = build(order, mode)
            with tf.compat.v1.Session(graph=graph) as session:
                # Twice: the second run reuses the kernels of the first.
                checked[mode] = sum(check(session.run(outputs), mode) for _ in range(2))
    wrapped = tf.compat.v1.wrap_function(lambda: build(mine, 'wrapped'), [])
    checked['wrap_function'] = sum(check([t.numpy() for t in wrapped()], 'wrap_function') for _ in range(2))
    function = tf.function(lambda: build(forward, 'function'))
    checked['function'] = sum(check([t.numpy() for t in function()], 'function') for _ in range(2))
    # join waits off the inter-op threads too: in a TF1 graph and in a tf.function it returns the
    # rank that joined last.
    graph = tf.Graph()
    with graph.as_default():
        joined = hvd.join()
        with tf.compat.v1.Session(graph=graph) as session:
            last = [int(session.run(joined))]
    last.append(int(tf.function(hvd.join)()))
    return {'checked': checked, 'join': last}


@pytest.mark.parametrize('threads', [1, 2])
def test_many_independent_collectives_in_one_graph_run(threads):
    results = run_ranks(2, body, threads, env={'TF_CPP_MIN_LOG_LEVEL': '2', 'OMP_NUM_THREADS': '1'}, timeout=300)
    per_run = N_ALLGATHER + N_ALLREDUCE + N_BROADCAST + 1
    for result in results:
        assert result['checked'] == {'session': 2 * per_run, 'session_reversed': 2 * per_run,
                                     'wrap_function': 2 * per_run, 'function': 2 * per_run}, result
        assert all(last in (0, 1) for last in result['join']), result
    assert results[0]['join'] == results[1]['join'], results
