"""Helpers that bring model parameters and Python objects into agreement across ranks."""

import types

from horovod.mxnet import mpi_ops
from horovod.mxnet.mpi_ops import allgather, broadcast_, rank, size

import mxnet as mx


def _parameter_types():
    from mxnet.gluon.parameter import Parameter, ParameterDict
    return Parameter, ParameterDict


def broadcast_parameters(params, root_rank=0, prefix=None):
    """Overwrites ``params`` on every rank with the root's values, in place.

    Call it once before training (for example with ``net.collect_params()``) so that every
    rank starts from the same weights. Entries are sent in sorted key order, each under the
    engine name ``horovod_broadcast.<prefix><key>``; all broadcasts are submitted before any is
    waited on. A gluon ``Parameter`` whose shape is still unknown (deferred initialisation) is
    broadcast right after MXNet initialises it, during the first forward pass, which every rank
    must then run. Nothing happens when ``size() == 1``. Uses the global process set.

    Args:
        params: a ``dict`` of name -> NDArray or gluon ``Parameter``, or a gluon
            ``ParameterDict``; the same keys, shapes and dtypes on every rank. A Parameter is
            broadcast on its first context and copied to its other contexts.
        root_rank: the global rank whose values are sent (default 0).
        prefix: str prepended to every key in the engine names, or None; lets two calls with
            the same keys be in flight at once.

    Raises:
        ValueError: ``params`` is neither a dict nor a ``ParameterDict`` (the message names its
            type), ``prefix`` is neither a str nor None, or an entry is not a broadcastable
            NDArray.
        HorovodInternalError: ranks disagree on an entry's shape or dtype, or Horovod is not
            running.
    """
    Parameter, ParameterDict = _parameter_types()
    if prefix is not None and not isinstance(prefix, str):
        raise ValueError(f'prefix must be a str or None, got {type(prefix).__name__}.')
    if not isinstance(params, (dict, ParameterDict)):
        raise ValueError('broadcast_parameters expects a dict or a gluon ParameterDict, got '
                         f'{type(params).__name__}.')
    if size() == 1:
        return
    prefix = prefix or ''
    tensors, names, spread = [], [], []
    for key in sorted(params.keys()):
        value = params[key]
        if isinstance(value, Parameter):
            try:
                copies = value.list_data()
            except mx.gluon.parameter.DeferredInitializationError:
                _broadcast_after_init(value, root_rank, prefix + str(key))
                continue
            tensors.append(copies[0])
            spread.append(copies)
        else:
            tensors.append(value)
        names.append(prefix + str(key))
    for tensor, name in zip(tensors, names, strict=True):
        mpi_ops._check_array(tensor, mpi_ops._MOVE_DTYPES, f'broadcast_parameters ({name})')
    mpi_ops._run_all([
        (lambda t=t, n=n: mpi_ops._start_broadcast(t, t, root_rank, n,
                                                   mpi_ops.global_process_set))
        for t, n in zip(tensors, names, strict=True)])
    for copies in spread:
        for other in copies[1:]:
            copies[0].copyto(other)


def _broadcast_after_init(param, root_rank, name):
    """Makes ``param`` broadcast its values from ``root_rank`` as soon as MXNet has initialised
    them (gluon calls ``Parameter._init_impl`` once the shape is known)."""
    initialise = param._init_impl

    def init_then_broadcast(self, *args, **kwargs):
        initialise(*args, **kwargs)
        copies = self.list_data()
        broadcast_(copies[0], root_rank, name)
        for other in copies[1:]:
            copies[0].copyto(other)

    param._init_impl = types.MethodType(init_then_broadcast, param)


def broadcast_object(obj, root_rank=0, name=None):
    """Sends a picklable Python object from the root to every rank (global process set).

    The root serialises ``obj`` with cloudpickle; a header (int32 ``[status, length]``, engine
    name ``horovod_broadcast.<name>.sz``) and then the bytes (uint8, ``horovod_broadcast.<name>.t``)
    are broadcast (horovod.common.objects).

    Args:
        obj: any object cloudpickle can serialise; ignored on the other ranks (``None`` is fine).
        root_rank: the global rank whose object is sent (default 0).
        name: base name of the two broadcasts, the same on every rank; default
            ``'broadcast_object'``.

    Returns:
        The root's object (on the root, ``obj`` itself; elsewhere an unpickled copy).

    Raises:
        ValueError: ``root_rank`` is not an int or not a rank.
        the root's exception (on the root) and horovod.common.objects.ObjectTransferError (on the
            other ranks, naming the root): ``obj`` cannot be serialised on the root.
        HorovodInternalError: the ranks' names or roots disagree, or Horovod is not running.
    """
    from horovod.common import objects
    base = objects.BROADCAST_NAME if name is None else name

    def run(array, suffix):
        tensor = mx.nd.array(array, dtype=array.dtype)
        broadcast_(tensor, root_rank, base + suffix)
        return tensor.asnumpy()

    return objects.broadcast_object(obj, rank() == root_rank, root_rank, run)


def allgather_object(obj, name=None):
    """Gathers a picklable Python object from every rank (global process set).

    Each rank serialises ``obj`` with cloudpickle; headers (int32 ``[status, length]``, engine
    name ``horovod_allgather.<name>.sz``) and then the bytes (uint8, ``horovod_allgather.<name>.t``)
    are gathered (horovod.common.objects).

    Args:
        obj: any object cloudpickle can serialise.
        name: base name of the two allgathers, the same on every rank; default
            ``'allgather_object'``.

    Returns:
        list of ``size()`` objects in rank order (this rank's entry is an unpickled copy).

    Raises:
        this rank's exception when its ``obj`` cannot be serialised, and
            horovod.common.objects.ObjectTransferError on the others, naming the failed ranks.
        HorovodInternalError: the ranks' names disagree, or Horovod is not running.
    """
    from horovod.common import objects
    base = objects.ALLGATHER_NAME if name is None else name
    return objects.allgather_object(
        obj, lambda array, suffix: allgather(mx.nd.array(array, dtype=array.dtype), name=base + suffix).asnumpy())
