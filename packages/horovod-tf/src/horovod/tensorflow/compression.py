"""Gradient compression for the allreduce: a compressor turns a tensor into what travels between
the ranks and back (the framework-neutral part is ``horovod.common.compression``)."""

import tensorflow as tf

from horovod.common import compression as _common
from horovod.common.compression import Compressor, NoneCompressor  # noqa: F401 (re-exported)


class FP16Compressor(_common.FP16Compressor):
    """Sends floating-point tensors as float16 (half the bytes; values beyond ±65504 overflow and
    precision drops to about 3 decimal digits); other dtypes unchanged. ``ctx`` is the original
    dtype, restored by ``decompress``."""

    _float16 = tf.float16
    _is_floating = staticmethod(lambda dtype: dtype.is_floating)
    _cast = staticmethod(tf.cast)


class Compression(_common.Compression):
    """The built-in compressors: ``Compression.none`` and ``Compression.fp16``."""

    fp16 = FP16Compressor
