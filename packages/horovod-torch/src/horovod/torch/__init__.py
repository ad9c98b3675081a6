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

from horovod.common import api as _api  # noqa: E402
from horovod.common.api import *  # noqa: E402,F403 (hvd.size, hvd.Average, hvd.ProcessSet, ...)
from horovod.torch import mpi_ops  # noqa: E402
from horovod.torch.compression import Compression
from horovod.torch.stateful_compression import PowerSGD, TopK
from horovod.torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from horovod.torch.mpi_ops import (
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
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    init,
    join,
    poll,
    reduce,
    reduce_async,
    reducescatter,
    reducescatter_async,
    shutdown,
    sparse_allreduce_async,
    synchronize,
)
from horovod.torch.optimizer import DistributedOptimizer
from horovod.torch.sync_batch_norm import SyncBatchNorm
from horovod.torch.zero import ZeroRedundancyOptimizer
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
    'grouped_allgather',
    'grouped_allgather_async',
    'grouped_allreduce',
    'grouped_allreduce_',
    'grouped_allreduce_async',
    'grouped_allreduce_async_',
    'grouped_reducescatter',
    'grouped_reducescatter_async',
    'init',
    'join',
    'poll',
    'reduce',
    'reduce_async',
    'reducescatter',
    'reducescatter_async',
    'shutdown',
    'sparse_allreduce_async',
    'synchronize',
    'DistributedOptimizer',
    'SyncBatchNorm',
    'ZeroRedundancyOptimizer',
    'PowerSGD',
    'TopK',
]
__all__ += _api.__all__


def _check_has_gpu():
    """Returns whether torch sees a CUDA device (used by horovod.common.util.gpu_available)."""
    return torch.cuda.is_available()
