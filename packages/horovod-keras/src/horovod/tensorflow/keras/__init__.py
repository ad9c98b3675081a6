"""Horovod for ``tf.keras``: ``import horovod.tensorflow.keras as hvd``.

Since TensorFlow 2.16 ``tf.keras`` is Keras 3, so this module is ``horovod.keras`` on the Keras
backend 'tensorflow' with ``horovod.tensorflow``'s signatures: it adds ``ProcessSet``,
``add_process_set`` and ``remove_process_set``, and :func:`allreduce` defaults to
``average=None`` (Average). Importing it with another Keras backend raises ``ImportError``.
"""

import tensorflow as tf

if not hasattr(tf.keras, 'backend') or not hasattr(tf.keras.optimizers, 'Optimizer'):
    raise ImportError('horovod.tensorflow.keras needs tf.keras to be Keras 3 (TensorFlow 2.16+ '
                      'with the keras package); this TensorFlow has none.')
if tf.keras.backend.backend() != 'tensorflow':
    raise ImportError("horovod.tensorflow.keras needs Keras on the 'tensorflow' backend, but "
                      f"KERAS_BACKEND selects {tf.keras.backend.backend()!r}; use horovod.keras "
                      "for other backends.")

import horovod._keras as _impl  # noqa: E402
import horovod.keras as _hvd_keras  # noqa: E402
from horovod.keras import (  # noqa: E402,F401  (re-exported)
    Average,
    Compression,
    PowerSGD,
    Sum,
    TopK,
    broadcast,
    broadcast_global_variables,
    broadcast_variables,
    callbacks,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    elastic,
    global_process_set,
    gloo_built,
    gloo_enabled,
    init,
    is_initialized,
    load_model,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    reducescatter,
    allgather,
    rocm_built,
    shutdown,
    size,
    dump_flight_recorder,
    start_timeline,
    stop_timeline,
)
from horovod.tensorflow import ProcessSet, add_process_set, remove_process_set  # noqa: E402,F401


def DistributedOptimizer(optimizer, name=None, device_dense='', device_sparse='',
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """A copy of the ``tf.keras`` optimizer ``optimizer`` that applies gradients reduced over the
    ranks. The arguments are those of :func:`horovod.keras.DistributedOptimizer`: ``optimizer``
    (a ``tf.keras`` optimizer), ``name``, ``device_dense``, ``device_sparse``, ``compression``,
    ``sparse_as_dense``, ``gradient_predivide_factor``, ``op``, ``backward_passes_per_step``,
    ``average_aggregated_gradients``, ``num_groups``, ``groups``, ``process_set`` and
    ``scale_local_gradients``.

    Raises:
        ValueError: as ``horovod.keras.DistributedOptimizer``.
    """
    return _impl.create_distributed_optimizer(
        tf.keras, optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
        gradient_predivide_factor, op, backward_passes_per_step, average_aggregated_gradients,
        groups, process_set, scale_local_gradients, backend=_hvd_keras._backend,
        num_groups=num_groups)


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0, op=None,
              compression=Compression.none):
    """Reduces ``value`` over all ranks and returns a ``tf.Tensor`` of the same shape; ``op``
    (default Average) or the deprecated ``average`` (True: Average, False: Sum) chooses the
    reduction.

    Args:
        value: a number, numpy array or tensor (int32, int64 or float; any shape).
        name (str): the engine name, the same on every rank; None for an automatic one.
        average (bool): deprecated; True for Average, False for Sum.
        prescale_factor, postscale_factor (float): factors applied before and after the reduction.
        op: ``hvd.Average`` (default), ``hvd.Sum``, ...
        compression: ``hvd.Compression.none``, ``hvd.Compression.fp16`` or
            ``hvd.Compression.bf16`` (sent as float16 or bfloat16).

    Raises:
        ValueError: both ``op`` and ``average`` given.
    """
    if op is not None and average is not None:
        raise ValueError('The op parameter supersedes average. Please provide only one of them.')
    if op is None:
        op = Sum if average is False else Average
    return _impl.allreduce(tf.keras, _hvd_keras._backend, value, name, op, prescale_factor,
                           postscale_factor, compression)
