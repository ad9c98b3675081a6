"""Gradient compression applied around an allreduce to reduce the bytes sent between ranks.

The framework-neutral part: each framework package's ``compression`` module subclasses
``FP16Compressor`` with its dtype tests and casts, and ``Compression`` with that compressor.
"""


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
    three decimal digits. Other dtypes are sent unchanged.

    A framework's subclass gives ``_float16`` (its float16 dtype) and the static methods
    ``_is_floating(dtype)`` and ``_cast(tensor, dtype)``, and may override ``_dtype(tensor)``,
    ``_other_ctx(dtype)`` (the ``ctx`` of a tensor sent unchanged) and ``_restores(ctx)`` (whether
    ``decompress`` casts to ``ctx``).
    """

    _float16 = None

    @staticmethod
    def _dtype(tensor):
        return tensor.dtype

    @staticmethod
    def _is_floating(dtype):
        raise NotImplementedError

    @staticmethod
    def _cast(tensor, dtype):
        raise NotImplementedError

    @staticmethod
    def _other_ctx(dtype):
        return dtype

    @classmethod
    def _restores(cls, ctx):
        return cls._is_floating(ctx)

    @classmethod
    def compress(cls, tensor):
        """Returns ``(tensor cast to float16, original dtype)`` for a floating-point tensor, else
        ``(tensor, ctx)`` with the ``ctx`` the framework's subclass gives such tensors."""
        dtype = cls._dtype(tensor)
        if cls._is_floating(dtype):
            return cls._cast(tensor, cls._float16), dtype
        return tensor, cls._other_ctx(dtype)

    @classmethod
    def decompress(cls, tensor, ctx):
        """Casts ``tensor`` back to the dtype ``ctx`` of ``compress``; returns it unchanged when
        ``ctx`` is None."""
        if ctx is not None and cls._restores(ctx):
            return cls._cast(tensor, ctx)
        return tensor


class Compression:
    """The available compressors: ``Compression.none`` and ``Compression.fp16``. A framework's
    subclass sets ``fp16`` to its ``FP16Compressor``."""

    none = NoneCompressor
    fp16 = FP16Compressor
