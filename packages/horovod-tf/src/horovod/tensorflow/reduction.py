"""The public reductions: allreduce and reducescatter with compression, the deprecated ``average``
argument, and ``tf.IndexedSlices`` (sparse gradients of embedding lookups and gathers)."""

import tensorflow as tf

from horovod.tensorflow.util import _no_autograph

from horovod.common.compression import NoneCompressor
from horovod.tensorflow.mpi_ops import (
    Adasum,
    Average,
    Sum,
    _grouped_allreduce,
    _grouped_reducescatter,
    _reducescatter,
    _set_size_value,
    allgather,
    global_process_set,
    handle_average_backwards_compatibility,
)
from horovod.tensorflow.mpi_ops import _allreduce as _raw_allreduce


def _check_sparse_op(op, prescale_factor, postscale_factor):
    if op == Adasum:
        raise NotImplementedError('allreduce of tf.IndexedSlices does not support op=hvd.Adasum; '
                                  'pass sparse_as_dense=True to reduce the gradients as dense tensors.')
    if op not in (Average, Sum):
        raise NotImplementedError(f'allreduce of tf.IndexedSlices supports op=hvd.Average and hvd.Sum only, '
                                  f'got {op!r}: the slices are combined by concatenation.')
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise NotImplementedError('allreduce of tf.IndexedSlices does not support prescale_factor or '
                                  'postscale_factor; scale the values yourself.')


def _scale(values, factor):
    """``values * factor`` with the engine's arithmetic for a scale factor (core.md §6.2), so
    that an average computed here equals the engine's dense one: integers in float64, truncated
    toward zero and cast back; float16 and bfloat16 in float32, rounded back; float32 and float64 with
    the factor cast to their own precision. ``factor`` is a float64 scalar tensor."""
    dtype = values.dtype
    if dtype.is_integer:
        return tf.cast(tf.cast(values, tf.float64) * factor, dtype)
    if dtype in (tf.float16, tf.bfloat16):
        return tf.cast(tf.cast(values, tf.float32) * tf.cast(factor, tf.float32), dtype)
    return values * tf.cast(factor, dtype)


def _sparse_allreduce(slices, op, name, process_set, ignore_name_scope):
    """Every rank's slices concatenated in rank order. Average scales them by 1 / set size (the
    size read when the op runs) so that the result, densified, is the dense average of the
    densified inputs with the dense path's dtype and arithmetic (``_scale``). Floating values
    are scaled slice by slice (duplicate indices still add up when densified); integer values
    are first summed per index (``tf.unique`` order: first occurrence), since truncating each
    slice before adding them would not give the truncated average."""
    values_name = None if name is None else f'{name}.values'
    indices_name = None if name is None else f'{name}.indices'
    values = allgather(slices.values, name=values_name, ignore_name_scope=ignore_name_scope,
                       process_set=process_set)
    indices = allgather(slices.indices, name=indices_name, ignore_name_scope=ignore_name_scope,
                        process_set=process_set)
    if op == Average:
        if values.dtype.is_integer:
            indices, position = tf.unique(indices)
            values = tf.math.unsorted_segment_sum(values, position, tf.shape(indices)[0])
        factor = 1.0 / tf.cast(_set_size_value(process_set), tf.float64)
        values = _scale(values, factor)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


@_no_autograph
def allreduce(tensor, average=None, device_dense='', device_sparse='', compression=NoneCompressor, op=None,
              prescale_factor=1.0, postscale_factor=1.0, name=None, process_set=global_process_set,
              ignore_name_scope=False):
    """Reduces ``tensor`` over the ranks of ``process_set``; differentiable.

    Args:
        tensor: a dense tensor (uint8, int8, int32, int64, float16, bfloat16, float32, float64; any shape)
            or a ``tf.IndexedSlices``.
        average: deprecated; True means ``op=Average``, False ``op=Sum``.
        device_dense, device_sparse: accepted for compatibility; every op runs on the CPU.
        compression: ``Compression.none`` or ``Compression.fp16`` (dense tensors only).
        op: ``Average`` (default), ``Sum``, ``Min``, ``Max``, ``Product`` or ``Adasum`` (float
            tensors, the global set, a power-of-2 number of ranks; Maleki et al., "Scaling
            Distributed Training with Adaptive Summation", MLSys 2021).
        prescale_factor, postscale_factor: factors applied before and after the reduction.
        name, ignore_name_scope: the engine name (see ``horovod.tensorflow.mpi_ops``).
        process_set: the ``ProcessSet`` to reduce over.

    Returns:
        Dense input: a tensor of its shape and dtype, ``postscale * REDUCE(prescale * tensor)``.
        IndexedSlices: an IndexedSlices with every rank's values and indices concatenated in rank
        order and the input's ``dense_shape``; for Average, densified, it equals the dense
        average of the densified inputs, in the values' dtype (integers truncated toward zero,
        as the dense path does; their duplicate indices are first summed into one slice each).

    Raises:
        ValueError: ``op`` and ``average`` both given, unknown op, bad dtype, unregistered set.
        NotImplementedError: IndexedSlices with Adasum, an op other than Average/Sum, or scale
            factors other than 1; Adasum on a process set other than the global one, or on a
            number of ranks that is not a power of 2.
        tf.errors.FailedPreconditionError: ranks disagree on shape, dtype or op.
    """
    op = handle_average_backwards_compatibility(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        _check_sparse_op(op, prescale_factor, postscale_factor)
        return _sparse_allreduce(tensor, op, name, process_set, ignore_name_scope)
    compressed, ctx = compression.compress(tf.convert_to_tensor(tensor))
    reduced = _raw_allreduce(compressed, name=name, op=op, prescale_factor=prescale_factor,
                             postscale_factor=postscale_factor, ignore_name_scope=ignore_name_scope,
                             process_set=process_set)
    return compression.decompress(reduced, ctx)


@_no_autograph
def grouped_allreduce(tensors, average=None, device_dense='', device_sparse='', compression=NoneCompressor,
                      op=None, prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set,
                      ignore_name_scope=False, name=None):
    """Reduces a list of tensors; the dense ones go to the engine as one group (fused), the
    ``tf.IndexedSlices`` ones each through the allgather path of :func:`allreduce`.

    The arguments ``average``, ``device_dense``, ``device_sparse``, ``compression``, ``op``,
    ``prescale_factor``, ``postscale_factor``, ``process_set`` and ``ignore_name_scope`` are those
    of :func:`allreduce`, applied to every entry.

    Args:
        tensors: a list or tuple of tensors or ``tf.IndexedSlices``, each as ``allreduce`` takes
            it (dtypes and shapes may differ between the entries).
        name: the group's engine name; entry ``i`` that is an IndexedSlices is named
            ``{name}.{i}``. None: automatic names.

    Returns:
        A list of the results in input order, each as :func:`allreduce` returns it; [] for [].

    Raises:
        ValueError: ``tensors`` is not a list or tuple, or as for :func:`allreduce`.
        NotImplementedError: as for :func:`allreduce`.
    """
    op = handle_average_backwards_compatibility(op, average)
    if not isinstance(tensors, (list, tuple)):
        raise ValueError(f'grouped_allreduce expects a list of tensors, got {type(tensors).__name__}.')
    if not tensors:
        return []
    results = [None] * len(tensors)
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices):
            _check_sparse_op(op, prescale_factor, postscale_factor)
            results[i] = _sparse_allreduce(t, op, None if name is None else f'{name}.{i}', process_set,
                                           ignore_name_scope)
    if dense:
        compressed = [compression.compress(tf.convert_to_tensor(tensors[i])) for i in dense]
        reduced = _grouped_allreduce([c for c, _ in compressed], name=name, op=op, prescale_factor=prescale_factor,
                                     postscale_factor=postscale_factor, ignore_name_scope=ignore_name_scope,
                                     process_set=process_set)
        for i, r, (_, ctx) in zip(dense, reduced, compressed, strict=True):
            results[i] = compression.decompress(r, ctx)
    return results


@_no_autograph
def reducescatter(tensor, device_dense='', compression=NoneCompressor, op=Average, name=None,
                  process_set=global_process_set, ignore_name_scope=False, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduces ``tensor`` over the set and returns this rank's block of rows: member ``r`` gets
    ``dim0 // n + (r < dim0 % n)`` rows of the reduction. Differentiable.

    Args:
        tensor: a dense tensor whose rows are split over the ranks (int32, int64, float16, bfloat16,
            float32, float64); every rank passes the same shape and dtype.
        device_dense: accepted for compatibility; the op runs on the CPU.
        compression: ``Compression.none`` or ``Compression.fp16``.
        op: ``Average`` (default) or ``Sum``.
        name, ignore_name_scope: the engine name (see ``horovod.tensorflow.mpi_ops``).
        process_set: the ``ProcessSet`` to reduce over.
        prescale_factor, postscale_factor: factors applied before and after the reduction.

    Returns:
        A tensor of the input's dtype and shape but for dimension 0, this rank's rows.

    Raises:
        ValueError: another ``op``, or an unsupported dtype.
        tf.errors.FailedPreconditionError: ranks disagree on shape or dtype.
    """
    compressed, ctx = compression.compress(tf.convert_to_tensor(tensor))
    reduced = _reducescatter(compressed, name=name, op=op, ignore_name_scope=ignore_name_scope,
                             process_set=process_set, prescale_factor=prescale_factor,
                             postscale_factor=postscale_factor)
    return compression.decompress(reduced, ctx)


@_no_autograph
def grouped_reducescatter(tensors, device_dense='', compression=NoneCompressor, op=Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """:func:`reducescatter` of a list of tensors, submitted to the engine as one group.

    Args:
        tensors: a list of dense tensors, each as :func:`reducescatter` takes it.
        device_dense, compression, op, process_set, prescale_factor, postscale_factor: as for
            :func:`reducescatter`, applied to every tensor.

    Returns:
        A list of this rank's blocks, in input order.

    Raises:
        ValueError, tf.errors.FailedPreconditionError: as for :func:`reducescatter`.
    """
    compressed = [compression.compress(tf.convert_to_tensor(t)) for t in tensors]
    reduced = _grouped_reducescatter([c for c, _ in compressed], op=op, process_set=process_set,
                                     prescale_factor=prescale_factor, postscale_factor=postscale_factor)
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, compressed, strict=True)]
