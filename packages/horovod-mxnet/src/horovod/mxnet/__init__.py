"""Horovod for Apache MXNet: data-parallel training over many processes and hosts.

``import horovod.mxnet as hvd``; call ``hvd.init()``, scale the learning rate by ``hvd.size()``,
train with ``hvd.DistributedTrainer`` (gluon) or ``hvd.DistributedOptimizer``, and broadcast the
initial parameters from rank 0 with ``hvd.broadcast_parameters``. Needs MXNet 1.x (1.9.1, with
numpy < 1.24), installed separately.
"""

from importlib.metadata import PackageNotFoundError, version as _version

from horovod.common.util import check_framework_package as _check_framework_package

try:
    _check_framework_package('horovod-mxnet', _version('horovod-mxnet'))
except PackageNotFoundError:
    pass  # running from a source tree rather than an installed distribution

from horovod.common import api as _api  # noqa: E402
from horovod.common.api import *  # noqa: E402,F403 (hvd.size, hvd.Average, hvd.ProcessSet, ...)
from horovod.mxnet import mpi_ops  # noqa: E402
from horovod.mxnet.compression import Compression  # noqa: E402
from horovod.mxnet.functions import (  # noqa: E402
    allgather_object,
    broadcast_object,
    broadcast_parameters,
)
from horovod.mxnet.mpi_ops import (  # noqa: E402
    allgather,
    allreduce,
    allreduce_,
    alltoall,
    broadcast,
    broadcast_,
    grouped_allgather,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_reducescatter,
    init,
    reduce,
    reducescatter,
    shutdown,
)
from horovod.mxnet.optimizer import DistributedOptimizer, DistributedTrainer  # noqa: E402

__all__ = [
    'mpi_ops',
    'Compression',
    'allgather_object',
    'broadcast_object',
    'broadcast_parameters',
    'allgather',
    'allreduce',
    'allreduce_',
    'alltoall',
    'broadcast',
    'broadcast_',
    'grouped_allgather',
    'grouped_allreduce',
    'grouped_allreduce_',
    'grouped_reducescatter',
    'init',
    'reduce',
    'reducescatter',
    'shutdown',
    'DistributedOptimizer',
    'DistributedTrainer',
]
__all__ += _api.__all__


def _check_has_gpu():
    """Whether MXNet sees a CUDA device (used by horovod.common.util.gpu_available)."""
    import mxnet as mx
    return mx.context.num_gpus() > 0
