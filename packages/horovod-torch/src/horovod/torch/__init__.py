"""Horovod for PyTorch: data-parallel training over many processes and hosts.

``import horovod.torch as hvd``; call ``hvd.init()``, scale the learning rate by
``hvd.size()``, wrap the optimizer in ``hvd.DistributedOptimizer`` and broadcast the initial
state from rank 0 with ``hvd.broadcast_parameters`` and ``hvd.broadcast_optimizer_state``.
"""

import torch

from horovod.torch import mpi_ops
from horovod.torch.compression import Compression
from horovod.torch.functions import (allgather_object, broadcast_object,
                                     broadcast_optimizer_state, broadcast_parameters)
from horovod.torch.mpi_ops import (Adasum, Average, HorovodInternalError, Max, Min, Product,
                                   ProcessSet, Sum, allgather, allgather_async, allreduce,
                                   allreduce_, allreduce_async, allreduce_async_, broadcast,
                                   broadcast_, broadcast_async, broadcast_async_, ccl_built,
                                   cross_rank, cross_size, cuda_built, ddl_built,
                                   global_process_set, gloo_built, gloo_enabled,
                                   grouped_allreduce, grouped_allreduce_,
                                   grouped_allreduce_async, grouped_allreduce_async_, init,
                                   is_initialized, local_rank, local_size, mpi_built,
                                   mpi_enabled, mpi_threads_supported, nccl_built, poll, rank,
                                   rocm_built, shutdown, size, start_timeline, stop_timeline,
                                   synchronize)
from horovod.torch.optimizer import DistributedOptimizer


def _check_has_gpu():
    """Returns whether torch sees a CUDA device (used by horovod.common.util.gpu_available)."""
    return torch.cuda.is_available()
