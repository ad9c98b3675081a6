"""Gradient compression: fewer bytes sent between ranks. The casts (``Compression.fp16``,
``Compression.bf16``) turn each tensor into what travels between the ranks and back (their
framework-neutral part is ``horovod.common.compression``); the compressors with state
(``PowerSGD``, ``TopK``, ``Cast``, from ``horovod.tensorflow.stateful_compression``) combine all
the gradients of a step, eagerly."""

import tensorflow as tf

from horovod.common import compression as _common
from horovod.common.compression import Compressor, NoneCompressor  # noqa: F401 (re-exported)


class _TensorFlowCasts:
    _is_floating = staticmethod(lambda dtype: dtype.is_floating)
    _cast = staticmethod(tf.cast)


class FP16Compressor(_TensorFlowCasts, _common.FP16Compressor):
    """Sends floating-point tensors as float16 (half the bytes; values beyond ±65504 overflow and
    precision drops to about 3 decimal digits); other dtypes unchanged. ``ctx`` is the original
    dtype, restored by ``decompress``."""

    _wire_dtype = tf.float16


class BF16Compressor(_TensorFlowCasts, _common.BF16Compressor):
    """Sends floating-point tensors as bfloat16 (half the bytes of float32, float32's range, about
    2 to 3 decimal digits; summed in float32 and rounded to nearest even by the core); other
    dtypes unchanged. ``ctx`` is the original dtype, restored by ``decompress``."""

    _wire_dtype = tf.bfloat16


class Compression(_common.Compression):
    """The built-in compressors: ``Compression.none``, ``Compression.fp16`` and
    ``Compression.bf16``."""

    fp16 = FP16Compressor
    bf16 = BF16Compressor


# The compressors with state, built on the collectives of mpi_ops and reduction (which import
# nothing of this module: no import circle).
from horovod.tensorflow.stateful_compression import Cast, PowerSGD, StatefulCompressor, TopK  # noqa: E402,F401
