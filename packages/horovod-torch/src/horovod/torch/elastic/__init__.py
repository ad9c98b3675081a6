"""Elastic training for PyTorch: state objects, a resumable sampler and the ``run`` decorator.

``@hvd.elastic.run`` wraps ``train(state, ...)``: the state (usually a :class:`TorchState`) is
synchronised from rank 0 before each attempt, rolled back to its last ``commit()`` after a
``HorovodInternalError``, and Horovod is re-initialised between attempts (torch.md §9).
"""

from horovod.common.elastic import run_fn
from horovod.torch.elastic.sampler import ElasticSampler
from horovod.torch.elastic.state import TorchState
from horovod.torch.mpi_ops import init, shutdown

__all__ = ['TorchState', 'ElasticSampler', 'run']


def run(func):
    """Decorator making ``func(state, *args, **kwargs)`` survive failures and host changes.

    Args:
        func: the training function; its first argument is a :class:`TorchState` (or any
            ``horovod.common.elastic.State``).

    Returns:
        The wrapped function, returning what ``func`` returns. Exceptions other than
        ``HorovodInternalError`` and ``HostsUpdatedInterrupt`` propagate unchanged.
    """
    return run_fn(func, _reset)


def _reset():
    shutdown()
    init()
