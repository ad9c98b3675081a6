"""Local gradient aggregation: accumulate ``backward_passes_per_step`` batches of gradients on
each rank and allreduce once, so that communication happens once per N backward passes.

The helper keeps one accumulator variable per gradient and a step ``counter`` variable. It is
written with ``tf.cond`` on the counter, so the same code runs eagerly, inside ``tf.function``
and in a TF1 graph; every rank reaches the allreduce on the same call because the counters move
in lockstep.
"""

import tensorflow as tf

from horovod.tensorflow.mpi_ops import global_process_set
from horovod.tensorflow.util import _no_autograph, _ref


class LocalGradientAggregationHelper:
    """Accumulates gradients locally and reduces them every ``backward_passes_per_step`` calls.

    Args:
        backward_passes_per_step (int): calls of ``compute_gradients`` per reduction (>= 1).
        allreduce_func: ``f(grads, vars) -> grads`` reducing a list of dense tensors (None kept).
        sparse_as_dense (bool): densify ``tf.IndexedSlices`` gradients; without it they raise.
        average_aggregated_gradients (bool): divide the accumulated sums by
            ``backward_passes_per_step`` before reducing.
        rank (int): this process's rank (kept for compatibility).
        optimizer_type: ``_OPTIMIZER_TYPE_KERAS`` or ``_OPTIMIZER_TYPE_LEGACY``.
        process_set: the ``ProcessSet`` the gradients are reduced over.
        scale_local_gradients (bool): divide the gradients of registered local variables by the
            set size.
        name (str): prefix of the helper's variable names.

    Raises:
        ValueError: ``backward_passes_per_step`` is not a positive int.
    """

    _OPTIMIZER_TYPE_KERAS = 'optimizer_type_keras'
    _OPTIMIZER_TYPE_LEGACY = 'optimizer_type_legacy'

    def __init__(self, backward_passes_per_step, allreduce_func, sparse_as_dense, average_aggregated_gradients,
                 rank=0, optimizer_type=_OPTIMIZER_TYPE_KERAS, process_set=global_process_set,
                 scale_local_gradients=True, name=''):
        if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) \
                or backward_passes_per_step <= 0:
            raise ValueError(f'backward_passes_per_step must be a positive int, got {backward_passes_per_step!r}.')
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_grads = allreduce_func
        self.sparse_as_dense = sparse_as_dense
        self.average_aggregated_gradients = average_aggregated_gradients
        self.rank = rank
        self.optimizer_type = optimizer_type
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self._name = name
        self.counter = None
        self._accumulators = None
        self._local_vars = set()

    def register_local_var(self, var):
        """Marks ``var`` as local: its gradient is accumulated but never reduced."""
        self._local_vars.add(_ref(var))

    def _init(self, grads):
        with tf.init_scope():
            self.counter = tf.Variable(0, dtype=tf.int32, trainable=False, name=f'{self._name}aggregation_counter')
            self._accumulators = [
                None if g is None else tf.Variable(tf.zeros(g.shape, g.dtype), trainable=False,
                                                   name=f'{self._name}aggregation_accumulator_{i}')
                for i, g in enumerate(grads)]

    def _dense(self, grads):
        out = []
        for g in grads:
            if isinstance(g, tf.IndexedSlices):
                if not self.sparse_as_dense:
                    raise ValueError('IndexedSlices gradients are not supported with backward_passes_per_step > 1 '
                                     'unless sparse_as_dense=True.')
                g = tf.convert_to_tensor(g)
            out.append(g)
        return out

    @_no_autograph
    def compute_gradients(self, grads, vars):
        """Adds ``grads`` to the accumulators. On every ``backward_passes_per_step``-th call, returns
        the reduced accumulated gradients and clears the accumulators; otherwise returns the local
        accumulated values. None gradients stay None.

        Args:
            grads: a list of gradients (dense tensors, ``tf.IndexedSlices`` or None), one per
                variable.
            vars: the variables, in the order of ``grads``.

        Returns:
            A list of gradients in the order of ``grads``.
        """
        grads = self._dense(list(grads))
        vars = list(vars)
        if self._accumulators is None:
            self._init(grads)
        updates = [acc.assign_add(g) for acc, g in zip(self._accumulators, grads, strict=True) if g is not None]
        with tf.control_dependencies(updates):
            step = self.counter.assign_add(1)
        present = [i for i, g in enumerate(grads) if g is not None]

        def reduce():
            values = [self._accumulators[i].read_value() for i in present]
            if self.average_aggregated_gradients:
                values = [v / tf.cast(self.backward_passes_per_step, v.dtype) for v in values]
            reduced = self._allreduce_grads(values, [vars[i] for i in present])
            reduced = [tf.identity(r) for r in reduced]
            with tf.control_dependencies(reduced):
                clears = [self._accumulators[i].assign(tf.zeros_like(self._accumulators[i])) for i in present]
                clears.append(self.counter.assign(0))
            with tf.control_dependencies(clears):
                return [tf.identity(r) for r in reduced]

        def local():
            return [self._accumulators[i].read_value() for i in present]

        with tf.control_dependencies([step]):
            values = tf.cond(tf.equal(self.counter.read_value(), self.backward_passes_per_step), reduce, local)
        if not isinstance(values, (list, tuple)):
            values = [values]
        result = [None] * len(grads)
        for i, v in zip(present, values, strict=True):
            result[i] = v
        return result

    @_no_autograph
    def apply_gradients(self, apply_closure, optimizer, *args, **kwargs):
        """Runs ``apply_closure()`` when the last ``compute_gradients`` reduced (the counter is 0);
        otherwise only increments ``optimizer.iterations``, so the step count moves every call.

        Args:
            apply_closure: ``apply_closure()`` applies the gradients with the wrapped optimizer.
            optimizer: the optimizer whose ``iterations`` counts the steps.
            *args: accepted for compatibility with the optimizer's signature; unused.
            **kwargs: the same.

        Returns:
            A boolean tensor: whether the gradients were applied.
        """

        def apply():
            apply_closure()
            return tf.constant(True)

        def skip():
            optimizer.iterations.assign_add(1)
            return tf.constant(False)

        return tf.cond(tf.equal(self.counter.read_value(), 0), apply, skip)
