"""The names every framework package re-exports unchanged, defined once: the basics of core.md §2
but ``init`` and ``shutdown`` (which each package wraps), the reduce ops, the process-set API and
``HorovodInternalError``. A package's ``mpi_ops`` binds them with ``from horovod.common.api import
*`` and its ``__init__`` adds this module's ``__all__`` to its own.

The functions are methods of ``basics``, the one ``HorovodBasics`` that every package shares, and
the engine state behind them is the process's: Horovod initialised through one package (say
``horovod.torch``, under ``horovod.keras`` on the torch backend) is initialised for all.
``is_homogeneous`` and ``handle_average_backwards_compatibility`` are defined here too, but left
out of ``__all__``: a package exports them from its top level only where upstream Horovod does.
"""

from horovod.common.basics import HorovodBasics as _HorovodBasics
from horovod.common.exceptions import HorovodInternalError
from horovod.common.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from horovod.common.util import get_average_backwards_compatibility_fun as _get_average_backwards_compatibility_fun

basics = _HorovodBasics()

is_initialized = basics.is_initialized
start_timeline = basics.start_timeline
stop_timeline = basics.stop_timeline
dump_flight_recorder = basics.dump_flight_recorder
size = basics.size
local_size = basics.local_size
cross_size = basics.cross_size
rank = basics.rank
local_rank = basics.local_rank
cross_rank = basics.cross_rank
is_homogeneous = basics.is_homogeneous
mpi_threads_supported = basics.mpi_threads_supported
mpi_enabled = basics.mpi_enabled
mpi_built = basics.mpi_built
gloo_enabled = basics.gloo_enabled
gloo_built = basics.gloo_built
nccl_built = basics.nccl_built
ddl_built = basics.ddl_built
ccl_built = basics.ccl_built
cuda_built = basics.cuda_built
rocm_built = basics.rocm_built

Average = _HorovodBasics.Average
Sum = _HorovodBasics.Sum
Adasum = _HorovodBasics.Adasum
Min = _HorovodBasics.Min
Max = _HorovodBasics.Max
Product = _HorovodBasics.Product

# Resolves the deprecated ``average`` argument into a reduce op (core.md §3).
handle_average_backwards_compatibility = _get_average_backwards_compatibility_fun(basics)

__all__ = [
    'is_initialized', 'start_timeline', 'stop_timeline', 'dump_flight_recorder',
    'size', 'local_size', 'cross_size', 'rank', 'local_rank', 'cross_rank',
    'mpi_threads_supported', 'mpi_enabled', 'mpi_built', 'gloo_enabled', 'gloo_built',
    'nccl_built', 'ddl_built', 'ccl_built', 'cuda_built', 'rocm_built',
    'Average', 'Sum', 'Adasum', 'Min', 'Max', 'Product',
    'ProcessSet', 'global_process_set', 'add_process_set', 'remove_process_set',
    'HorovodInternalError',
]
