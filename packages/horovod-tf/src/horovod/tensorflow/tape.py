"""Gradient tapes whose ``gradient`` reduces the gradients across ranks."""

import tensorflow as tf

from horovod.common.compression import NoneCompressor
from horovod.tensorflow.mpi_ops import Average, global_process_set
from horovod.tensorflow.optimizer import _check_options, _make_allreduce_grads_fn, _reduce_with_locals
from horovod.tensorflow.util import _no_autograph, _ref


class _DistributedTapeMixin:
    """Methods added to the dynamic subclass of the user's tape class."""

    def register_local_source(self, source):
        """Keeps ``source``'s gradient local: it is never reduced (only divided by the set size when
        ``scale_local_gradients``)."""
        self._hvd_local_sources.add(_ref(source))

    def _hvd_gradients(self, target, sources, output_gradients, use_generic_names):
        flat = tf.nest.flatten(sources)
        grads = self._hvd_base.gradient(self, target, sources, output_gradients)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        reduced = _reduce_with_locals(self._hvd_allreduce_grads, flat_grads, flat, self._hvd_local_sources,
                                      self._hvd_process_set, self._hvd_scale_local_gradients, use_generic_names)
        return flat, reduced

    @_no_autograph
    def gradient(self, target, sources, output_gradients=None, use_generic_names=False):
        """The base tape's gradient, then every non-local gradient reduced across ranks (one
        engine submission per group). Returns the gradients in the structure of ``sources``; None
        gradients stay None.

        Raises:
            tf.errors.FailedPreconditionError: ranks disagree on the gradients' shapes or dtypes.
        """
        _, reduced = self._hvd_gradients(target, sources, output_gradients, use_generic_names)
        return tf.nest.pack_sequence_as(sources, reduced)

    @_no_autograph
    def get_local_and_global_gradients(self, target, sources, output_gradients=None, use_generic_names=False):
        """Returns ``(local, global)``: lists of ``(source, gradient)`` for the registered local
        sources and for the others (reduced)."""
        flat, reduced = self._hvd_gradients(target, sources, output_gradients, use_generic_names)
        local = [(s, g) for s, g in zip(flat, reduced, strict=True) if _ref(s) in self._hvd_local_sources]
        glob = [(s, g) for s, g in zip(flat, reduced, strict=True) if _ref(s) not in self._hvd_local_sources]
        return local, glob


def _distributed_tape(gradtape, device_dense, device_sparse, compression, sparse_as_dense, op,
                      gradient_predivide_factor, num_groups, groups, process_set, scale_local_gradients):
    if not isinstance(gradtape, tf.GradientTape):
        raise ValueError(f'DistributedGradientTape expects a tf.GradientTape, got {type(gradtape).__name__}.')
    groups = _check_options(op, gradient_predivide_factor, num_groups, groups)
    base = gradtape.__class__
    cls = type(base.__name__, (_DistributedTapeMixin, base), {'__module__': base.__module__})
    tape = cls.__new__(cls)
    # The same recorded tape, persistence and watch_accessed_variables as the user's tape.
    tape.__dict__.update(gradtape.__dict__)
    tape._hvd_base = base
    tape._hvd_local_sources = set()
    tape._hvd_process_set = process_set
    tape._hvd_scale_local_gradients = scale_local_gradients
    tape._hvd_allreduce_grads = _make_allreduce_grads_fn('DistributedGradientTape', device_dense, device_sparse,
                                                         compression, sparse_as_dense, op,
                                                         gradient_predivide_factor, groups, process_set)
    return tape


def DistributedGradientTape(gradtape, device_dense='', device_sparse='', compression=NoneCompressor,
                            sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0,
                            groups=None, process_set=global_process_set, scale_local_gradients=True):
    """A tape whose ``gradient`` averages (or sums) the gradients across ranks.

    Wrap a ``tf.GradientTape`` after recording: ``tape = hvd.DistributedGradientTape(tape)``. The
    result is an instance of a subclass of the tape's own class sharing its recording.

    Args:
        gradtape: the ``tf.GradientTape``.
        device_dense, device_sparse: accepted for compatibility; every op runs on the CPU.
        compression: ``Compression.none``, ``.fp16`` or ``.bf16`` (a cast around each allreduce),
            or a compressor with state: ``hvd.PowerSGD``, ``hvd.TopK`` or
            ``hvd.compression.Cast`` (eagerly only; ``horovod.tensorflow.stateful_compression``).
        sparse_as_dense: densify ``tf.IndexedSlices`` gradients (else they are allgathered).
        op: ``hvd.Average`` (default), ``hvd.Sum`` (or Min/Max/Product).
        gradient_predivide_factor: with Average, divide by this before the sum and multiply after.
        num_groups: deprecated form of ``groups``.
        groups: None (all gradients in one submission), an int k, or lists of variables.
        process_set: the ``ProcessSet`` to reduce over.
        scale_local_gradients: divide the gradients of local sources by the set size.

    Raises:
        ValueError: not a tape, gradient_predivide_factor != 1 without Average, bad groups.
    """
    return _distributed_tape(gradtape, device_dense, device_sparse, compression, sparse_as_dense, op,
                             gradient_predivide_factor, num_groups, groups, process_set, scale_local_gradients)


def PartialDistributedGradientTape(gradtape, device_dense='', device_sparse='', compression=NoneCompressor,
                                   sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0,
                                   groups=None, process_set=global_process_set, local_layers=None,
                                   scale_local_gradients=True):
    """``DistributedGradientTape`` whose ``local_layers`` (a Keras layer or a list of them) keep
    local gradients: every trainable weight of those layers is registered as a local source.

    The arguments ``gradtape``, ``device_dense``, ``device_sparse``, ``compression``,
    ``sparse_as_dense``, ``op``, ``gradient_predivide_factor``, ``num_groups``, ``groups`` and
    ``process_set`` are those of :func:`DistributedGradientTape`.

    Args:
        local_layers: a Keras layer or a list of them whose gradients are not reduced.
        scale_local_gradients (bool): divide the local gradients by the set's size, as the
            reduced ones are averaged (as for :func:`DistributedGradientTape`).

    Raises:
        ValueError: an entry of ``local_layers`` is not a Keras layer; as DistributedGradientTape.
    """
    import keras
    tape = _distributed_tape(gradtape, device_dense, device_sparse, compression, sparse_as_dense, op,
                             gradient_predivide_factor, num_groups, groups, process_set, scale_local_gradients)
    if local_layers is None:
        local_layers = []
    elif not isinstance(local_layers, (list, tuple)):
        local_layers = [local_layers]
    for layer in local_layers:
        if not isinstance(layer, keras.layers.Layer):
            raise ValueError(f'local_layers must be Keras layers, got {type(layer).__name__}.')
        for weight in layer.trainable_weights:
            tape.register_local_source(weight)
    return tape

