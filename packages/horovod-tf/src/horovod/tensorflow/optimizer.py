"""Gradient reduction shared by the tapes and optimizers, and ``DistributedOptimizer`` for Keras
optimizers and legacy ``tf.compat.v1.train.Optimizer`` objects."""

import warnings

import tensorflow as tf

from horovod.common.compression import NoneCompressor
from horovod.common.stateful_compression import check_optimizer_options
from horovod.tensorflow.gradient_aggregation import LocalGradientAggregationHelper
from horovod.tensorflow.gradient_aggregation_eager import LocalGradientAggregationHelperEager
from horovod.tensorflow.mpi_ops import (
    Adasum,
    Average,
    Sum,
    _allreduce_start,
    _finish,
    _set_size_value,
    global_process_set,
    rank,
)
from horovod.tensorflow.reduction import grouped_allreduce
from horovod.tensorflow.util import _no_autograph, _ref


def _check_options(op, gradient_predivide_factor, num_groups, groups):
    """Validates the options the tapes and optimizers share; returns ``groups`` (num_groups
    mapped onto it)."""
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError('gradient_predivide_factor other than 1.0 needs op=hvd.Average, got op '
                         f'{op!r} with gradient_predivide_factor={gradient_predivide_factor}.')
    if num_groups:
        warnings.warn('num_groups is deprecated; use groups.', DeprecationWarning, stacklevel=3)
        if groups is None:
            groups = num_groups
    if groups is not None:
        if isinstance(groups, int) and not isinstance(groups, bool):
            if groups <= 0:
                raise ValueError(f'groups must be a positive int or a list of lists of variables, got {groups}.')
        elif not (isinstance(groups, list) and all(isinstance(g, list) and
                                                   all(isinstance(v, tf.Variable) for v in g) for g in groups)):
            raise ValueError('groups must be a positive int or a list of lists of tf.Variable, got '
                             f'{type(groups).__name__}.')
    return groups


def _split_groups(indices, grads, vars, groups):
    """Lists of positions (into ``grads``) reduced together."""
    if groups is None or not indices:
        return [indices] if indices else []
    if isinstance(groups, int):
        k = min(groups, len(indices))
        size, extra = divmod(len(indices), k)
        out, start = [], 0
        for j in range(k):
            end = start + size + (1 if j < extra else 0)
            out.append(indices[start:end])
            start = end
        return out
    if vars is None:
        raise ValueError('groups given as lists of variables need the variables of the gradients.')
    group_of = {}
    for j, group in enumerate(groups):
        for v in group:
            group_of[v.name] = j
    out = [[] for _ in groups]
    singles = []
    for i in indices:
        j = group_of.get(vars[i].name)
        if j is None:
            singles.append([i])
        else:
            out[j].append(i)
    return [g for g in out if g] + singles


def _make_allreduce_grads_fn(name, device_dense, device_sparse, compression, sparse_as_dense, op,
                             gradient_predivide_factor, groups, process_set=global_process_set):
    """Returns ``allreduce_grads(grads, vars=None, use_generic_names=False) -> grads``.

    Every non-None gradient is reduced with ``op`` over ``process_set``; the gradients of one
    group go to the engine as one submission (``groups``: None for a single group, an int k for
    k near-equal groups, or lists of variables matched by ``var.name``, each leftover alone).
    ``sparse_as_dense`` densifies ``tf.IndexedSlices``; otherwise they take the allgather path.
    For Average the gradients are prescaled by ``1/gradient_predivide_factor`` and postscaled by
    it. None gradients stay None. Ops live under ``tf.name_scope(name + '_Allreduce')``; eagerly
    the groups keep fixed engine names, so the engine's response cache serves every step.
    On a rank outside ``process_set`` the gradients are returned unchanged.
    """
    if op == Average:
        prescale, postscale = 1.0 / gradient_predivide_factor, gradient_predivide_factor
    else:
        prescale = postscale = 1.0

    if getattr(compression, 'stateful', False):
        return _make_stateful_reduce_fn(name, compression, op, gradient_predivide_factor, process_set)

    @_no_autograph
    def allreduce_grads(grads, vars=None, use_generic_names=False):
        grads = list(grads)
        if process_set.included() is False:
            # This rank is not in the set: its gradients stay local, unchanged.
            return grads
        with tf.name_scope(name + '_Allreduce'):
            if sparse_as_dense:
                grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
            indices = [i for i, g in enumerate(grads) if g is not None]
            result = list(grads)
            # Every dense group is submitted before the first is waited on, so that the engine can
            # fuse and overlap them; IndexedSlices then take the allgather path of allreduce while
            # the dense groups are in flight.
            in_flight, sparse_work = [], []
            for j, group in enumerate(_split_groups(indices, grads, vars, groups)):
                if use_generic_names:
                    group_name = f'grad_{group[0]}'
                elif tf.executing_eagerly():
                    group_name = f'{name}_Allreduce.group{j}of{len(indices)}'
                else:
                    group_name = None
                sparse = [i for i in group if isinstance(grads[i], tf.IndexedSlices)]
                dense = [i for i in group if not isinstance(grads[i], tf.IndexedSlices)]
                if sparse:
                    sparse_work.append((sparse, None if group_name is None else f'{group_name}.sparse'))
                if dense:
                    compressed = [compression.compress(tf.convert_to_tensor(grads[i])) for i in dense]
                    started = _allreduce_start([c for c, _ in compressed], group_name, op, prescale, postscale,
                                               process_set, ignore_name_scope=use_generic_names)
                    in_flight.append((dense, [ctx for _, ctx in compressed], started))
            for sparse, sparse_name in sparse_work:
                reduced = grouped_allreduce([grads[i] for i in sparse], op=op, process_set=process_set,
                                            name=sparse_name, ignore_name_scope=use_generic_names)
                for i, r in zip(sparse, reduced, strict=True):
                    result[i] = r
            for dense, contexts, started in in_flight:
                for i, r, ctx in zip(dense, _finish(started), contexts, strict=True):
                    result[i] = compression.decompress(r, ctx)
            return result

    return allreduce_grads


def _make_stateful_reduce_fn(name, compression, op, gradient_predivide_factor, process_set):
    """``allreduce_grads`` for a compressor with state (PowerSGD, TopK, Cast): every non-None
    gradient (``tf.IndexedSlices`` densified) goes to one ``compression.reduce`` per step, named
    by its position and its variable's name (eagerly only; see
    ``horovod.tensorflow.stateful_compression``).

    Raises:
        ValueError: ``op`` is neither Average nor Sum, or a gradient predivide factor is set.
    """
    check_optimizer_options(compression, op, gradient_predivide_factor)

    @_no_autograph
    def allreduce_grads(grads, vars=None, use_generic_names=False):
        grads = list(grads)
        if process_set.included() is False:
            return grads
        indices = [i for i, g in enumerate(grads) if g is not None]
        named = []
        for i in indices:
            label = f'{name}.{i}' if vars is None or vars[i] is None else f'{name}.{i}.{vars[i].name}'
            named.append((label, tf.convert_to_tensor(grads[i])))
        result = list(grads)
        for i, reduced in zip(indices, compression.reduce(named, op=op, process_set=process_set), strict=True):
            result[i] = reduced
        return result

    return allreduce_grads


def _reduce_with_locals(allreduce_grads, grads, vars, local_refs, process_set, scale_local_gradients,
                        use_generic_names=False):
    """Reduces the gradients of non-local variables; local ones are kept (divided by the set size
    when ``scale_local_gradients`` and there is a local variable)."""
    grads = list(grads)
    if process_set.included() is False:
        return grads
    is_local = [v is not None and _ref(v) in local_refs for v in vars]
    global_idx = [i for i, loc in enumerate(is_local) if not loc]
    reduced = allreduce_grads([grads[i] for i in global_idx], [vars[i] for i in global_idx], use_generic_names)
    out = list(grads)
    for i, r in zip(global_idx, reduced, strict=True):
        out[i] = r
    if scale_local_gradients and any(is_local):
        n = _set_size_value(process_set)
        for i, loc in enumerate(is_local):
            if loc and out[i] is not None:
                g = out[i]
                if isinstance(g, tf.IndexedSlices):
                    out[i] = tf.IndexedSlices(g.values / tf.cast(n, g.values.dtype), g.indices, g.dense_shape)
                else:
                    out[i] = g / tf.cast(n, g.dtype)
    return out


def _is_keras_optimizer(optimizer):
    try:
        import keras
        if isinstance(optimizer, keras.optimizers.Optimizer):
            return True
    except ImportError:
        pass
    return isinstance(optimizer, tf.keras.optimizers.Optimizer)


def _create_keras_distributed_optimizer(optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
                                        gradient_predivide_factor, op, backward_passes_per_step,
                                        average_aggregated_gradients, groups, process_set, scale_local_gradients):
    """A copy of the Keras ``optimizer`` (``from_config``) of a subclass with the same class name
    whose ``apply``/``apply_gradients`` reduce the gradients first."""
    base = optimizer.__class__
    allreduce_grads = _make_allreduce_grads_fn(name or 'Distributed' + base.__name__, device_dense, device_sparse,
                                               compression, sparse_as_dense, op, gradient_predivide_factor, groups,
                                               process_set)

    def __init__(self, *args, **kwargs):
        base.__init__(self, *args, **kwargs)
        self._hvd_name = name or 'Distributed' + base.__name__
        # TensorFlowKerasState shares and resets a compressor with state (horovod.tensorflow.elastic).
        self._hvd_compression = compression
        self._hvd_local_vars = set()
        self._agg_helper = None
        if backward_passes_per_step > 1 and tf.executing_eagerly():
            self._agg_helper = LocalGradientAggregationHelperEager(
                backward_passes_per_step, self._allreduce, sparse_as_dense, average_aggregated_gradients,
                process_set, scale_local_gradients)
        elif backward_passes_per_step > 1:
            self._agg_helper = LocalGradientAggregationHelper(
                backward_passes_per_step, self._allreduce, sparse_as_dense, average_aggregated_gradients,
                rank(), LocalGradientAggregationHelper._OPTIMIZER_TYPE_KERAS, process_set,
                scale_local_gradients)

    def register_local_var(self, var):
        """Keeps ``var``'s gradient local: it is never reduced (only divided by the set size when
        ``scale_local_gradients``)."""
        self._hvd_local_vars.add(_ref(var))
        if self._agg_helper is not None:
            self._agg_helper.register_local_var(var)

    def _allreduce(self, grads, vars):
        return _reduce_with_locals(allreduce_grads, grads, vars, self._hvd_local_vars, process_set,
                                   scale_local_gradients)

    @_no_autograph
    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        if trainable_variables is None:
            if not self.built:
                raise ValueError('apply(grads) without variables needs a built optimizer; pass the variables.')
            variables = list(self._trainable_variables)
        else:
            variables = list(trainable_variables)
            if not self.built:
                # Build outside any tf.cond branch: the optimizer's slots are variables.
                self.build(variables)
                self.built = True
        if self._agg_helper is None:
            return base.apply(self, self._allreduce(grads, variables), variables)
        reduced = self._agg_helper.compute_gradients(grads, variables)
        return self._agg_helper.apply_gradients(lambda: base.apply(self, reduced, variables), self)

    @_no_autograph
    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        grads = [g for g, _ in grads_and_vars]
        variables = [v for _, v in grads_and_vars]
        self.apply(grads, variables)
        return self.iterations

    cls = type(base.__name__, (base,), {
        '__init__': __init__, '_HAS_AGGREGATE_GRAD': True, 'register_local_var': register_local_var,
        '_allreduce': _allreduce, 'apply': apply, 'apply_gradients': apply_gradients,
        '__module__': base.__module__,
    })
    return cls.from_config(optimizer.get_config())


class _DistributedOptimizer(tf.compat.v1.train.Optimizer):
    """A legacy ``tf.compat.v1.train.Optimizer`` whose gradients are reduced across ranks; see
    ``DistributedOptimizer``."""

    def __init__(self, optimizer, name=None, use_locking=False, device_dense='', device_sparse='',
                 compression=NoneCompressor, sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0,
                 backward_passes_per_step=1, average_aggregated_gradients=False, groups=None,
                 process_set=global_process_set, scale_local_gradients=True):
        if name is None:
            name = 'Distributed' + type(optimizer).__name__
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        self._process_set = process_set
        self._scale_local_gradients = scale_local_gradients
        self._local_vars = set()
        self._allreduce_grads = _make_allreduce_grads_fn(name, device_dense, device_sparse, compression,
                                                         sparse_as_dense, op, gradient_predivide_factor, groups,
                                                         process_set)
        self._agg_helper = None
        if backward_passes_per_step > 1:
            if tf.executing_eagerly():
                raise ValueError('backward_passes_per_step > 1 is not supported in eager mode with a legacy '
                                 'tf.compat.v1.train.Optimizer; use a Keras optimizer or a tf.function.')
            self._agg_helper = LocalGradientAggregationHelper(
                backward_passes_per_step, self._reduce, sparse_as_dense, average_aggregated_gradients, rank(),
                LocalGradientAggregationHelper._OPTIMIZER_TYPE_LEGACY, process_set, scale_local_gradients)

    def register_local_var(self, var):
        """Keeps ``var``'s gradient local (never reduced)."""
        self._local_vars.add(_ref(var))
        if self._agg_helper is not None:
            self._agg_helper.register_local_var(var)

    def _reduce(self, grads, vars):
        return _reduce_with_locals(self._allreduce_grads, grads, vars, self._local_vars, self._process_set,
                                   self._scale_local_gradients)

    def compute_gradients(self, *args, **kwargs):
        """The wrapped optimizer's ``compute_gradients``, then every non-local gradient reduced
        across ranks; returns a list of ``(gradient, variable)``."""
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        grads, vars = zip(*pairs, strict=True) if pairs else ((), ())
        if self._agg_helper is not None:
            reduced = self._agg_helper.compute_gradients(list(grads), list(vars))
        else:
            reduced = self._reduce(list(grads), list(vars))
        return list(zip(reduced, vars, strict=True))

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """The wrapped optimizer's ``apply_gradients``; with aggregation only every
        ``backward_passes_per_step``-th call applies (the others only advance ``global_step``)."""
        if self._agg_helper is None:
            return self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)
        grads_and_vars = list(grads_and_vars)

        def apply():
            with tf.control_dependencies([self._optimizer.apply_gradients(grads_and_vars, global_step=global_step,
                                                                          name=name)]):
                return tf.constant(True)

        def skip():
            if global_step is None:
                return tf.constant(False)
            with tf.control_dependencies([tf.compat.v1.assign_add(global_step, 1)]):
                return tf.constant(False)

        # In a TF1 graph nothing orders the counter's read after compute_gradients' update but
        # the data: read it after the gradients exist.
        with tf.control_dependencies([g for g, _ in grads_and_vars if g is not None]):
            return tf.cond(tf.equal(self._agg_helper.counter.read_value(), 0), apply, skip).op

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense='', device_sparse='',
                         compression=NoneCompressor, sparse_as_dense=False, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=global_process_set, scale_local_gradients=True):
    """Wraps an optimizer so that gradients are averaged (or summed) across ranks before they are
    applied.

    Args:
        optimizer: a Keras optimizer (``keras.optimizers.Optimizer``) or a legacy
            ``tf.compat.v1.train.Optimizer``.
        name: name of the wrapper (default ``'Distributed' + class name``).
        use_locking: passed to the legacy optimizer base.
        device_dense, device_sparse: accepted for compatibility; every op runs on the CPU.
        compression: ``Compression.none``, ``.fp16`` or ``.bf16`` (a cast around each allreduce),
            or a compressor with state: ``hvd.PowerSGD``, ``hvd.TopK`` or
            ``hvd.compression.Cast`` (eagerly only; ``horovod.tensorflow.stateful_compression``).
        sparse_as_dense: densify ``tf.IndexedSlices`` gradients before reducing.
        backward_passes_per_step: accumulate this many batches of gradients locally and reduce
            once (Keras optimizers; legacy optimizers in graph mode).
        op: ``hvd.Average`` (default) or ``hvd.Sum``.
        gradient_predivide_factor: with Average, divide by this before and multiply after the sum.
        average_aggregated_gradients: divide the accumulated sum by ``backward_passes_per_step``.
        num_groups: deprecated form of ``groups``.
        groups: None, a positive int k (k groups of gradients, each one submission) or a list of
            lists of variables reduced together.
        process_set: the ``ProcessSet`` to reduce over.
        scale_local_gradients: divide the gradients of registered local variables by the set size.

    Returns:
        Keras: a new optimizer of a subclass with the same class name and config (saved models load
        without Horovod). Legacy: a ``tf.compat.v1.train.Optimizer`` wrapping ``optimizer``.

    Raises:
        ValueError: gradient_predivide_factor != 1 without Average, Adasum with
            average_aggregated_gradients or with a Keras optimizer, bad groups, an op other than
            Average/Sum for Keras, backward_passes_per_step > 1 with a legacy optimizer eagerly.
        NotImplementedError: Adasum with a legacy optimizer (not in this release).
    """
    groups = _check_options(op, gradient_predivide_factor, num_groups, groups)
    if op == Adasum and average_aggregated_gradients:
        raise ValueError('Adasum cannot be combined with average_aggregated_gradients.')
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        if op == Adasum:
            raise NotImplementedError('op=hvd.Adasum is not supported by this release of horovod.tensorflow.')
        return _DistributedOptimizer(optimizer, name, use_locking, device_dense, device_sparse, compression,
                                     sparse_as_dense, op, gradient_predivide_factor, backward_passes_per_step,
                                     average_aggregated_gradients, groups, process_set, scale_local_gradients)
    if not _is_keras_optimizer(optimizer):
        raise ValueError('DistributedOptimizer expects a Keras optimizer or a tf.compat.v1.train.Optimizer, got '
                         f'{type(optimizer).__name__}.')
    if op == Adasum:
        raise ValueError('op=hvd.Adasum is not supported with Keras optimizers.')
    if op not in (Average, Sum):
        raise ValueError(f'DistributedOptimizer supports op=hvd.Average and hvd.Sum, got {op!r}.')
    return _create_keras_distributed_optimizer(optimizer, name, device_dense, device_sparse, compression,
                                               sparse_as_dense, gradient_predivide_factor, op,
                                               backward_passes_per_step, average_aggregated_gradients, groups,
                                               process_set, scale_local_gradients)
