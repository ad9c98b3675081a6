"""Gradient compression applied around an allreduce to reduce the bytes sent between ranks.

The framework-neutral part: each framework package's ``compression`` module subclasses
``FP16Compressor`` and ``BF16Compressor`` with its dtypes and casts, and ``Compression`` with
those compressors.
"""


class Compressor:
    """Interface of a compressor: ``compress`` before the collective, ``decompress`` after."""

    @staticmethod
    def compress(tensor):
        """Compresses a tensor before the collective.

        Args:
            tensor: the framework's tensor (any shape and dtype).

        Returns:
            ``(compressed_tensor, ctx)``; ``ctx`` is what ``decompress`` needs.

        Raises:
            NotImplementedError: always; a compressor overrides it.
        """
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        """Restores a tensor after the collective.

        Args:
            tensor: the collective's result on the compressed tensor.
            ctx: what ``compress`` returned with it.

        Returns:
            The restored tensor.

        Raises:
            NotImplementedError: always; a compressor overrides it.
        """
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors unchanged."""

    @staticmethod
    def compress(tensor):
        """Returns ``(tensor, None)``."""
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        """Returns ``tensor`` unchanged.

        Args:
            tensor: the collective's result.
            ctx: ``None``, from ``compress``; unused.
        """
        return tensor


class CastCompressor(Compressor):
    """Sends floating-point tensors cast to a narrower floating-point dtype, ``_wire_dtype``, and
    casts the result back; other dtypes are sent unchanged. ``FP16Compressor`` and
    ``BF16Compressor`` are its two cases.

    A framework's subclass gives ``_wire_dtype`` and the static methods ``_is_floating(dtype)``
    and ``_cast(tensor, dtype)``, and may override ``_dtype(tensor)``, ``_other_ctx(dtype)`` (the
    ``ctx`` of a tensor sent unchanged) and ``_restores(ctx)`` (whether ``decompress`` casts to
    ``ctx``).
    """

    _wire_dtype = None

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
        """Returns ``(tensor cast to the wire dtype, original dtype)`` for a floating-point tensor,
        else ``(tensor, ctx)`` with the ``ctx`` the framework's subclass gives such tensors."""
        dtype = cls._dtype(tensor)
        if cls._is_floating(dtype):
            return cls._cast(tensor, cls._wire_dtype), dtype
        return tensor, cls._other_ctx(dtype)

    @classmethod
    def decompress(cls, tensor, ctx):
        """Casts ``tensor`` back to the dtype ``ctx`` of ``compress``; returns it unchanged when
        ``ctx`` is None."""
        if ctx is not None and cls._restores(ctx):
            return cls._cast(tensor, ctx)
        return tensor


class FP16Compressor(CastCompressor):
    """Sends floating-point tensors as float16, halving the bytes of float32 gradients.

    Values outside float16's range (about ±65504) overflow to inf, and precision drops to about
    three decimal digits. Other dtypes are sent unchanged.
    """


class BF16Compressor(CastCompressor):
    """Sends floating-point tensors as bfloat16, halving the bytes of float32 gradients.

    bfloat16 keeps float32's exponent range (no overflow where float32 has none) with an 8-bit
    significand: about two to three decimal digits, less precise than float16 within its range.
    The sum of the ranks' values is accumulated in float32 and rounded to bfloat16 (round to
    nearest even) by the core. Other dtypes are sent unchanged.
    """


class Compression:
    """The available compressors: ``Compression.none``, ``Compression.fp16`` and
    ``Compression.bf16``. A framework's subclass sets ``fp16`` and ``bf16`` to its compressors."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
