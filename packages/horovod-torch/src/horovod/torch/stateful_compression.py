"""The compressors with state (PowerSGD, top-k, the casts in the same interface) for PyTorch
tensors: the classes are ``horovod.common.stateful_compression``'s, which describes them; this
module registers PyTorch's tensor operations and horovod.torch's collectives for them.

``hvd.DistributedOptimizer(..., compression=hvd.PowerSGD(rank=4))`` uses one; so can a training
loop directly, through ``reduce``.
"""

import torch

from horovod.common import stateful_compression as _common
from horovod.common.stateful_compression import Cast, PowerSGD, StatefulCompressor, TopK  # noqa: F401 (exported)
from horovod.torch import mpi_ops


class _TorchOps(_common.TensorOps):
    """PyTorch's operations for the compressors (see ``horovod.common.stateful_compression``):
    CPU tensors, or GPU tensors with a build with NCCL (every tensor made here follows the
    gradient's device)."""

    grouped_allreduce = staticmethod(mpi_ops.grouped_allreduce)
    grouped_allgather = staticmethod(mpi_ops.grouped_allgather)
    is_floating = staticmethod(lambda tensor: tensor.is_floating_point())
    dtype = staticmethod(lambda tensor: tensor.dtype)
    shape = staticmethod(lambda tensor: tuple(tensor.shape))
    reshape = staticmethod(lambda tensor, shape: tensor.reshape(shape))
    cast = staticmethod(lambda tensor, dtype: tensor.to(dtype))
    factor_dtype = staticmethod(lambda dtype: torch.float64 if dtype == torch.float64 else torch.float32)
    transpose = staticmethod(lambda matrix: matrix.T)
    orthonormal = staticmethod(lambda matrix: torch.linalg.qr(matrix).Q)
    top_k_abs = staticmethod(lambda flat, k: torch.topk(flat.abs(), k, sorted=False).indices)
    take = staticmethod(lambda flat, indices: flat[indices])
    int32 = staticmethod(lambda indices: indices.to(torch.int32))
    contiguous = staticmethod(lambda tensor: tensor.contiguous())
    detach = staticmethod(lambda tensor: tensor.detach())
    copy = staticmethod(lambda tensor: tensor.clone())

    @staticmethod
    def gaussian(rows, columns, seed, like):
        generator = torch.Generator().manual_seed(seed)
        return torch.randn(rows, columns, generator=generator, dtype=torch.float64).to(like.dtype).to(like.device)

    @staticmethod
    def zero_at(flat, indices):
        out = flat.clone()
        out[indices] = 0
        return out

    @staticmethod
    def scatter_add(size, indices, values, dtype):
        dense = torch.zeros(size, dtype=dtype, device=values.device)
        return dense.index_add_(0, indices.to(torch.int64), values)


_common.register(torch.Tensor, _TorchOps)
