"""Batch normalisation whose batch statistics are computed over every rank's batch."""

import tensorflow as tf

from horovod.tensorflow.mpi_ops import Sum, _allreduce, size
from horovod.tensorflow.util import _no_autograph

_BatchNormalization = tf.keras.layers.BatchNormalization


class SyncBatchNormalization(_BatchNormalization):
    """``tf.keras.layers.BatchNormalization`` whose training-time mean and variance are those of
    the union of the ranks' batches (every rank must use the same batch size).

    Each rank computes its moments, the ranks sum ``[mean, variance + mean²]`` (one allreduce per
    call, differentiable), divide by ``size()``, and take variance = E[x²] − mean². With one rank
    it is plain batch normalisation. Inference uses the moving statistics, identical on every rank
    when the ranks train in step.

    Args:
        fused: must be False (the fused kernel computes moments internally, out of reach).
        **kwargs: as for ``BatchNormalization``. Without ``name``, Keras names the layer after its
            class: 'sync_batch_normalization', then 'sync_batch_normalization_1', ...

    Raises:
        ValueError: ``fused`` is True or None.
    """

    def __init__(self, fused=False, **kwargs):
        if fused in (True, None):
            raise ValueError('SyncBatchNormalization does not support fused=True or fused=None; pass fused=False.')
        super().__init__(**kwargs)

    @_no_autograph
    def _moments(self, inputs, mask):
        mean, variance = super()._moments(inputs, mask)
        n = size()
        if n > 1:
            stacked = tf.stack([mean, variance + tf.square(mean)])
            total = _allreduce(stacked, op=Sum) / tf.cast(n, stacked.dtype)
            mean = total[0]
            variance = total[1] - tf.square(mean)
        return mean, variance
