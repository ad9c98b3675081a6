"""Horovod for PyTorch: data-parallel training over many processes and hosts.

``import horovod.torch as hvd``; call ``hvd.init()``, scale the learning rate by
``hvd.size()``, wrap the optimizer in ``hvd.DistributedOptimizer`` and broadcast the initial
state from rank 0 with ``hvd.broadcast_parameters`` and ``hvd.broadcast_optimizer_state``.
"""

from importlib.metadata import PackageNotFoundError, version as _version

from horovod.common.util import check_framework_package as _check_framework_package

try:
    _check_framework_package("horovod-torch", _version("horovod-torch"))
except PackageNotFoundError:
    pass  # running from a source tree rather than an installed distribution

from horovod.torch import mpi_ops  # noqa: E402
from horovod.torch.compression import Compression
from horovod.torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from horovod.torch.mpi_ops import (
    Adasum,
    Average,
    HorovodInternalError,
    Max,
    Min,
    ProcessSet,
    Product,
    Sum,
    add_process_set,
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    global_process_set,
    gloo_built,
    gloo_enabled,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    init,
    is_initialized,
    join,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    poll,
    rank,
    reducescatter,
    reducescatter_async,
    remove_process_set,
    rocm_built,
    shutdown,
    size,
    sparse_allreduce_async,
    start_timeline,
    stop_timeline,
    synchronize,
)
from horovod.torch.optimizer import DistributedOptimizer
from horovod.torch.sync_batch_norm import SyncBatchNorm
from horovod.torch import elastic  # noqa: E402,F401  (subpackage: hvd.elastic)

import torch

__all__ = [
    'elastic',
    'mpi_ops',
    'Compression',
    'allgather_object',
    'broadcast_object',
    'broadcast_optimizer_state',
    'broadcast_parameters',
    'Adasum',
    'Average',
    'HorovodInternalError',
    'Max',
    'Min',
    'ProcessSet',
    'Product',
    'Sum',
    'add_process_set',
    'allgather',
    'allgather_async',
    'allreduce',
    'allreduce_',
    'allreduce_async',
    'allreduce_async_',
    'alltoall',
    'alltoall_async',
    'barrier',
    'broadcast',
    'broadcast_',
    'broadcast_async',
    'broadcast_async_',
    'ccl_built',
    'cross_rank',
    'cross_size',
    'cuda_built',
    'ddl_built',
    'global_process_set',
    'gloo_built',
    'gloo_enabled',
    'grouped_allgather',
    'grouped_allgather_async',
    'grouped_allreduce',
    'grouped_allreduce_',
    'grouped_allreduce_async',
    'grouped_allreduce_async_',
    'grouped_reducescatter',
    'grouped_reducescatter_async',
    'init',
    'is_initialized',
    'join',
    'local_rank',
    'local_size',
    'mpi_built',
    'mpi_enabled',
    'mpi_threads_supported',
    'nccl_built',
    'poll',
    'rank',
    'reducescatter',
    'reducescatter_async',
    'remove_process_set',
    'rocm_built',
    'shutdown',
    'size',
    'sparse_allreduce_async',
    'start_timeline',
    'stop_timeline',
    'synchronize',
    'DistributedOptimizer',
    'SyncBatchNorm',
]


def _check_has_gpu():
    """Returns whether torch sees a CUDA device (used by horovod.common.util.gpu_available)."""
    return torch.cuda.is_available()
