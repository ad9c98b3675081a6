"""Worker bodies of the multi-process job (see conftest.py). Each runs on every rank, checks what
it can against numpy references and raises AssertionError when a result is wrong; what it returns
is checked again by the test functions. Inputs depend on the rank, so that a collective that did
nothing, or a reduction over the wrong ranks, gives a wrong answer.

Importing TensorFlow costs seconds per process, so the whole test session starts one job per world
size and runs every body in it, in order (WORKERS)."""

import functools
import sys
import traceback

import numpy as np
import tensorflow as tf


def _hvd():
    import horovod.tensorflow as hvd
    return hvd


def rng_for(rank, salt):
    return np.random.default_rng([rank, salt])


def close(actual, expected, what, atol=1e-5):
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    if actual.shape != expected.shape or not np.allclose(actual, expected, atol=atol, rtol=1e-5):
        raise AssertionError(f'{what}: got {actual!r}, expected {expected!r}')


def both_modes(fn):
    """Runs ``fn()`` eagerly and traced into a tf.function; returns both results as numpy."""
    eager = tf.nest.map_structure(lambda t: None if t is None else np.asarray(t), fn())
    graph = tf.nest.map_structure(lambda t: None if t is None else np.asarray(t), tf.function(fn)())
    return eager, graph


# ------------------------------------------------------------------------------------------------

def import_without_torch():
    """The first body: horovod.tensorflow imported in this fresh process did not import torch."""
    import horovod.tensorflow  # noqa: F401
    return {'torch_imported': 'torch' in sys.modules, 'mxnet_imported': 'mxnet' in sys.modules}


def collectives():
    """The project's shared collective suite, eagerly and inside tf.function."""
    from horovod_testing.collectives import run_collective_suite
    from tf_adapter import EagerAdapter, GraphAdapter
    return {'eager': run_collective_suite(EagerAdapter), 'graph': run_collective_suite(GraphAdapter)}


def gradients():
    """The registered gradients of every op, eagerly and in tf.function, against references
    computed from every rank's (deterministic) inputs."""
    hvd = _hvd()
    rank, n = hvd.rank(), hvd.size()
    x_rows = [np.full((2 * r + 1, 3), float(r + 1)) for r in range(n)]
    checks = 0

    def grad_of(loss_fn, x):
        def run():
            v = tf.constant(x)
            with tf.GradientTape() as tape:
                tape.watch(v)
                loss = loss_fn(v)
            return tape.gradient(loss, v)
        return both_modes(run)

    # allreduce Sum / Average: the gradient is the same reduction of the incoming gradients.
    wa = [rng_for(r, 2).standard_normal((4,)) for r in range(n)]
    for op, expected in ((hvd.Sum, np.sum(wa, axis=0)), (hvd.Average, np.mean(wa, axis=0))):
        for got in grad_of(lambda v, op=op: tf.reduce_sum(hvd.allreduce(v, op=op) * wa[rank]), np.ones(4)):
            close(got, expected, f'allreduce op={op} gradient')
            checks += 1
    # grouped allreduce: each member's gradient independently.
    for got in grad_of(lambda v: tf.add_n([tf.reduce_sum(t * wa[rank] * (i + 1)) for i, t in
                                           enumerate(hvd.grouped_allreduce([v, 2 * v], op=hvd.Sum))]),
                       np.ones(4)):
        close(got, 5 * np.sum(wa, axis=0), 'grouped allreduce gradient')
        checks += 1
    # allgather with different row counts: this rank's rows of the averaged incoming gradient.
    offsets = np.cumsum([0] + [2 * r + 1 for r in range(n)])
    wg = [rng_for(r, 3).standard_normal((offsets[-1], 3)) for r in range(n)]
    mean_wg = np.mean(wg, axis=0)
    for got in grad_of(lambda v: tf.reduce_sum(hvd.allgather(v) * wg[rank]), x_rows[rank]):
        close(got, mean_wg[offsets[rank]:offsets[rank + 1]], 'allgather gradient')
        checks += 1
    for got in grad_of(lambda v: tf.reduce_sum(hvd.grouped_allgather([v, v])[1] * wg[rank]), x_rows[rank]):
        close(got, mean_wg[offsets[rank]:offsets[rank + 1]], 'grouped allgather gradient')
        checks += 1
    # broadcast from the last rank: the root gets the averaged gradient, the others zero.
    root = n - 1
    for got in grad_of(lambda v: tf.reduce_sum(hvd.broadcast(v, root) * wa[rank]), np.ones(4) * rank):
        close(got, np.mean(wa, axis=0) if rank == root else np.zeros(4), 'broadcast gradient')
        checks += 1
    # alltoall with uneven splits and one unsent trailing row: the gradient travels back.
    splits = [[(s + k) % 2 + 1 for k in range(n)] for s in range(n)]
    received = [[splits[s][k] for s in range(n)] for k in range(n)]
    wt = [rng_for(k, 4).standard_normal((sum(received[k]), 2)) for k in range(n)]
    expected = np.zeros((sum(splits[rank]) + 1, 2))
    for k in range(n):
        # My rows for member k sit in k's output after the blocks of senders before me.
        start_in_k = sum(received[k][:rank])
        mine = sum(splits[rank][:k])
        expected[mine:mine + splits[rank][k]] = wt[k][start_in_k:start_in_k + splits[rank][k]]
    x = np.ones((sum(splits[rank]) + 1, 2))
    for got in grad_of(lambda v: tf.reduce_sum(hvd.alltoall(v, splits=splits[rank])[0] * wt[rank]), x):
        close(got, expected, 'alltoall gradient')
        checks += 1
    # reducescatter: allgather of the incoming gradient, times the set size for Sum.
    rows = [(2 * n + 1) // n + (1 if r < (2 * n + 1) % n else 0) for r in range(n)]
    wr = [rng_for(r, 5).standard_normal((rows[r], 3)) for r in range(n)]
    for op, factor in ((hvd.Sum, n), (hvd.Average, 1)):
        for got in grad_of(lambda v, op=op: tf.reduce_sum(hvd.reducescatter(v, op=op) * wr[rank]),
                           np.ones((2 * n + 1, 3))):
            close(got, np.concatenate(wr) * factor, f'reducescatter op={op} gradient')
            checks += 1
    return checks


def _model_data(rank):
    rng = rng_for(rank, 10)
    return (rng.standard_normal((6, 4)).astype(np.float32), rng.integers(0, 10, size=6).astype(np.int32),
            rng.standard_normal((6, 3)).astype(np.float32))


def _init_vars():
    rng = np.random.default_rng(7)
    return [tf.Variable(rng.standard_normal((4, 3)).astype(np.float32), name='w'),
            tf.Variable(np.zeros(3, np.float32), name='b'),
            tf.Variable(rng.standard_normal((10, 3)).astype(np.float32), name='emb')]


def _loss(variables, data):
    w, b, emb = variables
    x, ids, y = data
    pred = tf.matmul(x, w) + b + tf.gather(emb, ids)
    return tf.reduce_mean(tf.square(pred - y))


def _local_grads(variables, rank):
    with tf.GradientTape() as tape:
        loss = _loss(variables, _model_data(rank))
    return [np.asarray(tf.convert_to_tensor(g)) for g in tape.gradient(loss, variables)]


def tape():
    """DistributedGradientTape: the averaged (or summed) gradients of every rank's loss, with
    groups, IndexedSlices (allgather path and sparse_as_dense), fp16, a local source, the
    Partial tape, and inside tf.function with one Python op per group."""
    hvd = _hvd()
    rank, n = hvd.rank(), hvd.size()
    variables = _init_vars()
    per_rank = [_local_grads(variables, r) for r in range(n)]
    mean = [np.mean([g[i] for g in per_rank], axis=0) for i in range(3)]
    total = [np.sum([g[i] for g in per_rank], axis=0) for i in range(3)]
    scenarios = {
        'average': ({}, mean, 1e-5),
        'sum': ({'op': hvd.Sum}, total, 1e-5),
        'groups': ({'groups': 2}, mean, 1e-5),
        'var_groups': ({'groups': [[variables[0], variables[2]]]}, mean, 1e-5),
        'sparse_as_dense': ({'sparse_as_dense': True}, mean, 1e-5),
        'predivide': ({'gradient_predivide_factor': 2.0}, mean, 1e-5),
        'fp16': ({'compression': hvd.Compression.fp16}, mean, 1e-2),
    }
    results = {}
    for label, (options, expected, atol) in scenarios.items():
        def step(options=options):
            with tf.GradientTape() as t:
                loss = _loss(variables, _model_data(rank))
            grads = hvd.DistributedGradientTape(t, **options).gradient(loss, variables)
            return [tf.convert_to_tensor(g) for g in grads], isinstance(grads[2], tf.IndexedSlices)
        for mode, fn in (('eager', step), ('graph', tf.function(step))):
            grads, sparse = fn()
            for i in range(3):
                close(grads[i], expected[i], f'tape {label} {mode} gradient {i}', atol=atol)
            results[f'{label}.{mode}'] = bool(sparse)
    # One Python op per group inside a graph: a start and a wait node per group, starts first.
    for groups, expected_nodes in ((None, 2), (2, 4)):
        def reduce_only(groups=groups):
            with tf.GradientTape() as t:
                loss = _loss(variables, _model_data(rank))
            return hvd.DistributedGradientTape(t, groups=groups, sparse_as_dense=True).gradient(loss, variables)
        graph = tf.function(reduce_only).get_concrete_function().graph
        py_nodes = [op.name for op in graph.get_operations() if op.type in ('PyFunc', 'EagerPyFunc')]
        results[f'py_nodes.{groups}'] = len(py_nodes)
        if len(py_nodes) != expected_nodes:
            raise AssertionError(f'groups={groups}: Python nodes {py_nodes}, expected {expected_nodes}')
        tf.function(reduce_only)()
    # A local source keeps its own gradient, divided by the set size.
    with tf.GradientTape() as t:
        loss = _loss(variables, _model_data(rank))
    dtape = hvd.DistributedGradientTape(t)
    dtape.register_local_source(variables[1])
    local, glob = dtape.get_local_and_global_gradients(loss, variables)
    close(local[0][1], per_rank[rank][1] / n, 'local source gradient')
    close(glob[0][1], mean[0], 'global gradient next to a local source')
    # PartialDistributedGradientTape with a Keras layer kept local.
    dense = tf.keras.layers.Dense(2, kernel_initializer='ones')
    head = tf.keras.layers.Dense(1, kernel_initializer='ones')
    x = tf.constant(_model_data(rank)[0])
    with tf.GradientTape() as t:
        loss = tf.reduce_sum(head(dense(x)) * (rank + 1))
    ptape = hvd.PartialDistributedGradientTape(t, local_layers=head)
    weights = dense.trainable_weights + head.trainable_weights
    grads = ptape.gradient(loss, weights)
    all_grads = []
    for r in range(n):
        xr = tf.constant(_model_data(r)[0])
        with tf.GradientTape() as t:
            loss = tf.reduce_sum(head(dense(xr)) * (r + 1))
        all_grads.append([np.asarray(g) for g in t.gradient(loss, weights)])
    for i in range(2):
        close(grads[i], np.mean([g[i] for g in all_grads], axis=0), f'partial tape global gradient {i}')
    for i in range(2, 4):
        close(grads[i], all_grads[rank][i] / n, f'partial tape local gradient {i}')
    return results


def optimizer():
    """Keras DistributedOptimizer (apply_gradients eagerly and in tf.function, local aggregation
    over two passes, model.fit) and a legacy optimizer in a TF1 graph."""
    hvd = _hvd()
    rank, n = hvd.rank(), hvd.size()
    lr = 0.1
    out = {}
    for mode in ('eager', 'graph'):
        variables = _init_vars()
        start = [v.numpy().copy() for v in variables]
        per_rank = [_local_grads(variables, r) for r in range(n)]
        opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(learning_rate=lr))
        if type(opt).__name__ != 'SGD' or not np.isclose(opt.get_config()['learning_rate'], lr):
            raise AssertionError(f'wrapped optimizer {type(opt).__name__} {opt.get_config()}')

        def step(opt=opt, variables=variables):
            with tf.GradientTape() as t:
                loss = _loss(variables, _model_data(rank))
            opt.apply_gradients(zip(t.gradient(loss, variables), variables, strict=True))

        (step if mode == 'eager' else tf.function(step))()
        for i, v in enumerate(variables):
            expected = start[i] - lr * np.mean([g[i] for g in per_rank], axis=0)
            close(v.numpy(), expected, f'{mode} SGD step variable {i}')
        # Two backward passes per step: the first only accumulates (iterations still advances).
        variables = _init_vars()
        opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(learning_rate=lr), backward_passes_per_step=2,
                                       average_aggregated_gradients=True, sparse_as_dense=True)

        def agg_step(opt=opt, variables=variables):
            with tf.GradientTape() as t:
                loss = _loss(variables, _model_data(rank))
            opt.apply_gradients(zip(t.gradient(loss, variables), variables, strict=True))

        run = agg_step if mode == 'eager' else tf.function(agg_step)
        run()
        close(variables[0].numpy(), start[0], f'{mode} aggregation: no update after one pass')
        if int(opt.iterations.numpy()) != 1 or int(opt._agg_helper.counter.numpy()) != 1:
            raise AssertionError(f'{mode} aggregation: iterations {opt.iterations.numpy()}, '
                                 f'counter {opt._agg_helper.counter.numpy()} after one pass')
        run()
        # Both passes saw the same data and weights: the average of the two is one pass's.
        for i, v in enumerate(variables):
            expected = start[i] - lr * np.mean([g[i] for g in per_rank], axis=0)
            close(v.numpy(), expected, f'{mode} aggregated step variable {i}')
        out[f'{mode}.iterations'] = int(opt.iterations.numpy())
    # model.fit on different data per rank ends with identical weights.
    tf.keras.utils.set_random_seed(1)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3, activation='relu'),
                                 tf.keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05)), loss='mse')
    x, _, y = _model_data(rank)
    model.fit(x, y[:, :1], batch_size=3, epochs=2, verbose=0)
    flat = np.concatenate([w.reshape(-1) for w in model.get_weights()])
    gathered = hvd.allgather(tf.constant(flat[None]), name='fit_weights').numpy()
    if not all(np.array_equal(gathered[0], g) for g in gathered):
        raise AssertionError('model.fit with DistributedOptimizer left different weights on the ranks')
    out['fit_identical'] = True
    out['legacy'] = _legacy_optimizer(hvd, rank, n)
    return out


def _legacy_optimizer(hvd, rank, n):
    """tf.compat.v1: GradientDescentOptimizer wrapped, variables broadcast by the hook."""
    xs = [np.arange(3, dtype=np.float64) + r for r in range(n)]
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable('w', initializer=np.full(3, float(rank + 1)))
        loss = tf.reduce_sum(w * w * xs[rank])
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
        train = opt.minimize(loss)
        hook = hvd.BroadcastGlobalVariablesHook(0)
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as sess:
            start = sess.run(w)
            sess.run(train)
            after = sess.run(w)
    close(start, np.ones(3), 'hook broadcast the root\'s initial value')
    expected = np.ones(3) - 0.1 * np.mean([2 * np.ones(3) * x for x in xs], axis=0)
    close(after, expected, 'legacy optimizer step')
    # Two backward passes per step in a TF1 graph: the first pass applies nothing.
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable('w', initializer=np.ones(3))
        loss = tf.reduce_sum(w * w * xs[rank])
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), backward_passes_per_step=2)
        train = opt.minimize(loss)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            first = sess.run(w)
            sess.run(train)
            second = sess.run(w)
    close(first, np.ones(3), 'legacy aggregation: no update after one pass')
    # Both passes at w = 1: the accumulated gradient is 2 * (2 * x) per rank, averaged over ranks.
    close(second, np.ones(3) - 0.1 * np.mean([4 * x for x in xs], axis=0), 'legacy aggregated step')
    return True


def objects_and_variables():
    """broadcast_object(_fn), allgather_object, broadcast_variables (eager, graph, inplace),
    broadcast_global_variables in a TF1 graph, and the run-time rank/size ops."""
    hvd = _hvd()
    rank, n = hvd.rank(), hvd.size()
    root = n - 1
    got = hvd.broadcast_object({'rank': rank, 'array': np.arange(rank + 2)}, root_rank=root)
    if got['rank'] != root or not np.array_equal(got['array'], np.arange(root + 2)):
        raise AssertionError(f'broadcast_object: {got}')
    gathered = hvd.allgather_object(('x' * rank, rank))
    if gathered != [('x' * r, r) for r in range(n)]:
        raise AssertionError(f'allgather_object: {gathered}')
    fn = hvd.broadcast_object_fn(root_rank=0)
    if fn(rank * 10) != 0:
        raise AssertionError('broadcast_object_fn')
    for mode, inplace in (('eager', False), ('eager', True), ('graph', False)):
        v = [tf.Variable(np.full((2, 2), float(rank))), tf.Variable(np.arange(3) + rank)]
        if mode == 'eager':
            hvd.broadcast_variables(v, root_rank=root, inplace=inplace)
        else:
            def assign(v=v):
                hvd.broadcast_variables(v, root_rank=root)

            tf.function(assign)()
        close(v[0].numpy(), np.full((2, 2), float(root)), f'broadcast_variables {mode} {inplace}')
        close(v[1].numpy(), np.arange(3) + root, f'broadcast_variables {mode} {inplace}')
    with tf.Graph().as_default():
        a = tf.compat.v1.get_variable('a', initializer=np.full(2, float(rank)))
        op = hvd.broadcast_global_variables(root)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(op)
            close(sess.run(a), np.full(2, float(root)), 'broadcast_global_variables')
    try:
        hvd.broadcast_global_variables(0)
    except RuntimeError as e:
        if 'broadcast_variables' not in str(e):
            raise
    else:
        raise AssertionError('broadcast_global_variables in eager mode did not raise')
    values = tf.function(lambda: [hvd.rank_op(), hvd.size_op(), hvd.local_rank_op(), hvd.local_size_op(),
                                  hvd.process_set_included_op(0), hvd.process_set_included_op(99)])()
    values = [int(v) for v in values]
    if values != [rank, n, hvd.local_rank(), hvd.local_size(), 1, -3]:
        raise AssertionError(f'run-time ops: {values}')
    return values


def sync_batch_norm():
    """SyncBatchNormalization normalises with the moments of every rank's batch."""
    hvd = _hvd()
    rank, n = hvd.rank(), hvd.size()
    data = [rng_for(r, 20).standard_normal((4, 3)).astype(np.float32) * (r + 1) for r in range(n)]
    layer = hvd.SyncBatchNormalization(epsilon=1e-3, momentum=0.5)
    if layer.name != 'sync_batch_normalization':
        raise AssertionError(layer.name)
    out = layer(tf.constant(data[rank]), training=True).numpy()
    every = np.concatenate(data)
    mean, var = every.mean(axis=0), every.var(axis=0)
    close(out, (data[rank] - mean) / np.sqrt(var + 1e-3), 'sync batch norm output', atol=1e-4)
    close(layer.moving_mean.numpy(), 0.5 * mean, 'sync batch norm moving mean', atol=1e-5)
    graph_out = tf.function(lambda x: layer(x, training=True))(tf.constant(data[rank])).numpy()
    close(graph_out, out, 'sync batch norm in tf.function', atol=1e-4)
    return True


def _expect(error_types, fn, what, contains=None):
    try:
        fn()
    except error_types as e:
        if contains and contains.lower() not in str(e).lower():
            raise AssertionError(f'{what}: message does not mention {contains!r}: {e}') from e
        return type(e).__name__
    raise AssertionError(f'{what}: no {error_types} raised')


def errors():
    """Bad arguments raise ValueError (or NotImplementedError) on the calling rank; ranks that
    disagree get an error on every rank, eagerly and in a graph, and Horovod stays usable."""
    hvd = _hvd()
    from horovod.common.exceptions import HorovodInternalError
    rank, n = hvd.rank(), hvd.size()
    seen = {}
    seen['string'] = _expect(ValueError, lambda: hvd.allreduce(tf.constant(['a'])), 'string allreduce', 'string')
    seen['string_graph'] = _expect(ValueError, lambda: tf.function(lambda: hvd.allgather(tf.constant(['a'])))(),
                                   'string allgather in a graph', 'string')
    seen['scalar_allgather'] = _expect(ValueError, lambda: hvd.allgather(tf.constant(1.0)), 'scalar allgather')
    seen['root'] = _expect(ValueError, lambda: hvd.broadcast(tf.ones(2), 'zero'), 'root not an int', 'root')
    seen['splits'] = _expect(ValueError, lambda: hvd.alltoall(tf.ones(2), splits=tf.constant([1.0])), 'float splits')
    seen['rs_op'] = _expect(ValueError, lambda: hvd.reducescatter(tf.ones(2), op=hvd.Max), 'reducescatter Max')
    seen['op'] = _expect(ValueError, lambda: hvd.allreduce(tf.ones(2), op=42), 'unknown op')
    seen['average_and_op'] = _expect(ValueError, lambda: hvd.allreduce(tf.ones(2), average=True, op=hvd.Sum),
                                     'average and op')
    sparse = tf.IndexedSlices(tf.ones((1, 2)), tf.constant([0]), tf.constant([3, 2]))
    seen['sparse_adasum'] = _expect(NotImplementedError, lambda: hvd.allreduce(sparse, op=hvd.Adasum),
                                    'IndexedSlices Adasum', 'sparse_as_dense')
    seen['sparse_scale'] = _expect(NotImplementedError, lambda: hvd.allreduce(sparse, prescale_factor=2.0),
                                   'IndexedSlices prescale')
    seen['xla'] = _expect(ValueError, lambda: tf.function(lambda x: hvd.allreduce(x), jit_compile=True)(tf.ones(2)),
                          'XLA', 'XLA')
    with tf.GradientTape() as t:
        pass
    seen['predivide'] = _expect(ValueError, lambda: hvd.DistributedGradientTape(t, op=hvd.Sum,
                                                                                gradient_predivide_factor=2.0),
                                'predivide with Sum')
    seen['groups'] = _expect(ValueError, lambda: hvd.DistributedOptimizer(tf.keras.optimizers.SGD(), groups=0),
                             'groups=0')
    seen['partial'] = _expect(ValueError, lambda: hvd.PartialDistributedGradientTape(t, local_layers=[object()]),
                              'non-layer local_layers')
    seen['fused'] = _expect(ValueError, lambda: hvd.SyncBatchNormalization(fused=True), 'fused')
    seen['bpps'] = _expect(ValueError, lambda: hvd.LocalGradientAggregationHelper(0, None, False, False), 'bpps 0')
    seen['not_optimizer'] = _expect(ValueError, lambda: hvd.DistributedOptimizer(object()), 'not an optimizer')
    if n in (1, 2):
        # Adasum of orthogonal vectors is their sum; of one vector, itself.
        x = tf.constant([1.0, 0.0] if rank == 0 else [0.0, 1.0])
        seen['adasum'] = hvd.allreduce(x, op=hvd.Adasum, name='adasum').numpy().tolist()
    else:
        seen['adasum'] = _expect(NotImplementedError, lambda: hvd.allreduce(tf.ones(2), op=hvd.Adasum),
                                 'Adasum on 3 ranks', 'power-of-2')
    if n > 1:
        # Shapes differ between ranks: every rank gets the error, eagerly...
        bad = tf.ones((rank + 1,))
        error = _expect(tf.errors.FailedPreconditionError, lambda: hvd.allreduce(bad, name='mismatch'),
                        'eager shape mismatch', 'mismatch')
        try:
            hvd.allreduce(bad, name='mismatch2')
        except HorovodInternalError:
            seen['is_internal_error'] = True
        seen['eager_mismatch'] = error
        # ... and in a graph, with the same error type.
        dtype = tf.float32 if rank == 0 else tf.float64
        seen['graph_mismatch'] = _expect(tf.errors.FailedPreconditionError,
                                         lambda: tf.function(lambda: hvd.allreduce(tf.ones(2, dtype)))(),
                                         'graph dtype mismatch', 'HorovodAllreduce')
        seen['root_mismatch'] = _expect(tf.errors.FailedPreconditionError,
                                        lambda: hvd.broadcast(tf.ones(2), rank, name='roots'), 'root mismatch')
    ok = hvd.allreduce(tf.constant([float(rank)]), op=hvd.Sum, name='after_errors').numpy()
    close(ok, [n * (n - 1) / 2], 'allreduce after the errors')
    seen['after'] = True
    return seen


def _in_every_mode(build, session_init=False):
    """Runs ``build()`` (which makes Horovod ops) eagerly, inside a tf.function and in a TF1
    graph evaluated by ``Session.run``; returns {mode: the exception it raised, or None}."""
    def function():
        return tf.function(build, autograph=False)()

    def session():
        with tf.Graph().as_default():
            fetches = build()
            with tf.compat.v1.Session() as sess:
                if session_init:
                    sess.run(tf.compat.v1.global_variables_initializer())
                return sess.run(fetches)

    raised = {}
    for mode, run in (('eager', build), ('function', function), ('session', session)):
        try:
            run()
            raised[mode] = None
        except Exception as e:  # noqa: BLE001 - the caller checks the type
            raised[mode] = e
    return raised


def error_types():
    """Every collective's cross-rank mismatch raises tf.errors.FailedPreconditionError, and every
    argument the engine refuses tf.errors.InvalidArgumentError, eagerly, in tf.function and in a
    TF1 Session.run alike (a graph's Python calls used to turn both into UnknownError). Returns
    {case: {mode: error class name}} (np >= 2)."""
    hvd = _hvd()
    rank, n = hvd.rank(), hvd.size()
    if n < 2:
        return None
    variables = {}

    def variable():
        # One variable for eager mode and tf.function (which may trace twice), one per TF1 graph.
        key = tf.compat.v1.executing_eagerly_outside_functions() or tf.compat.v1.get_default_graph()
        if key not in variables:
            with tf.init_scope():
                variables[key] = tf.Variable(tf.ones([rank + 1]))
        return variables[key]

    # Rank-dependent arguments: every rank submits the op, the ranks disagree.
    mismatches = {
        'allreduce_shape': lambda: hvd.allreduce(tf.ones([rank + 1])),
        'allreduce_dtype': lambda: hvd.allreduce(tf.ones([2], tf.float32 if rank == 0 else tf.float64)),
        'allreduce_op': lambda: hvd.allreduce(tf.ones([2]), op=hvd.Sum if rank == 0 else hvd.Max),
        'raw_allreduce_scale': lambda: hvd._allreduce(tf.ones([2]), prescale_factor=float(rank + 1)),
        'grouped_allreduce': lambda: hvd.grouped_allreduce([tf.ones([2]), tf.ones([rank + 1])]),
        'allgather': lambda: hvd.allgather(tf.ones([2, rank + 1])),
        'allgather_dtype': lambda: hvd.allgather(tf.ones([2], tf.int32 if rank == 0 else tf.int64)),
        'grouped_allgather': lambda: hvd.grouped_allgather([tf.ones([1, 2]), tf.ones([2, rank + 1])]),
        'broadcast_shape': lambda: hvd.broadcast(tf.ones([rank + 1]), 0),
        'broadcast_root': lambda: hvd.broadcast(tf.ones([2]), rank),
        'broadcast_inplace': lambda: hvd.broadcast_(variable(), 0),
        'alltoall': lambda: hvd.alltoall(tf.ones([n, rank + 1])),
        'alltoall_splits': lambda: hvd.alltoall(tf.ones([n, 2], tf.float32 if rank == 0 else tf.float64),
                                                splits=[1] * n),
        'reducescatter': lambda: hvd.reducescatter(tf.ones([n * (rank + 1)])),
        'grouped_reducescatter': lambda: hvd.grouped_reducescatter([tf.ones([n]), tf.ones([n * (rank + 1)])]),
    }
    unknown = hvd.ProcessSet([0])
    unknown.process_set_id = 999
    # Refused on every rank (or, for 'outside', on every rank that calls it), so nothing waits.
    bad_arguments = {
        'broadcast_root_outside': lambda: hvd.broadcast(tf.ones([2]), n),
        'alltoall_splits_sum': lambda: hvd.alltoall(tf.ones([2]), splits=[2] * n),
        'alltoall_splits_negative': lambda: hvd.alltoall(tf.ones([2]), splits=[3] + [-1] * (n - 1)),
        'alltoall_splits_tensor': lambda: hvd.alltoall(tf.ones([2]), splits=tf.constant([2] * n)),
        'unknown_process_set': lambda: hvd.allreduce(tf.ones([2]), process_set=unknown),
    }
    first = hvd.add_process_set([0])
    if rank != 0:
        bad_arguments['outside_process_set'] = lambda: hvd.allgather(tf.ones([1]), process_set=first)
    seen = {}
    for cases, expected in ((mismatches, tf.errors.FailedPreconditionError),
                            (bad_arguments, tf.errors.InvalidArgumentError)):
        for case, build in cases.items():
            raised = _in_every_mode(build, session_init=case == 'broadcast_inplace')
            for mode, error in raised.items():
                if not isinstance(error, expected):
                    raise AssertionError(f'{case} ({mode}): expected {expected.__name__}, got {error!r}')
                if expected is tf.errors.FailedPreconditionError and 'Horovod' not in str(error):
                    raise AssertionError(f'{case} ({mode}): the message does not name the op: {error}')
            seen[case] = {mode: type(error).__name__ for mode, error in raised.items()}
    hvd.remove_process_set(first)
    # Still usable, in a graph too.
    summed = _in_every_mode(lambda: hvd.allreduce(tf.constant([float(rank)]), op=hvd.Sum, name='after'))
    if any(summed.values()):
        raise AssertionError(f'allreduce after the errors: {summed}')
    return seen


def _sparse_case(rank, dtype, salt):
    """Rank ``rank``'s slices of a [5, 2] tensor: 3 rows with a repeated index, rank-dependent
    values (negative too for signed dtypes) whose sums over ranks are odd as often as even, so a
    wrong rounding of the average shows."""
    rng = rng_for(rank, salt)
    low = -9 if np.issubdtype(dtype, np.signedinteger) or np.issubdtype(dtype, np.floating) else 0
    values = rng.integers(low, 10, (3, 2)).astype(dtype)
    indices = np.array([rank % 5, (rank + 2) % 5, rank % 5], np.int64)
    return values, indices


def _densify(values, indices, dtype):
    dense = np.zeros((5, 2), dtype)
    np.add.at(dense, np.asarray(indices), np.asarray(values, dtype))
    return dense


def _average_reference(per_rank, dtype, n):
    """The dense path's Average (core.md §6.2): the sum in the dtype, then times 1/n in float64
    truncated toward zero (integers), in float32 (float16) or in the dtype's precision."""
    total = np.sum(per_rank, axis=0, dtype=dtype)
    if np.issubdtype(dtype, np.integer):
        return (total.astype(np.float64) * (1.0 / n)).astype(dtype)
    if dtype == np.float16:
        return (total.astype(np.float32) * np.float32(1.0 / n)).astype(np.float16)
    return total * dtype.type(1.0 / n)


def sparse_average():
    """allreduce of tf.IndexedSlices with op=Average, alone and in a grouped_allreduce with a
    dense tensor, for every dtype the dense allreduce takes, eagerly, in tf.function and in a TF1
    Session (all dtypes in one graph per mode): the result keeps the dtype and, densified, equals
    the dense path's average of the densified inputs (numpy reference); the dense member equals
    its own reference."""
    hvd = _hvd()
    rank, n = hvd.rank(), hvd.size()
    cases = []  # (dtype, this rank's values and indices, dense input, expected sparse, expected dense)
    for salt, name in enumerate(['uint8', 'int8', 'int32', 'int64', 'float16', 'float32', 'float64']):
        dtype = np.dtype(name)
        slices = [_sparse_case(r, dtype, salt) for r in range(n)]
        dense_inputs = [rng_for(r, 100 + salt).integers(0, 10, (3,)).astype(dtype) for r in range(n)]
        cases.append((dtype, slices[rank], dense_inputs[rank],
                      _average_reference([_densify(v, i, dtype) for v, i in slices], dtype, n),
                      _average_reference(dense_inputs, dtype, n)))

    def build():
        outputs = []
        for _, (values, indices), dense_input, _, _ in cases:
            slices = tf.IndexedSlices(tf.constant(values), tf.constant(indices), tf.constant([5, 2], tf.int64))
            alone = hvd.allreduce(slices, op=hvd.Average)
            dense, mixed = hvd.grouped_allreduce([tf.constant(dense_input), slices], op=hvd.Average)
            outputs.append((alone.values, alone.indices, mixed.values, mixed.indices, dense))
        return outputs

    def session():
        with tf.Graph().as_default():
            fetches = build()
            with tf.compat.v1.Session() as sess:
                return sess.run(fetches)

    checks = 0
    for mode, run in (('eager', build), ('function', tf.function(build)), ('session', session)):
        for (dtype, _, _, expected, expected_dense), got in zip(cases, run(), strict=True):
            got = [np.asarray(g) for g in got]
            for what, values, indices in (('alone', got[0], got[1]), ('mixed', got[2], got[3])):
                if values.dtype != dtype:
                    raise AssertionError(f'{dtype} {what} {mode}: values of dtype {values.dtype}')
                dense = _densify(values, indices, dtype)
                exact = np.issubdtype(dtype, np.integer)
                atol = 1e-2 if dtype == np.float16 else 1e-6
                if exact and not np.array_equal(dense, expected) or not np.allclose(dense, expected, atol=atol):
                    raise AssertionError(f'{dtype} {what} {mode}: got {dense!r}, expected {expected!r}')
                checks += 1
            if not np.array_equal(got[4], expected_dense):
                raise AssertionError(f'{dtype} mixed {mode} dense member: got {got[4]!r}, expected {expected_dense!r}')
    return checks


def alignment():
    """What the bridge hands to TF is 64-byte aligned, including engine-allocated results."""
    from horovod.tensorflow import _engine
    hvd = _hvd()
    misaligned = np.zeros(17, np.uint8)[1:].view(np.uint8)
    outs = _engine.run('allgather', [misaligned], ['align.gather'], {'set_id': 0})
    outs += _engine.run('allreduce', [np.ones(5)], ['align.reduce'],
                        {'set_id': 0, 'op': hvd.Sum, 'prescale': 1.0, 'postscale': 1.0})
    return [int(o.ctypes.data % 64) for o in outs if o.size]


def reduce():
    """hvd.reduce to each root, eagerly and in tf.function: the root gets the reduction (Sum; Average
    with scale factors), the other ranks their input; a root outside the set is refused."""
    hvd = _hvd()
    rank, n = hvd.rank(), hvd.size()
    inputs = [np.arange(6, dtype=np.float32).reshape(2, 3) * (r + 1) for r in range(n)]
    checked = 0
    for root in range(n):
        for op, pre, post, reference in [(hvd.Sum, 1.0, 1.0, sum(inputs)),
                                         (hvd.Average, 2.0, 0.5, sum(inputs) * 2.0 / n * 0.5)]:
            x = tf.constant(inputs[rank])
            # Named: in a graph the default name comes from the input tensor's, which differs by rank.
            eager, graph = both_modes(functools.partial(hvd.reduce, x, root, name=f'reduce.{root}.{op}', op=op,
                                                        prescale_factor=pre, postscale_factor=post))
            expected = reference if rank == root else inputs[rank]
            close(eager, expected, f'eager reduce to {root}')
            close(graph, expected, f'graph reduce to {root}')
            checked += 1
    try:
        hvd.reduce(tf.ones(2), n)
        refused = None
    except ValueError as e:
        refused = str(e)
    return {'checked': checked, 'refused': refused}


def process_sets():
    """The shared dynamic process-set suite through the eager adapter (np >= 2)."""
    from horovod_testing.process_sets import run_process_set_suite
    from tf_adapter import EagerAdapter
    hvd = _hvd()
    rank, n = hvd.rank(), hvd.size()
    if n < 2:
        return None
    counts = run_process_set_suite(EagerAdapter)
    # The same set ids reach the engine from a graph: members reduce, gather and read the size.
    members = [0, n - 1] if n > 2 else [n - 1]
    ps = hvd.add_process_set(members)
    if rank in members:
        def step():
            return (hvd.allreduce(tf.constant([float(rank + 1)]), op=hvd.Sum, process_set=ps),
                    hvd.allgather(tf.constant([rank]), process_set=ps), hvd.size_op(ps.process_set_id))
        summed, gathered, set_size = tf.function(step)()
        close(summed, [float(sum(m + 1 for m in members))], 'graph allreduce on a process set')
        if gathered.numpy().tolist() != members or int(set_size) != len(members):
            raise AssertionError(f'graph allgather / size_op on {members}: {gathered}, {set_size}')
        counts['graph_member_ops'] = 3
    else:
        counts['graph_member_ops'] = 0
    hvd.remove_process_set(ps)
    return counts


def join():
    """The shared join suite (np >= 2); last, since ranks leave it at different times."""
    from horovod_testing.collectives import run_join_suite
    from tf_adapter import EagerAdapter
    if _hvd().size() < 2:
        return None
    return run_join_suite(EagerAdapter)


def elastic():
    """hvd.elastic: state sync from rank 0, commit and restore, and run() retrying after a
    collective failed inside a graph (UnknownError naming a Horovod op), with Horovod reset.
    Last: the retry shuts Horovod down and initialises it again."""
    hvd = _hvd()
    rank, n = hvd.rank(), hvd.size()
    _expect(ValueError, lambda: hvd.elastic.TensorFlowKerasState(tf.keras.Sequential([tf.keras.layers.Dense(2)])),
            'unbuilt model', 'build')
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
    model.set_weights([np.full((3, 2), float(rank), np.float32), np.full(2, float(rank), np.float32)])
    state = hvd.elastic.TensorFlowKerasState(model, batch=rank)
    attempts = []

    @hvd.elastic.run
    def train(state):
        attempts.append((state.batch, float(model.get_weights()[0][0, 0])))
        for _ in range(3):
            model.set_weights([w + 1 for w in model.get_weights()])
            state.batch += 1
            if len(attempts) == 1 and state.batch == 2:
                raise tf.errors.UnknownError(None, None, 'HorovodAllreduce of x failed: simulated peer failure')
            state.commit()
        total = hvd.allreduce(tf.constant(model.get_weights()[0]), op=hvd.Sum, name='elastic_total').numpy()
        return state.batch, float(total[0, 0])

    batch, total = train(state)
    # Synced from rank 0 (batch 0, weights 0); rolled back to the commit after one step.
    if attempts != [(0, 0.0), (1, 1.0)] or batch != 4 or total != 4.0 * n:
        raise AssertionError(f'elastic run: attempts {attempts}, batch {batch}, total {total}')

    @hvd.elastic.run
    def unrelated(state):
        raise tf.errors.UnknownError(None, None, 'not a Horovod failure')

    _expect(tf.errors.UnknownError, lambda: unrelated(state), 'unrelated UnknownError propagates')
    variables = [tf.Variable(np.full(2, float(rank)))]
    tf_state = hvd.elastic.TensorFlowState(variables, epoch=rank)
    tf_state.sync()
    variables[0].assign([7.0, 7.0])
    tf_state.restore()
    close(variables[0].numpy(), np.zeros(2), 'TensorFlowState restored to the synced values')
    return attempts, batch, tf_state.epoch


def bfloat16():
    """bfloat16 tensors, eagerly and inside tf.function: every allreduce case of
    horovod_testing.bfloat16 (bit patterns, checked against numpy's float32 reduction rounded once
    by the test), a group fusing bfloat16 with float32, reducescatter; allgather, broadcast and
    alltoall move the bits unchanged; Compression.bf16 sends float32 as bfloat16. Returns
    {'eager': results, 'graph': results} in horovod_testing.bfloat16.check's form."""
    from horovod_testing.bfloat16 import CASES, COLUMNS, COUNTS, FUSED, ROWS, bf16_bits, values
    hvd = _hvd()
    rank, n = hvd.rank(), hvd.size()
    ops = {'sum': hvd.Sum, 'average': hvd.Average, 'scaled': hvd.Sum, 'min': hvd.Min, 'max': hvd.Max,
           'product': hvd.Product}

    def bf16(x):
        return tf.cast(tf.constant(x), tf.bfloat16)

    def run(mode):
        out = {}
        for name, (_, prescale, postscale, product) in CASES.items():
            for count in COUNTS:
                out[f'{name}.{count}'] = hvd.allreduce(bf16(values(count, rank, product)), op=ops[name],
                                                       prescale_factor=prescale, postscale_factor=postscale or 1.0,
                                                       name=f'{mode}.{name}.{count}')
        for round_ in range(2):
            group = [bf16(values(FUSED, rank)), tf.constant(values(FUSED, rank)), bf16(values(FUSED, rank + 7))]
            out[f'fused.{round_}'] = hvd.grouped_allreduce(group, op=hvd.Average, name=f'{mode}.fused')
        x = tf.reshape(bf16(values(ROWS * COLUMNS, rank)), (ROWS, COLUMNS))
        for op in ('sum', 'average'):
            out[f'reducescatter.{op}'] = tf.reshape(hvd.reducescatter(x, op=ops[op], name=f'{mode}.rs.{op}'), [-1])
        moved = bf16(values(5 * n, rank))
        out['allgather'] = hvd.allgather(tf.reshape(moved, (n, 5)))
        out['broadcast'] = hvd.broadcast(moved, root_rank=n - 1)
        out['alltoall'] = hvd.alltoall(moved)
        out['compressed'] = hvd.allreduce(tf.constant(values(7, rank)), op=hvd.Sum, compression=hvd.Compression.bf16)
        return out

    def bits(t, mode):
        if t.dtype == tf.float32:
            return t.numpy().tolist()
        if t.dtype != tf.bfloat16:
            raise AssertionError(f'{mode}: a bfloat16 collective returned {t.dtype.name}')
        return tf.bitcast(t, tf.uint16).numpy().tolist()

    results = {}
    for mode, fn in (('eager', functools.partial(run, 'eager')),
                     ('graph', tf.function(functools.partial(run, 'graph')))):
        out = fn()
        compressed = out.pop('compressed')
        if compressed.dtype != tf.float32:
            raise AssertionError(f'{mode}: Compression.bf16 returned {compressed.dtype.name}, expected float32')
        expected = np.stack([values(7, r) for r in range(n)]).sum(axis=0, dtype=np.float32)
        rounded = (bf16_bits(expected).astype(np.uint32) << 16).view(np.float32)
        if not np.array_equal(compressed.numpy(), rounded):
            raise AssertionError(f'{mode} Compression.bf16: {compressed.numpy()} for {rounded}')

        moved = [bf16_bits(values(5 * n, r)) for r in range(n)]
        for key, want in (('allgather', np.concatenate(moved)), ('broadcast', moved[n - 1]),
                          ('alltoall', np.concatenate([m[5 * rank:5 * rank + 5] for m in moved]))):
            got = np.asarray(bits(tf.reshape(out.pop(key), [-1]), mode), dtype=np.uint16)
            if not np.array_equal(got, want):
                raise AssertionError(f'{mode} {key} of bfloat16 changed the bits: {got[:5]} for {want[:5]}')
        results[mode] = {key: [bits(t, mode) for t in v] if isinstance(v, list) else bits(v, mode)
                         for key, v in out.items()}
    return results


def stateful_compression():
    """The compressors with state through DistributedGradientTape and the Keras
    DistributedOptimizer, eagerly, against numpy references: PowerSGD (r = 3) on gradients of
    rank <= 2 trains as the uncompressed tape does (1e-5 over 40 steps) with a float32 bias sent
    uncompressed; its state restored into a new compressor continues identically; TopK sends each
    rank's largest entries (and keeps the rest as its residual); Cast(bf16) equals
    Compression.bf16; Sum sums; inside tf.function reduce raises ValueError. Returns counts."""
    import keras

    from horovod.tensorflow.compression import Cast
    hvd = _hvd()
    rank, n = hvd.rank(), hvd.size()
    # Every rank's inputs are the same 2 rows, its targets its own: each rank's weight gradient is
    # x^T dy, whose columns lie in the span of x's 2 rows, and so does their average.
    x = tf.constant(rng_for(0, 30).standard_normal((2, 12)), tf.float32)
    targets = [tf.constant(rng_for(r, 31).standard_normal((2, 10)), tf.float32) for r in range(n)]
    w0 = rng_for(0, 32).standard_normal((12, 10)).astype(np.float32)

    def train(compression, steps, state=None, op=hvd.Average):
        w, b = tf.Variable(w0), tf.Variable(np.zeros(10, np.float32))
        for _ in range(steps):
            with tf.GradientTape() as t:
                loss = tf.reduce_mean((tf.matmul(x, w) + b - targets[rank]) ** 2)
            gw, gb = hvd.DistributedGradientTape(t, compression=compression, op=op).gradient(loss, [w, b])
            w.assign_sub(0.1 * gw)
            b.assign_sub(0.1 * gb)
        return w.numpy(), b.numpy()

    counts = {}
    plain = train(hvd.Compression.none, 40)
    powersgd = hvd.PowerSGD(rank=3, start_iter=2, min_compression_rate=1.0)
    low = train(powersgd, 40)
    for got, want, what in zip(low, plain, ('weight', 'bias'), strict=True):
        close(got, want, f'PowerSGD {what} after 40 steps', atol=1e-5)
    if powersgd.step != 40 or len(powersgd.q) != 1 or len(powersgd.residuals) != 1:
        raise AssertionError(f'PowerSGD state: step {powersgd.step}, q {list(powersgd.q)}, '
                             f'residuals {list(powersgd.residuals)}')
    # Sum: n times the average's step at the first step (uncompressed: start_iter=2).
    summed = train(hvd.PowerSGD(rank=3, start_iter=0, min_compression_rate=1.0), 1, op=hvd.Sum)
    averaged = train(hvd.PowerSGD(rank=3, start_iter=0, min_compression_rate=1.0), 1)
    close(w0 - summed[0], n * (w0 - averaged[0]), 'PowerSGD with Sum', atol=1e-5)
    # A checkpoint's state continues identically in a new compressor.
    grads = [('w', tf.constant(rng_for(rank, 33).standard_normal((8, 12)), tf.float32))]
    first = hvd.PowerSGD(rank=2, start_iter=0)
    first.reduce(grads)
    restored = hvd.PowerSGD(rank=2, start_iter=0)
    restored.load_state_dict(first.state_dict())
    close(restored.reduce(grads)[0], first.reduce(grads)[0], 'PowerSGD restored from state_dict', atol=0)
    counts['powersgd'] = powersgd.step
    # TopK: every rank's k largest entries, added up and averaged; the rest is the residual.
    topk = hvd.TopK(ratio=0.25)
    grads = [(f'g{i}', tf.constant(rng_for(rank, 40 + i).standard_normal(shape), tf.float32))
             for i, shape in enumerate([(4, 5), (7,)])]
    reduced = topk.reduce(grads)
    for i, ((name, grad), result) in enumerate(zip(grads, reduced, strict=True)):
        shape = grad.shape.as_list()
        k = int(np.ceil(0.25 * np.prod(shape)))
        expected = np.zeros(int(np.prod(shape)))
        for r in range(n):
            values = rng_for(r, 40 + i).standard_normal(shape).reshape(-1)
            chosen = np.argsort(-np.abs(values))[:k]
            expected[chosen] += values[chosen]
            if r == rank:
                residual = values.copy()
                residual[chosen] = 0
                close(topk.residuals[name], residual.reshape(shape), f'TopK residual of {name}')
        close(result, (expected / n).reshape(shape), f'TopK average of {name}')
    counts['topk'] = topk.step
    # Cast(bf16) reduces as Compression.bf16 does, in one group.
    cast = Cast(hvd.Compression.bf16).reduce(grads)
    for (name, grad), result in zip(grads, cast, strict=True):
        close(result, hvd.allreduce(grad, compression=hvd.Compression.bf16, name=f'cast.{name}'),
              f'Cast(bf16) of {name}', atol=0)
    # The Keras optimizer wrapper takes one too (eagerly): one SGD step of the average gradient.
    def local_gradient(r):
        w = tf.Variable(w0)
        with tf.GradientTape() as t:
            loss = tf.reduce_mean((tf.matmul(x, w) - targets[r]) ** 2)
        return t.gradient(loss, w).numpy()

    w = tf.Variable(w0)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), compression=hvd.PowerSGD(rank=3, start_iter=0,
                                                                                        min_compression_rate=1.0))
    with tf.GradientTape() as t:
        loss = tf.reduce_mean((tf.matmul(x, w) - targets[rank]) ** 2)
    opt.apply_gradients([(t.gradient(loss, w), w)])
    close(w.numpy(), w0 - 0.1 * np.mean([local_gradient(r) for r in range(n)], axis=0),
          'DistributedOptimizer with PowerSGD', atol=1e-5)
    counts['optimizer_step'] = int(opt.iterations.numpy())
    # TensorFlowKerasState keeps a compressor consistent: sync gives every rank rank 0's step and
    # factors and empties the residuals; a reset empties them.
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(10, use_bias=False)])
    compressor = hvd.PowerSGD(rank=2, start_iter=0, min_compression_rate=1.0)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), compression=compressor)

    def keras_step():
        with tf.GradientTape() as t:
            loss = tf.reduce_mean((model(x) - targets[rank]) ** 2)
        opt.apply_gradients(zip(t.gradient(loss, model.trainable_variables), model.trainable_variables, strict=True))

    keras_step()
    state = hvd.elastic.TensorFlowKerasState(model, opt)
    if rank != 0:
        # As a rank that joined with a compressor of its own would be.
        compressor.step = 99
        compressor.q = {k: v * 2.0 for k, v in compressor.q.items()}
    state.sync()
    views = hvd.allgather_object((compressor.step, {k: v.numpy().tolist() for k, v in compressor.q.items()},
                                  len(compressor.residuals)))
    if any(view != views[0] for view in views) or views[0][0] != 1 or views[0][2] != 0 or not views[0][1]:
        raise AssertionError(f'TensorFlowKerasState.sync left the compressors at {[v[0] for v in views]}, '
                             f'residuals {[v[2] for v in views]}')
    keras_step()
    had_residuals = bool(compressor.residuals)
    state.on_reset()
    if not had_residuals or compressor.residuals:
        raise AssertionError(f'residuals before the reset: {had_residuals}, after: {list(compressor.residuals)}')
    counts['elastic_state'] = compressor.step
    # Inside a graph: a clear error, not a silent wrong state.
    try:
        tf.function(lambda: hvd.TopK(0.5).reduce([('g', tf.ones(4))]))()
        raise AssertionError('TopK.reduce inside tf.function did not raise')
    except ValueError as error:
        if 'eagerly' not in str(error):
            raise
    return counts


WORKERS = {
    'import_without_torch': import_without_torch,
    'collectives': collectives,
    'gradients': gradients,
    'tape': tape,
    'optimizer': optimizer,
    'objects_and_variables': objects_and_variables,
    'sync_batch_norm': sync_batch_norm,
    'errors': errors,
    'error_types': error_types,
    'sparse_average': sparse_average,
    'alignment': alignment,
    'reduce': reduce,
    'bfloat16': bfloat16,
    'stateful_compression': stateful_compression,
    'process_sets': process_sets,
    'join': join,
    'elastic': elastic,
}


def run_all():
    """Runs every body in order on this rank; returns {name: ('ok', value) or ('error', text)}.

    A failing body is recorded and the next one runs, so each test reports its own failure (a body
    that failed on only some ranks may leave the others waiting: the job's timeout then ends it)."""
    import time
    start = time.monotonic()
    import horovod.tensorflow as hvd
    # Every body traces many small tf.functions: skip Grappler's graph rewrites of each (CPU time
    # on a shared 2-core machine); what runs is the same graph, unoptimised.
    tf.config.optimizer.set_experimental_options({'disable_meta_optimizer': True})
    hvd.init()
    results = {'seconds': {'import_and_init': time.monotonic() - start}}
    for name, body in WORKERS.items():
        start = time.monotonic()
        try:
            results[name] = ('ok', body())
        except Exception:  # noqa: BLE001 - reported to the test that checks this body
            results[name] = ('error', traceback.format_exc())
        results['seconds'][name] = time.monotonic() - start
    return results
