"""Horovod for TensorFlow: ``import horovod.tensorflow as hvd``.

Collectives on ``tf.Tensor`` (eagerly, in ``tf.function`` and in TF1 graphs), gradient tapes and
optimizers that average gradients across ranks, variable and object broadcast, and synchronised
batch normalisation, over the horovod-core engine. Pure Python: nothing is compiled against
TensorFlow. See docs/tensorflow.md. ``tf.function(jit_compile=True)`` (XLA) is not supported:
Horovod ops built under it raise ValueError.
"""

import pkgutil
from importlib.metadata import PackageNotFoundError as _PackageNotFoundError, version as _version

from horovod.common.util import check_framework_package as _check_framework_package

try:
    _check_framework_package("horovod-tf", _version("horovod-tf"))
except _PackageNotFoundError:
    pass  # running from a source tree rather than an installed distribution

# horovod.tensorflow.keras ships in horovod-keras: let it live in another folder (editable installs).
__path__ = pkgutil.extend_path(__path__, __name__)

import tensorflow as tf  # noqa: E402

from horovod.common.api import *  # noqa: E402,F403 (hvd.size, hvd.Average, hvd.ProcessSet, ...)
from horovod.tensorflow import mpi_ops, util  # noqa: F401 (hvd.mpi_ops, hvd.util)
from horovod.tensorflow.compression import Compression, PowerSGD, TopK  # noqa: F401
from horovod.tensorflow.functions import (  # noqa: F401
    allgather_object,
    broadcast_global_variables,
    broadcast_object,
    broadcast_object_fn,
    broadcast_variables,
)
from horovod.tensorflow.gradient_aggregation import LocalGradientAggregationHelper  # noqa: F401
from horovod.tensorflow.mpi_ops import (  # noqa: F401
    _allreduce,
    _grouped_allreduce,
    _grouped_reducescatter,
    _reducescatter,
    allgather,
    alltoall,
    broadcast,
    broadcast_,
    check_num_rank_power_of_2,
    grouped_allgather,
    handle_average_backwards_compatibility,
    init,
    is_homogeneous,
    join,
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    reduce,
    shutdown,
    size_op,
)
from horovod.tensorflow.optimizer import DistributedOptimizer, _make_allreduce_grads_fn  # noqa: F401
from horovod.tensorflow.reduction import (  # noqa: F401
    allreduce,
    grouped_allreduce,
    grouped_reducescatter,
    reducescatter,
)
from horovod.tensorflow.sync_batch_norm import SyncBatchNormalization  # noqa: F401
from horovod.tensorflow.util import _cache, _executing_eagerly, _make_subgraph, refs_to_vars, vars_to_refs  # noqa: F401

if hasattr(tf, 'GradientTape'):
    from horovod.tensorflow.tape import DistributedGradientTape, PartialDistributedGradientTape  # noqa: F401

if hasattr(tf.compat.v1, 'global_variables') and hasattr(tf.compat.v1.train, 'SessionRunHook'):
    from horovod.tensorflow.functions import BroadcastGlobalVariablesHook  # noqa: F401

from horovod.tensorflow import elastic  # noqa: E402,F401 (hvd.elastic; imports the names above)

