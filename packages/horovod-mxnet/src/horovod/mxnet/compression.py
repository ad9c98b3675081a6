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

    _wire_dtype = np.dtype(np.float16)
    _dtype = staticmethod(lambda tensor: np.dtype(tensor.dtype))
    _is_floating = staticmethod(lambda dtype: dtype.kind == 'f')
    _cast = staticmethod(lambda tensor, dtype: tensor if np.dtype(tensor.dtype) == dtype else tensor.astype(dtype))
    _restores = staticmethod(lambda ctx: True)


class BF16Compressor(_common.BF16Compressor):
    """bfloat16 is not available with MXNet 1.9: its NDArrays cannot be made bfloat16 next to
    numpy (``astype('bfloat16')`` fails), so ``compress`` raises ``ValueError`` saying so; use
    ``Compression.fp16`` to halve the bytes of float32 gradients."""

    @classmethod
    def compress(cls, tensor):
        """Raises ValueError: MXNet 1.9 has no usable bfloat16 NDArray."""
        raise ValueError("Compression.bf16 is not available with MXNet: MXNet 1.9's NDArrays have no "
                         "bfloat16 dtype usable with numpy; use Compression.fp16 or Compression.none.")


class Compression(_common.Compression):
    """The available compressors: ``Compression.none``, ``Compression.fp16`` and
    ``Compression.bf16`` (which raises ValueError with MXNet 1.9, which has no bfloat16)."""

    fp16 = FP16Compressor
    bf16 = BF16Compressor
