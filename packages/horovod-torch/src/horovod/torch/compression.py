"""Gradient compression applied around an allreduce to reduce the bytes sent between ranks."""

import torch


class Compressor:
    """Interface of a compressor: ``compress`` before the collective, ``decompress`` after."""

    @staticmethod
    def compress(tensor):
        """Returns ``(compressed_tensor, ctx)``; ``ctx`` is what ``decompress`` needs."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        """Returns the tensor restored from ``tensor`` and the ``ctx`` of ``compress``."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors unchanged."""

    @staticmethod
    def compress(tensor):
        """Returns ``(tensor, None)``."""
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        """Returns ``tensor``."""
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16, halving the bytes of float32 gradients.

    Values outside float16's range (about ±65504) overflow to inf, and precision drops to about
    three decimal digits. Non-floating-point tensors are sent unchanged.
    """

    @staticmethod
    def compress(tensor):
        """Returns ``(tensor cast to float16, original dtype)`` for a floating-point tensor,
        else ``(tensor, None)``."""
        if tensor.dtype.is_floating_point:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        """Casts ``tensor`` back to the floating-point dtype ``ctx``; returns it unchanged when
        ``ctx`` is None."""
        if ctx is not None and ctx.is_floating_point:
            return tensor.to(ctx)
        return tensor


class Compression:
    """The available compressors: ``Compression.none`` and ``Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
