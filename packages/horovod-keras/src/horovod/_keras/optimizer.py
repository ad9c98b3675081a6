"""``DistributedOptimizer`` for Keras 3: the wrapped optimizer applies gradients averaged (or
summed) over the ranks of a process set.

Keras 3 reaches every optimizer update through ``Optimizer.apply(grads, variables)``
(``apply_gradients`` calls it, and so do the TensorFlow and PyTorch trainers of ``model.fit``).
The distributed optimizer is an instance of a subclass, made at run time, of the wrapped
optimizer's own class, with :class:`_DistributedOptimizer` in front: its ``apply`` reduces the
gradients across ranks with one grouped allreduce (or one per group of ``groups``) and then hands
them to the wrapped class's ``apply``. The subclass keeps the wrapped class's name and module, so
a model saved with it loads with plain Keras.

With ``backward_passes_per_step = N > 1`` each call adds the gradients into local accumulators;
every N-th call reduces the accumulated sums and applies them, the other calls only advance
``iterations`` (see :class:`_LocalAggregation`).
"""

import os

from horovod.common.util import split_list


class _Settings:
    """What a DistributedOptimizer was asked for; one instance per dynamic class."""

    def __init__(self, keras, backend, base_name, name, compression, sparse_as_dense, op,
                 gradient_predivide_factor, backward_passes_per_step,
                 average_aggregated_gradients, groups, process_set, scale_local_gradients):
        self.keras = keras
        self.backend = backend
        self.base_name = base_name
        self.name = name
        self.compression = compression
        self.sparse_as_dense = sparse_as_dense
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.backward_passes_per_step = backward_passes_per_step
        self.average_aggregated_gradients = average_aggregated_gradients
        self.groups = groups
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients

    def active(self):
        """Whether gradients are reduced at all: this rank belongs to the process set and the set
        has other ranks (or the job is elastic and may grow)."""
        return self.process_set.included() and (
            self.process_set.size() > 1 or os.environ.get("HOROVOD_ELASTIC") == "1")


class _Local:
    """Per-instance state kept out of Keras' attribute tracking (a plain object is not tracked)."""

    def __init__(self):
        self.local_var_ids = set()


class _DistributedOptimizer:
    """Mixin in front of the wrapped optimizer's class (see :func:`create_distributed_optimizer`);
    ``super()`` reaches the wrapped class. The class attribute ``_hvd_settings`` holds the
    Horovod arguments."""

    _HAS_AGGREGATE_GRAD = True
    _hvd_settings = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        settings = self._hvd_settings
        self._name = settings.name or "Distributed" + settings.base_name
        self._hvd_local = _Local()
        self._agg_helper = None

    def register_local_var(self, var):
        """Marks ``var`` (a Keras variable) as local: its gradient is never reduced across ranks
        (it is divided by the process set size when ``scale_local_gradients``)."""
        self._hvd_local.local_var_ids.add(id(var))

    def build(self, variables):
        super().build(variables)
        if self._hvd_settings.backward_passes_per_step > 1 and self._agg_helper is None:
            self._agg_helper = _LocalAggregation(self, variables)

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        if trainable_variables is None:
            if not self.built:
                return super().apply(grads)  # Keras explains that it must be built first
            variables = list(self._trainable_variables)
        else:
            variables = list(trainable_variables)
            if not self.built:
                with self._hvd_settings.keras.name_scope(self.name, caller=self):
                    self.build(variables)
                self.built = True
        if len(grads) != len(variables):
            raise ValueError(f"{self._name}.apply got {len(grads)} gradients for "
                             f"{len(variables)} variables; expected one gradient per variable.")
        if self._agg_helper is not None:
            return self._agg_helper.apply(grads, variables, trainable_variables)
        return super().apply(self._allreduce(grads, variables), trainable_variables)

    def _hvd_apply_reduced(self, grads, trainable_variables):
        return super().apply(grads, trainable_variables)

    def _allreduce(self, grads, variables):
        """Returns ``grads`` reduced over the process set: the gradients of local variables
        scaled, ``None`` entries kept, every other gradient allreduced (grouped)."""
        settings = self._hvd_settings
        if not settings.active():
            return grads
        backend = settings.backend
        out = list(grads)
        local = self._hvd_local.local_var_ids
        reduced = [i for i, (g, v) in enumerate(zip(grads, variables, strict=True))
                   if g is not None and id(v) not in local]
        if settings.scale_local_gradients and local:
            set_size = settings.process_set.size()
            for i, (g, v) in enumerate(zip(grads, variables, strict=True)):
                if g is not None and id(v) in local:
                    out[i] = g * (1.0 / set_size)

        if getattr(settings.compression, "stateful", False):
            return self._reduce_with_state(grads, variables, reduced, out)
        if settings.op == backend.framework.Average:
            prescale, postscale = (1.0 / settings.gradient_predivide_factor,
                                   settings.gradient_predivide_factor)
        else:
            prescale = postscale = 1.0
        dense = []
        for i in reduced:
            g = grads[i]
            if settings.sparse_as_dense:
                g = backend.dense(g)
            if backend.is_sparse(g):
                # Sparse gradients (tf.IndexedSlices) travel as allgathers of their rows.
                out[i] = backend.allreduce(g, settings.op, prescale, postscale,
                                           settings.process_set, name=f"{self._name}.sparse.{i}")
            else:
                dense.append(i)
        for k, group in enumerate(self._groups(dense, variables)):
            compressed = [settings.compression.compress(grads_i)
                          for grads_i in (backend.dense(grads[i]) for i in group)]
            results = backend.grouped_allreduce(
                [t for t, _ in compressed], settings.op, prescale, postscale,
                settings.process_set, name=f"{self._name}.grads.{k}")
            for i, r, (_, ctx) in zip(group, results, compressed, strict=True):
                out[i] = settings.compression.decompress(r, ctx)
        return out

    def _reduce_with_state(self, grads, variables, reduced, out):
        """Reduces the gradients at ``reduced`` (positions in ``grads``) through the compressor
        with state (PowerSGD, TopK, Cast: ``horovod.common.stateful_compression``), in one call of
        its ``reduce`` per step; each gradient (made dense) is named by this optimizer's name, its
        position and its variable's path, so that the compressor keeps its residuals and factors
        per variable. ``groups`` does not apply. On TensorFlow the compressor runs eagerly only
        (``model.compile(..., run_eagerly=True)``); in a graph it raises ValueError."""
        settings = self._hvd_settings
        named = [(f"{self._name}.{i}.{variables[i].path}", settings.backend.dense(grads[i])) for i in reduced]
        combined = settings.compression.reduce(named, op=settings.op, process_set=settings.process_set)
        for i, r in zip(reduced, combined, strict=True):
            out[i] = r
        return out

    def _groups(self, indices, variables):
        """Splits the gradient indices ``indices`` into the allreduce groups ``groups`` asks for:
        all in one group (None), ``k`` contiguous chunks (an int), or the given lists of
        variables plus one group of the gradients they leave out."""
        groups = self._hvd_settings.groups
        if not indices:
            return []
        if groups is None:
            return [indices]
        if isinstance(groups, int):
            return [chunk for chunk in split_list(indices, min(groups, len(indices))) if chunk]
        position = {id(variables[i]): i for i in indices}
        units, taken = [], set()
        for unit in groups:
            members = [position[id(v)] for v in unit if id(v) in position]
            if members:
                units.append(sorted(members))
                taken.update(members)
        rest = [i for i in indices if i not in taken]
        return units + ([rest] if rest else [])

    @property
    def variables(self):
        return _CallableList(super().variables)


class _CallableList(list):
    """A list that also answers a call with itself: ``opt.variables`` and, as in older Keras,
    ``opt.variables()``."""

    def __call__(self):
        return self


class _LocalAggregation:
    """Local gradient accumulation for ``backward_passes_per_step = N``.

    Each ``apply`` adds the gradients into accumulators (variables of the backend, created when
    the optimizer is built) and increments ``counter``. When ``counter`` reaches N the
    accumulated gradients, divided by N if ``average_aggregated_gradients``, are reduced across
    ranks and applied; then accumulators and counter are cleared. The other calls only increment
    the optimizer's ``iterations``, so it counts every call. Every rank makes the same calls, so
    all take the same branch; with the TensorFlow backend the branch is a ``tf.cond`` inside the
    traced training step.
    """

    def __init__(self, optimizer, variables):
        keras = optimizer._hvd_settings.keras
        self.optimizer = optimizer
        self.backward_passes_per_step = optimizer._hvd_settings.backward_passes_per_step
        self.counter = keras.Variable(0, dtype="int64", trainable=False,
                                      name="hvd_aggregation_counter")
        self.accumulators = {
            id(v): keras.Variable(keras.ops.zeros(v.shape, dtype=v.dtype), dtype=v.dtype,
                                  trainable=False, name="hvd_aggregated_gradient")
            for v in variables}

    def apply(self, grads, variables, trainable_variables):
        opt = self.optimizer
        settings = opt._hvd_settings
        keras = settings.keras
        backend = settings.backend
        present = [(g, v) for g, v in zip(grads, variables, strict=True) if g is not None]
        for g, v in present:
            self.accumulators[id(v)].assign_add(backend.dense(g))
        self.counter.assign_add(1)

        def update():
            scale = (1.0 / self.backward_passes_per_step
                     if settings.average_aggregated_gradients else 1.0)
            summed = [self.accumulators[id(v)].value * scale if g is not None else None
                      for g, v in zip(grads, variables, strict=True)]
            opt._hvd_apply_reduced(opt._allreduce(summed, variables), trainable_variables)
            for _, v in present:
                acc = self.accumulators[id(v)]
                acc.assign(keras.ops.zeros(acc.shape, dtype=acc.dtype))
            self.counter.assign(0)

        def skip():
            # The step variable itself: recent Keras keeps it in ``_iterations`` (``iterations`` is
            # a property, a tensor under Keras's own gradient accumulation); Keras 3.0 has only
            # the variable ``iterations``.
            step = opt._iterations if hasattr(opt, "_iterations") else opt.iterations
            step.assign_add(1)

        keras.ops.cond(self.counter.value >= self.backward_passes_per_step, update, skip)
