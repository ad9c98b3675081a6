"""The compressors with state (PowerSGD, top-k, the casts in the same interface) for TensorFlow
tensors: the classes are ``horovod.common.stateful_compression``'s, which describes them; this
module registers TensorFlow's tensor operations and horovod.tensorflow's collectives for them.

They keep their state (steps, residuals, factors) in Python, so they run eagerly only:
``hvd.DistributedGradientTape(tape, compression=hvd.PowerSGD(rank=4))`` outside ``tf.function``,
or a Keras optimizer wrapped by ``hvd.DistributedOptimizer`` in a model compiled with
``run_eagerly=True``. Inside a graph ``reduce`` raises ValueError. ``state_dict`` holds eager
tensors (to save it with a checkpoint, convert them, e.g. ``v.numpy()``); ``load_state_dict`` takes
tensors (``tf.constant`` of the saved arrays).
"""

import numpy as np
import tensorflow as tf

from horovod.common import stateful_compression as _common
from horovod.common.stateful_compression import Cast, PowerSGD, StatefulCompressor, TopK  # noqa: F401 (exported)
from horovod.tensorflow.mpi_ops import grouped_allgather
from horovod.tensorflow.reduction import grouped_allreduce


def _require_eager(what):
    if not tf.executing_eagerly():
        raise ValueError(f"{what} keeps its state in Python and runs eagerly only: reduce the gradients outside "
                         "tf.function (Keras: model.compile(..., run_eagerly=True)).")


def _zero_at(flat, indices):
    indices = tf.reshape(tf.cast(indices, tf.int64), (-1, 1))
    return tf.tensor_scatter_nd_update(flat, indices, tf.zeros(tf.shape(indices)[:1], flat.dtype))


def _scatter_add(size, indices, values, dtype):
    indices = tf.reshape(tf.cast(indices, tf.int64), (-1, 1))
    return tf.scatter_nd(indices, tf.cast(values, dtype), tf.constant([size], tf.int64))


class _TensorFlowOps(_common.TensorOps):
    """TensorFlow's operations for the compressors (see ``horovod.common.stateful_compression``):
    eager CPU tensors."""

    grouped_allreduce = staticmethod(grouped_allreduce)
    grouped_allgather = staticmethod(grouped_allgather)
    require_eager = staticmethod(_require_eager)
    is_floating = staticmethod(lambda tensor: tensor.dtype.is_floating)
    dtype = staticmethod(lambda tensor: tensor.dtype)
    shape = staticmethod(lambda tensor: tuple(tensor.shape.as_list()))
    reshape = staticmethod(tf.reshape)
    cast = staticmethod(tf.cast)
    factor_dtype = staticmethod(lambda dtype: tf.float64 if dtype == tf.float64 else tf.float32)
    transpose = staticmethod(tf.transpose)
    orthonormal = staticmethod(lambda matrix: tf.linalg.qr(matrix)[0])
    top_k_abs = staticmethod(lambda flat, k: tf.math.top_k(tf.abs(flat), k, sorted=False).indices)
    take = staticmethod(tf.gather)
    int32 = staticmethod(lambda indices: tf.cast(indices, tf.int32))
    zero_at = staticmethod(_zero_at)
    scatter_add = staticmethod(_scatter_add)
    # Eager tensors are immutable: a copy is the tensor itself (the base class's).

    @staticmethod
    def gaussian(rows, columns, seed, like):
        return tf.constant(np.random.default_rng(seed).standard_normal((rows, columns)), dtype=like.dtype)


_common.register((tf.Tensor, tf.Variable), _TensorFlowOps)
