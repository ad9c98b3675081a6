"""Gradient compression: fewer bytes sent between ranks. The casts (``Compression.fp16``,
``Compression.bf16``) are applied around each allreduce (their framework-neutral part is
``horovod.common.compression``); the compressors with state (``PowerSGD``, ``TopK``, from
``horovod.torch.stateful_compression``) combine all the gradients of a step."""

import torch

from horovod.common import compression as _common
from horovod.common.compression import Compressor, NoneCompressor  # noqa: F401 (re-exported)


class _TorchCasts:
    _is_floating = staticmethod(lambda dtype: dtype.is_floating_point)
    _cast = staticmethod(lambda tensor, dtype: tensor.to(dtype))
    _other_ctx = staticmethod(lambda dtype: None)


class FP16Compressor(_TorchCasts, _common.FP16Compressor):
    """Sends floating-point tensors as float16, halving the bytes of float32 gradients.

    Values outside float16's range (about ±65504) overflow to inf, and precision drops to about
    three decimal digits. Non-floating-point tensors are sent unchanged, with ``ctx`` None.
    """

    _wire_dtype = torch.float16


class BF16Compressor(_TorchCasts, _common.BF16Compressor):
    """Sends floating-point tensors as bfloat16, halving the bytes of float32 gradients.

    Float32's exponent range is kept (no overflow), with about two to three decimal digits; the
    ranks' values are summed in float32 and rounded once to bfloat16 (round to nearest even;
    docs/compression.md). Non-floating-point tensors are sent unchanged, with ``ctx`` None.
    """

    _wire_dtype = torch.bfloat16


class Compression(_common.Compression):
    """The available compressors: ``Compression.none``, ``Compression.fp16`` and
    ``Compression.bf16``."""

    fp16 = FP16Compressor
    bf16 = BF16Compressor


# The compressors with state, built on the collectives of mpi_ops (which imports nothing of this
# module: no import circle).
from horovod.torch.stateful_compression import Cast, PowerSGD, StatefulCompressor, TopK  # noqa: E402,F401
