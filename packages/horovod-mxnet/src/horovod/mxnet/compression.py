"""Gradient compression applied around an allreduce to reduce the bytes sent between ranks (the
framework-neutral part is ``horovod.common.compression``)."""

import numpy as np

from horovod.common import compression as _common
from horovod.common.compression import Compressor, NoneCompressor  # noqa: F401 (re-exported)


class FP16Compressor(_common.FP16Compressor):
    """Sends floating-point NDArrays as float16, halving the bytes of float32 gradients.

    Values beyond float16's range (about ±65504) become inf, and precision drops to about three
    decimal digits. Other dtypes are sent unchanged. ``compress`` returns a float16 copy (the array
    itself when it already is float16) and the array's dtype as ``ctx``; ``decompress`` casts back
    to ``ctx`` (no copy when the array already has it).
    """

    _float16 = np.dtype(np.float16)
    _dtype = staticmethod(lambda tensor: np.dtype(tensor.dtype))
    _is_floating = staticmethod(lambda dtype: dtype.kind == 'f')
    _cast = staticmethod(lambda tensor, dtype: tensor if np.dtype(tensor.dtype) == dtype else tensor.astype(dtype))
    _restores = staticmethod(lambda ctx: True)


class Compression(_common.Compression):
    """The available compressors: ``Compression.none`` and ``Compression.fp16``."""

    fp16 = FP16Compressor
