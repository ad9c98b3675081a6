"""Gradient compression applied around an allreduce to reduce the bytes sent between ranks."""

import numpy as np


class Compressor:
    """Interface of a compressor: ``compress`` before the collective, ``decompress`` after."""

    @staticmethod
    def compress(tensor):
        """Returns ``(compressed NDArray, ctx)``; ``ctx`` is what ``decompress`` needs."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        """Returns the NDArray restored from ``tensor`` and the ``ctx`` of ``compress``."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends arrays unchanged."""

    @staticmethod
    def compress(tensor):
        """Returns ``(tensor, None)``."""
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        """Returns ``tensor``."""
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point NDArrays as float16, halving the bytes of float32 gradients.

    Values beyond float16's range (about ±65504) become inf, and precision drops to about three
    decimal digits. Other dtypes are sent unchanged.
    """

    @staticmethod
    def compress(tensor):
        """Returns ``(a float16 copy of tensor, its dtype)`` for a floating-point NDArray (the
        array itself when it already is float16), else ``(tensor, its dtype)``."""
        dtype = np.dtype(tensor.dtype)
        if dtype.kind == 'f' and dtype != np.float16:
            return tensor.astype(np.float16), dtype
        return tensor, dtype

    @staticmethod
    def decompress(tensor, ctx):
        """Casts ``tensor`` back to the dtype ``ctx`` (no copy when it already has it)."""
        if ctx is not None and np.dtype(tensor.dtype) != ctx:
            return tensor.astype(ctx)
        return tensor


class Compression:
    """The available compressors: ``Compression.none`` and ``Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
