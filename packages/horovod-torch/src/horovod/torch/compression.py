"""Gradient compression applied around an allreduce to reduce the bytes sent between ranks (the
framework-neutral part is ``horovod.common.compression``)."""

import torch

from horovod.common import compression as _common
from horovod.common.compression import Compressor, NoneCompressor  # noqa: F401 (re-exported)


class FP16Compressor(_common.FP16Compressor):
    """Sends floating-point tensors as float16, halving the bytes of float32 gradients.

    Values outside float16's range (about ±65504) overflow to inf, and precision drops to about
    three decimal digits. Non-floating-point tensors are sent unchanged, with ``ctx`` None.
    """

    _float16 = torch.float16
    _is_floating = staticmethod(lambda dtype: dtype.is_floating_point)
    _cast = staticmethod(lambda tensor, dtype: tensor.to(dtype))
    _other_ctx = staticmethod(lambda dtype: None)


class Compression(_common.Compression):
    """The available compressors: ``Compression.none`` and ``Compression.fp16``."""

    fp16 = FP16Compressor
