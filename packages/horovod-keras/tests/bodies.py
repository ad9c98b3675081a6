"""Worker bodies run on every rank of a job (see jobs.py); each returns numpy values that the
tests compare with a numpy reference. Keras and Horovod are imported inside the bodies: the
first body checks what importing horovod.keras pulls in."""

import os
import sys
import tempfile

import numpy as np

LR = 0.5
W0 = np.array([[0.5, -1.0], [0.25, 2.0], [-0.75, 1.5]], dtype=np.float32)
B0 = np.array([0.125, -0.5], dtype=np.float32)


def rank_grads(rank, step=0):
    """Gradients of rank ``rank`` for (W0, B0)-shaped variables; multiples of 1/8, exact in
    float16."""
    gw = (np.arange(6, dtype=np.float32).reshape(3, 2) - 2.0 + rank * 1.5 + step) / 8.0
    gb = np.array([rank + 1.0, -2.0 * rank + step], dtype=np.float32) / 4.0
    return gw, gb


def rank_data(rank, n=4):
    """Inputs (n, 3) and targets (n, 2) of rank ``rank``."""
    x = (np.arange(n * 3, dtype=np.float32).reshape(n, 3) / 10.0 - 0.3 * rank)
    y = np.stack([np.arange(n, dtype=np.float32) * 0.5 + rank, -np.ones(n, np.float32)], 1)
    return x, y


def _hvd():
    import keras

    import horovod.keras as hvd
    return keras, hvd


def _np(keras, value):
    return np.asarray(keras.ops.convert_to_numpy(value))


def imports():
    """Imports horovod.keras and records which frameworks and Horovod packages came with it."""
    before = set(sys.modules)
    import keras

    import horovod.keras as hvd
    hvd.init()
    modules = set(sys.modules)

    def loaded(name):
        return any(m == name or m.startswith(name + '.') for m in modules)

    return {'keras_backend': keras.backend.backend(), 'torch': loaded('torch'),
            'tensorflow': loaded('tensorflow'),
            'horovod.torch': loaded('horovod.torch'),
            'horovod.tensorflow': loaded('horovod.tensorflow'),
            'torch_before': 'torch' in before, 'rank': hvd.rank(), 'size': hvd.size()}


def ops():
    keras, hvd = _hvd()
    r, n = hvd.rank(), hvd.size()
    x = np.arange(6, dtype=np.float32).reshape(2, 3) + r
    out = {
        'average': _np(keras, hvd.allreduce(x, name='avg')),
        'sum': _np(keras, hvd.allreduce(x, op=hvd.Sum)),
        'average_false': _np(keras, hvd.allreduce(x, average=False)),
        'scaled': _np(keras, hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0,
                                           postscale_factor=0.25)),
        'int_sum': _np(keras, hvd.allreduce(np.array([r + 1, 10], np.int32), op=hvd.Sum)),
        'fp16': _np(keras, hvd.allreduce(x, compression=hvd.Compression.fp16)),
        'bf16': _np(keras, hvd.allreduce(x, compression=hvd.Compression.bf16)),
        'gather': _np(keras, hvd.allgather(np.full((r + 1, 2), r, np.float32))),
        'broadcast': _np(keras, hvd.broadcast(x, root_rank=n - 1)),
        'reducescatter': _np(keras, hvd.reducescatter(
            np.arange(4 * n, dtype=np.float32).reshape(2 * n, 2) + r, op=hvd.Sum)),
    }
    variables = [keras.Variable(np.full((2, 2), r, np.float32), trainable=False),
                 keras.Variable(np.int32(r * 7), dtype='int32', trainable=False),
                 keras.Variable(np.arange(3, dtype=np.float64) * (r + 1), dtype='float64',
                                trainable=False)]
    hvd.broadcast_variables(variables, root_rank=n - 1)
    out['broadcast_variables'] = [_np(keras, v.value) for v in variables]
    errors = {}
    for label, call in [('op_and_average', lambda: hvd.allreduce(x, average=False, op=hvd.Sum)),
                        ('global_variables', lambda: hvd.broadcast_global_variables(0))]:
        try:
            call()
            errors[label] = None
        except (ValueError, RuntimeError) as e:
            errors[label] = (type(e).__name__, str(e))
    out['errors'] = errors
    return out


OPTIMIZER_CASES = {
    'average': {},
    'sum': {'op': 'Sum'},
    'predivide': {'gradient_predivide_factor': 2.0},
    'groups_int': {'groups': 2},
    'groups_list': {'groups': 'w'},
    'fp16': {'compression': 'fp16'},
    'bf16': {'compression': 'bf16'},
    'local_bias': {'local': True},
    'none_bias_grad': {'none_bias': True},
    'apply_gradients': {'apply_gradients': True},
}


def optimizer_apply():
    """Applies each rank's ``rank_grads`` once through a DistributedOptimizer made with each
    case's options; returns the resulting variables per case."""
    keras, hvd = _hvd()
    r = hvd.rank()
    results = {}
    for case, options in OPTIMIZER_CASES.items():
        w = keras.Variable(W0.copy(), name='w')
        b = keras.Variable(B0.copy(), name='b')
        kwargs = {}
        if options.get('op') == 'Sum':
            kwargs['op'] = hvd.Sum
        if 'gradient_predivide_factor' in options:
            kwargs['gradient_predivide_factor'] = options['gradient_predivide_factor']
        if options.get('groups') == 'w':
            kwargs['groups'] = [[w]]
        elif 'groups' in options:
            kwargs['groups'] = options['groups']
        if 'compression' in options:
            kwargs['compression'] = getattr(hvd.Compression, options['compression'])
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR), **kwargs)
        if options.get('local'):
            opt.register_local_var(b)
        gw, gb = rank_grads(r)
        grads = [keras.ops.convert_to_tensor(gw),
                 None if options.get('none_bias') else keras.ops.convert_to_tensor(gb)]
        if options.get('apply_gradients'):
            opt.apply_gradients(zip(grads, [w, b], strict=True))
        else:
            opt.apply(grads, [w, b])
        results[case] = (_np(keras, w.value), _np(keras, b.value), int(_np(keras, opt.iterations)),
                         type(opt).__name__, opt._name)
    # Local aggregation: two calls, one update.
    for case, average in [('bpps2', False), ('bpps2_average', True)]:
        w = keras.Variable(W0.copy(), name='w')
        b = keras.Variable(B0.copy(), name='b')
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR), backward_passes_per_step=2,
                                       average_aggregated_gradients=average)
        seen = []
        for step in range(2):
            gw, gb = rank_grads(r, step)
            opt.apply([keras.ops.convert_to_tensor(gw), keras.ops.convert_to_tensor(gb)], [w, b])
            seen.append((_np(keras, w.value), _np(keras, b.value),
                         int(_np(keras, opt.iterations)), int(_np(keras, opt._agg_helper.counter))))
        results[case] = seen
    return results


def _dense_model(keras, hvd, optimizer, units_in=3, run_eagerly=False):
    model = keras.Sequential([
        keras.Input((units_in,)),
        keras.layers.Dense(2, kernel_initializer=keras.initializers.Constant(W0),
                           bias_initializer=keras.initializers.Constant(B0)),
    ])
    model.compile(optimizer=optimizer, loss='mse', jit_compile=False, run_eagerly=run_eagerly)
    return model


def fit():
    """``model.fit`` with a DistributedOptimizer: one step (one batch), two batches with
    backward_passes_per_step=2, and a PartialDistributedOptimizer whose only layer is local."""
    keras, hvd = _hvd()
    x, y = rank_data(hvd.rank())
    out = {}
    for case, make in [
        ('one_step', lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(LR))),
        ('bpps2', lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(LR),
                                                   backward_passes_per_step=2)),
        ('partial_local', None),
    ]:
        if make is None:
            model = _dense_model(keras, hvd, keras.optimizers.SGD(LR))
            model.compile(optimizer=hvd.PartialDistributedOptimizer(
                keras.optimizers.SGD(LR), local_layers=model.layers[0]), loss='mse',
                jit_compile=False)
        else:
            model = _dense_model(keras, hvd, make())
        batch = 2 if case == 'bpps2' else len(x)
        model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
        kernel, bias = model.get_weights()
        out[case] = (kernel, bias, int(_np(keras, model.optimizer.iterations)))
    return out


class _Recorder:
    """Builds a Keras callback that records what the test needs."""

    @staticmethod
    def make(keras, record):
        class Recorder(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                opt = self.model.optimizer
                record.setdefault('lr', []).append(float(_np(keras, opt.learning_rate)))
                record.setdefault('momentum', []).append(float(opt.momentum))

            def on_train_batch_end(self, batch, logs=None):
                record.setdefault('momentum_after', []).append(
                    float(self.model.optimizer.momentum))

            def on_epoch_end(self, epoch, logs=None):
                record.setdefault('logs', []).append(dict(logs))

        return Recorder()


def callbacks():
    """Two ``model.fit`` runs: one with the broadcast, metric-average and staircase schedule
    callbacks together (initial weights differ per rank), one with warm-up and the best-model
    checkpoint."""
    keras, hvd = _hvd()
    r, n = hvd.rank(), hvd.size()
    out = {}
    x, y = rank_data(r, n=8)

    class AddRankMetric(keras.callbacks.Callback):
        """Adds a rank-dependent metric before MetricAverageCallback averages it."""

        def on_epoch_end(self, epoch, logs=None):
            logs['rank_metric'] = r + 1.0
            out.setdefault('loss_before', []).append(float(logs['loss']))

    keras.utils.set_random_seed(100 + r)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)),
                  loss='mse', jit_compile=False)
    out['initial'] = model.get_weights()
    record = {}
    # 8 examples in batches of 4: 2 steps per epoch.
    model.fit(x, y, batch_size=4, epochs=4, verbose=0, callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(n - 1),
        AddRankMetric(),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.2, multiplier=0.5, start_epoch=1,
                                                   end_epoch=3),
        _Recorder.make(keras, record)])
    out['final'] = model.get_weights()
    out['schedule'] = record

    with tempfile.TemporaryDirectory(prefix=f'hvd-keras-best-{r}-') as folder:
        _best_checkpoint(keras, hvd, model, x, y, folder, out)
    try:
        hvd.callbacks.LearningRateScheduleCallback(initial_lr=None, multiplier=0.5)
        out['initial_lr_none'] = None
    except ValueError as e:
        out['initial_lr_none'] = str(e)
    return out


def _best_checkpoint(keras, hvd, model, x, y, folder, out):
    """BestModelCheckpoint: unset before training, then writes into ``folder``."""
    record = {}
    best = hvd.callbacks.BestModelCheckpoint(monitor='loss')
    best.set_model(model)
    try:
        best.on_train_begin()
        out['best_unset'] = None
    except ValueError as e:
        out['best_unset'] = str(e)
    best.filepath = os.path.join(folder, 'best.keras')
    model = _dense_model(keras, hvd, hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)))
    model.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2,
                                                 momentum_correction=False),
        _Recorder.make(keras, record), best])
    out['warmup'] = record['lr']
    out['best'] = (os.path.isfile(best.filepath), best.save_best_only)


def load_model():
    """Saves a trained model with a DistributedOptimizer, then loads it with plain Keras and with
    hvd.load_model; the distributed copy keeps the optimizer state and trains on."""
    keras, hvd = _hvd()
    r = hvd.rank()
    x, y = rank_data(r)
    model = _dense_model(keras, hvd, hvd.DistributedOptimizer(
        keras.optimizers.SGD(LR, momentum=0.5)))
    model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0)
    with tempfile.TemporaryDirectory(prefix=f'hvd-keras-load-{r}-') as folder:
        return _load_model(keras, hvd, model, x, y, os.path.join(folder, 'model.keras'))


def _load_model(keras, hvd, model, x, y, path):
    model.save(path)
    saved_optimizer = [_np(keras, v.value) for v in model.optimizer.variables]

    plain = keras.models.load_model(path)
    loaded = hvd.load_model(path)
    loaded_fp16 = hvd.load_model(path, compression=hvd.Compression.fp16)
    loaded_optimizer = [_np(keras, v.value) for v in loaded.optimizer.variables]
    # One more step on every rank: the loaded copies reduce their gradients again.
    loaded.fit(x, y, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    model.fit(x, y, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    from horovod._keras import is_distributed
    return {
        'plain_distributed': is_distributed(plain.optimizer),
        'plain_class': type(plain.optimizer).__name__,
        'loaded_distributed': is_distributed(loaded.optimizer),
        'loaded_class': type(loaded.optimizer).__name__,
        'loaded_fp16_compression': (
            loaded_fp16.optimizer._hvd_settings.compression is hvd.Compression.fp16),
        'saved_optimizer': saved_optimizer,
        'loaded_optimizer': loaded_optimizer,
        'weights_after': [w for w in loaded.get_weights()],
        'original_after': [w for w in model.get_weights()],
    }


def errors():
    """Wrong arguments raise ValueError (or RuntimeError) with a message saying what is
    expected."""
    from horovod.common.stateful_compression import PowerSGD
    keras, hvd = _hvd()
    sgd = keras.optimizers.SGD(0.1)
    cases = {
        'adasum': lambda: hvd.DistributedOptimizer(sgd, op=hvd.Adasum),
        'predivide_sum': lambda: hvd.DistributedOptimizer(sgd, op=hvd.Sum,
                                                          gradient_predivide_factor=2.0),
        'bpps_zero': lambda: hvd.DistributedOptimizer(sgd, backward_passes_per_step=0),
        'groups_bad': lambda: hvd.DistributedOptimizer(sgd, groups='two'),
        'not_optimizer': lambda: hvd.DistributedOptimizer(object()),
        'twice': lambda: hvd.DistributedOptimizer(hvd.DistributedOptimizer(sgd)),
        'partial_not_layer': lambda: hvd.PartialDistributedOptimizer(sgd, local_layers=[sgd]),
        'legacy_opts': lambda: hvd.load_model('x.keras', legacy_opts=True),
        'stateful_predivide': lambda: hvd.DistributedOptimizer(sgd, compression=PowerSGD(rank=2),
                                                               gradient_predivide_factor=2.0),
        'not_a_compressor': lambda: hvd.DistributedOptimizer(sgd, compression='fp16'),
    }
    out = {}
    for label, call in cases.items():
        try:
            call()
            out[label] = None
        except ValueError as e:
            out[label] = str(e)
    # The copy keeps the class name (saved models load without Horovod) and from_config works.
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.25), name='mine')
    again = type(opt).from_config(opt.get_config())
    out['class'] = (type(opt).__name__, opt._name, type(again).__name__,
                    float(_np(keras, again.learning_rate)), isinstance(opt, type(sgd).__mro__[1]),
                    callable(opt.variables))
    return out


def tensorflow_only():
    """TensorFlow backend: sparse gradients (tf.IndexedSlices) and horovod.tensorflow.keras."""
    import keras
    if keras.backend.backend() != 'tensorflow':
        try:
            import horovod.tensorflow.keras  # noqa: F401
            return {'tf_keras_import_error': None}
        except ImportError as e:
            return {'tf_keras_import_error': str(e)}
    import tensorflow as tf

    import horovod.keras as hvd
    import horovod.tensorflow.keras as hvd_tf
    r = hvd.rank()
    out = {}
    for case, sparse_as_dense in [('sparse', False), ('sparse_as_dense', True)]:
        table = keras.Variable(np.zeros((4, 2), np.float32))
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), sparse_as_dense=sparse_as_dense)
        grad = tf.IndexedSlices(values=tf.constant([[1.0, 2.0]]) * (r + 1),
                                indices=tf.constant([r % 4]), dense_shape=tf.constant([4, 2]))
        opt.apply([grad], [table])
        out[case] = _np(keras, table.value)
    w = tf.keras.Variable(W0.copy())
    b = tf.keras.Variable(B0.copy())
    opt = hvd_tf.DistributedOptimizer(tf.keras.optimizers.SGD(LR))
    gw, gb = rank_grads(r)

    @tf.function
    def step():
        opt.apply([tf.constant(gw), tf.constant(gb)], [w, b])

    step()
    out['tf_keras_step'] = (w.numpy(), b.numpy())
    out['tf_keras_allreduce'] = hvd_tf.allreduce(np.array([r + 1.0])).numpy()
    out['tf_keras_names'] = (hvd_tf.ProcessSet is hvd_tf.global_process_set.__class__,
                             hvd_tf.callbacks.MetricAverageCallback
                             is hvd.callbacks.MetricAverageCallback)
    return out


def low_rank_grads(rank, step):
    """Gradients of rank ``rank`` at ``step`` for an (8, 6) kernel and a (6,) bias: the kernel's
    is ``a_r v^T`` with ``v`` the same on every rank, so their average has rank 1."""
    v = np.linspace(-1.0, 1.0, 6, dtype=np.float32) + 0.1 * step
    a = np.arange(8, dtype=np.float32) * 0.25 - rank + step
    return np.outer(a, v).astype(np.float32), (v * (rank + 1)).astype(np.float32)


def topk_grads(rank, step):
    """Gradients of rank ``rank`` at ``step`` for a (4, 2) kernel: entries of distinct magnitudes,
    so that top-k has one answer."""
    return np.random.default_rng(100 * rank + step).standard_normal((4, 2)).astype(np.float32)


def stateful():
    """DistributedOptimizer with compressors with state: PowerSGD (r = 2) on gradients whose
    average has rank 1, three steps; TopK (ratio 0.25) with error feedback, two steps, and its
    residuals; ``model.fit`` with TopK(ratio=1) (eagerly on TensorFlow; in a graph it must raise);
    KerasState syncing a compressor that diverged on every rank, then a reset."""
    keras, hvd = _hvd()
    r = hvd.rank()
    out = {}
    w = keras.Variable(np.zeros((8, 6), np.float32), name='w')
    b = keras.Variable(np.zeros(6, np.float32), name='b')
    powersgd = hvd.PowerSGD(rank=2, start_iter=0, min_compression_rate=1)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR), compression=powersgd)
    for step in range(3):
        opt.apply([keras.ops.convert_to_tensor(g) for g in low_rank_grads(r, step)], [w, b])
    out['powersgd'] = (_np(keras, w.value), _np(keras, b.value), powersgd.step, sorted(powersgd.q),
                       sorted(powersgd.residuals))

    w = keras.Variable(np.zeros((4, 2), np.float32), name='w')
    topk = hvd.TopK(ratio=0.25)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR), op=hvd.Sum, compression=topk)
    steps = []
    for step in range(2):
        opt.apply([keras.ops.convert_to_tensor(topk_grads(r, step))], [w])
        steps.append(_np(keras, w.value))
    residuals = topk.state_dict()['residuals']
    out['topk'] = (steps, {name: _np(keras, value) for name, value in residuals.items()})

    x, y = rank_data(r)

    def topk_all():
        return hvd.DistributedOptimizer(keras.optimizers.SGD(LR), compression=hvd.TopK(ratio=1.0))

    if keras.backend.backend() == 'tensorflow':
        try:
            _dense_model(keras, hvd, topk_all()).fit(x, y, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
            out['graph_error'] = None
        except ValueError as e:
            out['graph_error'] = str(e)
    model = _dense_model(keras, hvd, topk_all(), run_eagerly=True)
    model.fit(x, y, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    out['fit'] = model.get_weights()

    powersgd = hvd.PowerSGD(rank=1, start_iter=0, min_compression_rate=1)
    model = _dense_model(keras, hvd, hvd.DistributedOptimizer(keras.optimizers.SGD(LR),
                                                              compression=powersgd))
    powersgd.step = 10 + r
    powersgd.q = {'layer': keras.ops.convert_to_tensor(np.full((2, 1), r, np.float32))}
    powersgd.residuals = {'layer': keras.ops.convert_to_tensor(np.full((3, 2), r + 1, np.float32))}
    state = hvd.elastic.KerasState(model)
    state.sync()
    out['synced'] = (powersgd.step, {k: _np(keras, v) for k, v in powersgd.q.items()}, dict(powersgd.residuals))
    powersgd.residuals = {'layer': keras.ops.convert_to_tensor(np.ones((3, 2), np.float32))}
    state.on_reset()
    out['after_reset'] = dict(powersgd.residuals)
    return out


def elastic():
    """KerasState: sync from rank 0, restore to the last commit, the state callbacks during
    ``model.fit``, and ``elastic.run`` retrying after a HorovodInternalError (with a real
    shutdown and init of Horovod in between)."""
    keras, hvd = _hvd()
    from horovod.common.exceptions import HorovodInternalError
    r = hvd.rank()
    out = {}
    unbuilt = keras.Sequential([keras.layers.Dense(2)])
    try:
        hvd.elastic.KerasState(unbuilt)
        out['unbuilt'] = None
    except ValueError as e:
        out['unbuilt'] = str(e)

    model = _dense_model(keras, hvd, hvd.DistributedOptimizer(keras.optimizers.SGD(LR)))
    model.set_weights([W0 + r, B0 - r])
    state = hvd.elastic.KerasState(model, epoch=r, batch=0)
    state.sync()
    out['synced'] = (model.get_weights(), state.epoch)
    model.set_weights([W0 * 10, B0 * 10])
    state.restore()
    out['restored'] = model.get_weights()

    x, y = rank_data(r, n=8)
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[
        hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
        hvd.elastic.CommitStateCallback(state, batches_per_commit=3)])
    trained = model.get_weights()
    out['after_fit'] = (state.epoch, state.batch, trained)
    model.set_weights([W0 * 10, B0 * 10])
    state.restore()
    out['restored_after_fit'] = model.get_weights()

    attempts = []

    @hvd.elastic.run
    def train(state):
        attempts.append(state.epoch)
        if len(attempts) == 1:
            model.set_weights([W0 * 10, B0 * 10])
            state.epoch = 100
            raise HorovodInternalError('simulated loss of a rank')
        return model.get_weights(), float(_np(keras, hvd.allreduce(np.array([r + 1.0]))[0]))

    weights, average = train(state)
    out['run'] = (attempts, weights, average, hvd.size())
    return out


WORKERS = {
    'imports': imports,
    'ops': ops,
    'optimizer_apply': optimizer_apply,
    'fit': fit,
    'callbacks': callbacks,
    'load_model': load_model,
    'errors': errors,
    'tensorflow_only': tensorflow_only,
    'stateful': stateful,
    # Last: it shuts Horovod down and starts it again.
    'elastic': elastic,
}
