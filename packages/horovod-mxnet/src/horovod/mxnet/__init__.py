"""Horovod for Apache MXNet: data-parallel training over many processes and hosts.

``import horovod.mxnet as hvd``; call ``hvd.init()``, scale the learning rate by ``hvd.size()``,
train with ``hvd.DistributedTrainer`` (gluon) or ``hvd.DistributedOptimizer``, and broadcast the
initial parameters from rank 0 with ``hvd.broadcast_parameters``. Needs MXNet 1.x (1.9.1, with
numpy < 1.24), installed separately.
"""

from importlib.metadata import PackageNotFoundError, version as _version


def _check_core():
    import horovod
    from horovod.common import util

    try:
        mine = _version('horovod-mxnet')
    except PackageNotFoundError:
        return  # running from a source tree rather than an installed distribution
    if 'horovod-mxnet' in util.SUPPORTED_PACKAGES:
        util.check_framework_package('horovod-mxnet', mine)
        return
    # A core that does not list this package yet: require the same release series.
    series = '.'.join(mine.split('.')[:2])
    if not horovod.__version__.startswith(series + '.') and horovod.__version__ != series:
        raise ImportError(f'horovod-mxnet {mine} needs horovod-core {series}.x, found '
                          f'{horovod.__version__}; install matching versions, e.g. pip install '
                          f"'horovod-core=={mine}' 'horovod-mxnet=={mine}'.")


_check_core()

from horovod.mxnet import mpi_ops  # noqa: E402
from horovod.mxnet.compression import Compression  # noqa: E402
from horovod.mxnet.functions import (  # noqa: E402
    allgather_object,
    broadcast_object,
    broadcast_parameters,
)
from horovod.mxnet.mpi_ops import (  # noqa: E402
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
    allreduce,
    allreduce_,
    alltoall,
    broadcast,
    broadcast_,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    global_process_set,
    gloo_built,
    gloo_enabled,
    grouped_allgather,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_reducescatter,
    init,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    reducescatter,
    remove_process_set,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from horovod.mxnet.optimizer import DistributedOptimizer, DistributedTrainer  # noqa: E402

__all__ = [
    'mpi_ops',
    'Compression',
    'allgather_object',
    'broadcast_object',
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
    'allreduce',
    'allreduce_',
    'alltoall',
    'broadcast',
    'broadcast_',
    'ccl_built',
    'cross_rank',
    'cross_size',
    'cuda_built',
    'ddl_built',
    'global_process_set',
    'gloo_built',
    'gloo_enabled',
    'grouped_allgather',
    'grouped_allreduce',
    'grouped_allreduce_',
    'grouped_reducescatter',
    'init',
    'is_initialized',
    'local_rank',
    'local_size',
    'mpi_built',
    'mpi_enabled',
    'mpi_threads_supported',
    'nccl_built',
    'rank',
    'reducescatter',
    'remove_process_set',
    'rocm_built',
    'shutdown',
    'size',
    'start_timeline',
    'stop_timeline',
    'DistributedOptimizer',
    'DistributedTrainer',
]


def _check_has_gpu():
    """Whether MXNet sees a CUDA device (used by horovod.common.util.gpu_available)."""
    import mxnet as mx
    return mx.context.num_gpus() > 0
