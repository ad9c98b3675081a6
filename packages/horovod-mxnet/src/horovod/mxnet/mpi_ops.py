"""Collective operations on MXNet NDArrays, over the horovod-core engine.

Execution model: every function here hands its arrays to the engine and returns once the
collective has completed. The engine reads an input only after MXNet's dependency engine has
finished writing it (the DLPack export waits for pending writes), writes an output only after
MXNet has finished with it, and MXNet's later operations see the result because the call returns
only then. Upstream Horovod instead pushes each collective onto MXNet's dependency engine from
C++; this package is pure Python, so ``priority`` is accepted (it must be an int) and has no
effect: nothing is queued behind the call. Results are ordinary NDArrays; outputs whose size is
only known after negotiation (allgather, alltoall, reducescatter) are allocated by the engine and
wrapped without a copy.

Threading: each call runs on the caller's thread and waits, with the GIL released, for the
engine's background thread. While it waits, horovod.common.ops' table of operations in flight
holds a reference to every array the engine uses, so they stay alive until the collective is over.

Errors: a mistake visible at submission (wrong type, dtype or context, a name already in flight,
an unregistered process set or one this rank is not in, bad splits) raises ``ValueError``; a
failure negotiated among the ranks (shapes or dtypes that disagree), Horovod not running or a
lost peer raises ``HorovodInternalError`` (a ``RuntimeError``) on every rank.
"""

import numpy as np

from horovod.common import dtypes as _dtypes
from horovod.common import ops as _ops
from horovod.common.api import *  # noqa: F403 (hvd.size, hvd.Average, hvd.ProcessSet, ...: api.__all__)
from horovod.common.api import (  # noqa: F401 (used here, or only in mpi_ops: is_homogeneous)
    Adasum, Average, Max, Min, ProcessSet, Product, Sum, basics as _basics, global_process_set,
    handle_average_backwards_compatibility, is_homogeneous,
)
from horovod.common.process_sets import _registered_id as _process_set_id
from horovod.mxnet import _dlpack

import mxnet as mx

# MXNet 1.x has no int16, uint16 or (in numpy) bfloat16 arrays.
_REDUCE_DTYPES = _dtypes.of(np.dtype, 'uint8 int8 int32 int64 float16 float32 float64')
_MOVE_DTYPES = _REDUCE_DTYPES + _dtypes.of(np.dtype, 'bool')
_REDUCESCATTER_DTYPES = _dtypes.of(np.dtype, 'int32 int64 float16 float32 float64')
_REDUCE_OPS = (Average, Sum, Min, Max, Product)


class UnsupportedOpError(ValueError, AssertionError):
    """A reduce op the operation does not support. Both a ``ValueError`` (bad input) and, as
    upstream raises from an ``assert``, an ``AssertionError``."""


def init(*args, **kwargs):
    """Starts Horovod in this process (see ``horovod.common.basics.HorovodBasics.init``) and
    registers the process sets given as ``process_sets=``; the ``ProcessSet`` objects, the
    global one included, then answer ``size()``, ``rank()`` and ``included()``. Calling it
    again while running starts nothing.

    Starting the engine drops the handles of an earlier run and restarts the automatic names.

    Args:
        *args: ``comm`` and ``process_sets``, as ``horovod.common.basics.HorovodBasics.init``
            takes them: ``comm`` None for every process of the job; ``process_sets`` None, a
            list of ``ProcessSet`` objects (the same list on every rank) or ``"dynamic"``.
        **kwargs: the same, by name.

    Raises:
        ValueError: the engine could not start, or a process set is a duplicate.
    """
    return _basics.init(*args, **kwargs)


def shutdown():
    """Stops Horovod in this process; operations still pending on other ranks fail there.

    Safe to call when Horovod is not running; ``init()`` may be called again afterwards, and
    then names unnamed operations as a fresh process does.
    """
    return _basics.shutdown()


def _check_array(tensor, dtypes, op_name):
    if not isinstance(tensor, mx.nd.NDArray):
        raise ValueError(f'{op_name} expects an mxnet.nd.NDArray, got {type(tensor).__name__}.')
    if tensor.stype != 'default':
        raise ValueError(f'{op_name} expects a dense NDArray, got storage type {tensor.stype!r} '
                         '(convert with .tostype("default")).')
    if tensor.context.device_type not in ('cpu', 'cpu_shared'):
        raise ValueError(f'{op_name} got an NDArray on {tensor.context}: this build of Horovod '
                         'handles CPU arrays only (GPU arrays need a build with NCCL). Copy it '
                         'with .as_in_context(mx.cpu()).')
    if np.dtype(tensor.dtype) not in dtypes:
        supported = ', '.join(d.name for d in dtypes)
        raise ValueError(f'{op_name} does not support dtype {np.dtype(tensor.dtype).name}; '
                         f'supported: {supported}.')


def _check_arrays(tensors, dtypes, op_name):
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise ValueError(f'{op_name} expects a non-empty list of NDArrays, '
                         f'got {type(tensors).__name__}.')
    for t in tensors:
        _check_array(t, dtypes, op_name)


def _check_priority(priority):
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f'priority must be an int, got {priority!r}.')



def _engine_names(op, name, set_id, count=None):
    """``horovod_<op>.<name>`` or ``horovod_<op>.noname.<k>`` (horovod.common.ops' automatic
    names); with ``count`` (grouped ops), one name per member with ``_<i+1>of<count>``
    appended."""
    return _ops.op_names(f'horovod_{op}', name, set_id, count)


def _wait_all(handles):
    """Waits for every handle, even after one has failed (so that none is left in flight), and
    returns their results; raises the first failure."""
    results, failure = [], None
    for handle in handles:
        try:
            results.append(_wait(handle))
        except Exception as e:  # noqa: BLE001 (re-raised below, after the others are done)
            failure = failure or e
    if failure is not None:
        raise failure
    return results


def _run_all(starts):
    """Calls each of ``starts`` (functions that submit one operation and return its handle),
    then waits for all of them; returns their results in order. When a submission fails, the
    operations already submitted are waited for before the error propagates."""
    handles = []
    try:
        for start in starts:
            handles.append(start())
    except Exception:
        try:
            _wait_all(handles)
        except Exception:  # noqa: BLE001 (the submission error is the one to report)
            pass
        raise
    return _wait_all(handles)


def _wait(handle):
    """Waits for ``handle``; returns the engine's results wrapped as NDArrays (None where the
    caller gave the output)."""
    results = _ops.wait(handle)
    return [None if r is None else _dlpack.to_ndarray(r) for r in results]


def _empty_like(tensor):
    # mx.nd.empty, unlike MXNet's operators (zeros, copy), also takes 0-d and zero-size shapes
    # outside numpy-shape mode. The engine overwrites every element.
    return mx.nd.empty(tensor.shape, ctx=tensor.context, dtype=tensor.dtype)


def _copy_of(tensor):
    if tensor.ndim and tensor.size:
        return tensor.copy()
    return mx.nd.array(tensor.asnumpy(), ctx=tensor.context, dtype=tensor.dtype)


def _start_allreduce(tensors, outputs, average, name, op, prescale_factor, postscale_factor,
                     process_set, grouped):
    """Checks and submits an allreduce of ``tensors`` into ``outputs`` (the same arrays: in
    place); returns its handle. The arrays must already have been checked."""
    op = handle_average_backwards_compatibility(op, average)
    if op == Adasum:
        raise UnsupportedOpError('horovod.mxnet does not support op=Adasum; use Average or Sum.')
    if op not in _REDUCE_OPS:
        raise ValueError(f'Unknown reduce op {op!r}; expected one of hvd.Average, hvd.Sum, '
                         'hvd.Min, hvd.Max, hvd.Product.')
    set_id = _process_set_id(process_set)
    names = _engine_names('allreduce', name, set_id, len(tensors) if grouped else None)
    # Capsules are made after every check, since each one must reach the engine (which
    # consumes it: an in-place array needs one capsule as input and another as output).
    inputs = [_dlpack.for_read(t) for t in tensors]
    targets = [_dlpack.for_write(o) for o in outputs]
    handle = _ops.allreduce_async(inputs, targets, names, op, float(prescale_factor),
                                  float(postscale_factor), set_id, context=(tuple(tensors), tuple(outputs)))
    return handle


def allreduce(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set, op=None):
    """Allreduce of ``tensor`` into a new NDArray.

    The result, ``postscale_factor * REDUCE_over_ranks(prescale_factor * tensor)``, has the
    shape, dtype and context of ``tensor``. ``Average`` is a sum divided by the number of ranks
    in ``process_set`` (integer dtypes truncate). Every rank of the set must submit an array of
    the same shape and dtype under the same name.

    Args:
        tensor: a dense CPU NDArray of dtype uint8, int8, int32, int64, float16, float32 or
            float64, any shape.
        average: deprecated; use ``op``. True means ``Average``, False means ``Sum``.
        name: a name unique among the operations in flight, the same on every rank. Default:
            ``horovod_allreduce.noname.<k>`` for the k-th unnamed allreduce on ``process_set``
            (ranks must then submit their unnamed allreduces on the set in the same order).
        priority: int; accepted for compatibility, no effect (the call completes before it
            returns).
        prescale_factor: factor applied to the input before the reduction.
        postscale_factor: factor applied to the result after the reduction.
        process_set: the ``ProcessSet`` to reduce over (default: all ranks).
        op: ``Average`` (default), ``Sum``, ``Min``, ``Max`` or ``Product``.

    Returns:
        mxnet.nd.NDArray: the reduction; ``tensor`` is unchanged.

    Raises:
        ValueError: not a dense CPU NDArray, unsupported dtype, ``op`` and ``average`` both
            given, unknown op, a non-int priority, a name already in flight, an unregistered
            process set or this rank not in it.
        UnsupportedOpError: ``op`` is ``Adasum`` (a ``ValueError`` and an ``AssertionError``).
        HorovodInternalError: ranks disagree on shape, dtype, op or scale factors; Horovod is not
            running; a peer was lost.
    """
    _check_array(tensor, _REDUCE_DTYPES, 'allreduce')
    _check_priority(priority)
    output = _empty_like(tensor)
    _wait(_start_allreduce([tensor], [output], average, name, op, prescale_factor,
                           postscale_factor, process_set, grouped=False))
    return output


def allreduce_(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set, op=None):
    """In-place allreduce: the reduction is written into ``tensor``, which is returned.

    Args:
        tensor, average, name, priority, prescale_factor, postscale_factor, process_set, op: as
            for :func:`allreduce`; ``tensor`` receives the result.

    Raises:
        ValueError, UnsupportedOpError, HorovodInternalError: as for :func:`allreduce`.
    """
    _check_array(tensor, _REDUCE_DTYPES, 'allreduce_')
    _check_priority(priority)
    _wait(_start_allreduce([tensor], [tensor], average, name, op, prescale_factor,
                           postscale_factor, process_set, grouped=False))
    return tensor


def grouped_allreduce(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set, op=None):
    """Allreduce of a list of NDArrays into new NDArrays, negotiated and executed together.

    The engine fuses members of one dtype into as few collectives as its fusion threshold
    allows; each result equals the single-array allreduce of its input. Dtypes may differ
    within the list; op and scale factors are shared. Member ``i`` of ``n`` is named
    ``horovod_allreduce.<name>_<i+1>of<n>``.

    Args:
        tensors: a non-empty list of NDArrays, each as for :func:`allreduce`.
        average, name, priority, prescale_factor, postscale_factor, process_set, op: as for
            :func:`allreduce`.

    Returns:
        list of NDArrays, one per input, in input order.

    Raises:
        ValueError, UnsupportedOpError, HorovodInternalError: as for :func:`allreduce`, or
            ``tensors`` is not a non-empty list.
    """
    _check_arrays(tensors, _REDUCE_DTYPES, 'grouped_allreduce')
    _check_priority(priority)
    outputs = [_empty_like(t) for t in tensors]
    _wait(_start_allreduce(list(tensors), outputs, average, name, op, prescale_factor,
                           postscale_factor, process_set, grouped=True))
    return outputs


def grouped_allreduce_(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set, op=None):
    """In-place grouped allreduce: each reduction is written into its input; returns
    ``tensors``.

    Args:
        tensors, average, name, priority, prescale_factor, postscale_factor, process_set, op: as
            for :func:`grouped_allreduce`; each array of ``tensors`` receives its result.

    Raises:
        ValueError, UnsupportedOpError, HorovodInternalError: as for :func:`grouped_allreduce`.
    """
    _check_arrays(tensors, _REDUCE_DTYPES, 'grouped_allreduce_')
    _check_priority(priority)
    _wait(_start_allreduce(list(tensors), list(tensors), average, name, op, prescale_factor,
                           postscale_factor, process_set, grouped=True))
    return tensors


def _start_allgather(tensors, name, process_set, grouped):
    set_id = _process_set_id(process_set)
    names = _engine_names('allgather', name, set_id, len(tensors) if grouped else None)
    handle = _ops.allgather_async([_dlpack.for_read(t) for t in tensors], names, set_id,
                                  context=tuple(tensors))
    return handle


def allgather(tensor, name=None, priority=0, process_set=global_process_set):
    """Concatenation of every rank's ``tensor`` along dimension 0, in rank order.

    Dimension 0 may differ between ranks; the other dimensions and the dtype must agree.

    Args:
        tensor: a dense CPU NDArray with at least one dimension, of dtype bool, uint8, int8,
            int32, int64, float16, float32 or float64.
        name: a name unique among the operations in flight, the same on every rank; default
            ``horovod_allgather.noname.<k>``.
        priority: int; accepted for compatibility, no effect.
        process_set: the ``ProcessSet`` to gather over (default: all ranks).

    Returns:
        mxnet.nd.NDArray of shape ``[sum of every rank's d0] + tensor.shape[1:]``, dtype of
        ``tensor``, on the CPU.

    Raises:
        ValueError: not a dense CPU NDArray, unsupported dtype, a non-int priority, a name
            already in flight, an unregistered process set or this rank not in it.
        HorovodInternalError: ranks disagree on dtype or on a dimension other than 0, the array
            is a scalar, Horovod is not running, or a peer was lost.
    """
    _check_array(tensor, _MOVE_DTYPES, 'allgather')
    _check_priority(priority)
    return _wait(_start_allgather([tensor], name, process_set, grouped=False))[0]


def grouped_allgather(tensors, name=None, priority=0, process_set=global_process_set):
    """Allgather of each NDArray of a list, negotiated and executed together; member ``i`` of
    ``n`` is named ``horovod_allgather.<name>_<i+1>of<n>``.

    Args:
        tensors: a non-empty list of NDArrays, each as for :func:`allgather`.
        name, priority, process_set: as for :func:`allgather`.

    Returns:
        list of NDArrays, one per input, each as :func:`allgather` returns it.

    Raises:
        ValueError, HorovodInternalError: as for :func:`allgather`, or ``tensors`` is not a
            non-empty list.
    """
    _check_arrays(tensors, _MOVE_DTYPES, 'grouped_allgather')
    _check_priority(priority)
    return _wait(_start_allgather(list(tensors), name, process_set, grouped=True))


def _start_broadcast(tensor, output, root_rank, name, process_set):
    """Submits a broadcast of the root's ``tensor`` into ``output`` (``tensor`` itself: in
    place, or a copy of it); returns its handle."""
    if isinstance(root_rank, bool) or not isinstance(root_rank, int):
        raise ValueError(f'root_rank must be an int (a global rank), got {root_rank!r}.')
    set_id = _process_set_id(process_set)
    names = _engine_names('broadcast', name, set_id)
    handle = _ops.broadcast_async([_dlpack.for_write(output)], names, root_rank, set_id,
                                  context=(tensor, output))
    return handle


def broadcast(tensor, root_rank, name=None, priority=0, process_set=global_process_set):
    """The root's ``tensor``, in a new NDArray on every rank.

    Args:
        tensor: a dense CPU NDArray of dtype bool, uint8, int8, int32, int64, float16, float32
            or float64; the same shape and dtype on every rank.
        root_rank: the global rank whose array is sent; it must belong to ``process_set``.
        name: a name unique among the operations in flight, the same on every rank; default
            ``horovod_broadcast.noname.<k>``.
        priority: int; accepted for compatibility, no effect.
        process_set: the ``ProcessSet`` to broadcast within (default: all ranks).

    Returns:
        mxnet.nd.NDArray holding the root's values (on the root, a copy); ``tensor`` is
        unchanged.

    Raises:
        ValueError: not a dense CPU NDArray, unsupported dtype, a root that is not an int or not
            in the set, a non-int priority, a name already in flight, an unregistered process
            set or this rank not in it.
        HorovodInternalError: ranks disagree on shape, dtype or root; Horovod is not running; a
            peer was lost.
    """
    _check_array(tensor, _MOVE_DTYPES, 'broadcast')
    _check_priority(priority)
    output = _copy_of(tensor)
    _wait(_start_broadcast(tensor, output, root_rank, name, process_set))
    return output


def broadcast_(tensor, root_rank, name=None, priority=0, process_set=global_process_set):
    """In-place broadcast: the root's values are written into ``tensor`` on the other ranks
    (the root's array is unchanged); returns ``tensor``.

    Args:
        tensor, root_rank, name, priority, process_set: as for :func:`broadcast`; ``tensor``
            receives the root's values.

    Raises:
        ValueError, HorovodInternalError: as for :func:`broadcast`.
    """
    _check_array(tensor, _MOVE_DTYPES, 'broadcast_')
    _check_priority(priority)
    _wait(_start_broadcast(tensor, tensor, root_rank, name, process_set))
    return tensor


def reduce(tensor, root_rank, name=None, priority=0, op=Average, prescale_factor=1.0,
           postscale_factor=1.0, process_set=global_process_set):
    """The reduction of ``tensor`` over the ranks of ``process_set`` on ``root_rank``, in a new
    NDArray.

    On the root the result is ``postscale_factor * REDUCE_over_ranks(prescale_factor * tensor)``
    (``Average``: the sum divided by the set's size; integer dtypes truncate); on every other rank
    it is a copy of ``tensor``. Every rank must submit the same shape, dtype, op, scale factors
    and root under the same name.

    Args:
        tensor: a dense CPU NDArray of dtype uint8, int8, int32, int64, float16, float32 or
            float64, any shape.
        root_rank: the global rank (int) that receives the reduction; it must belong to the set.
        name: a name unique among the operations in flight, the same on every rank; default: an
            automatic name ``horovod_reduce.noname.<k>``.
        priority: accepted for upstream compatibility; must be an int, otherwise ignored.
        op: ``Average`` (default), ``Sum``, ``Min``, ``Max`` or ``Product`` (not ``Adasum``).
        prescale_factor: factor applied to the input before the reduction.
        postscale_factor: factor applied to the result after the reduction (on the root).
        process_set: the ``ProcessSet`` to reduce over (default: all ranks).

    Raises:
        ValueError: unsupported dtype or context, a root that is not an int or not in the set, an
            unknown op or Adasum, a name in flight, an unregistered process set or this rank not
            in it.
        HorovodInternalError: ranks disagree on shape, dtype, op, scale factors or root; Horovod
            is not running; a peer was lost.
    """
    _check_array(tensor, _REDUCE_DTYPES, 'reduce')
    _check_priority(priority)
    if isinstance(root_rank, bool) or not isinstance(root_rank, int):
        raise ValueError(f'root_rank must be an int (a global rank), got {root_rank!r}.')
    if op not in _REDUCE_OPS:
        raise ValueError(f'reduce supports op=hvd.Average, Sum, Min, Max and Product, got {op!r}.')
    set_id = _process_set_id(process_set)
    output = _empty_like(tensor)
    name, = _engine_names('reduce', name, set_id)
    _wait(_ops.reduce_async(_dlpack.for_read(tensor), _dlpack.for_write(output), name, root_rank, op,
                            float(prescale_factor), float(postscale_factor), set_id, context=(tensor, output)))
    return output


class AlltoallArgumentError(ValueError, mx.base.MXNetError):
    """An alltoall refused at submission (bad splits, dimension 0 not divisible by the set size
    without splits, ...): a ValueError, and an ``mxnet.base.MXNetError`` as MXNet reports it."""


def _splits_list(splits):
    """``splits`` as the engine takes it: None or a list of ints."""
    if splits is None:
        return None
    if isinstance(splits, mx.nd.NDArray):
        if np.dtype(splits.dtype) != np.int32:
            raise ValueError('alltoall splits must be an int32 NDArray (or a list of ints), got '
                             f'dtype {np.dtype(splits.dtype).name}.')
        if splits.context.device_type not in ('cpu', 'cpu_shared'):
            raise ValueError(f'alltoall splits must be on the CPU, got {splits.context}.')
        if splits.ndim != 1:
            raise ValueError(f'alltoall splits must be 1-D, got shape {splits.shape}.')
        return [int(s) for s in splits.asnumpy()]
    if isinstance(splits, (list, tuple)):
        if not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in splits):
            raise ValueError(f'alltoall splits must be ints, got {list(splits)!r}.')
        return [int(s) for s in splits]
    raise ValueError('alltoall splits must be None, a list of ints or an int32 NDArray, '
                     f'got {type(splits).__name__}.')


def alltoall(tensor, splits=None, name=None, priority=0, process_set=global_process_set):
    """Exchange of rows of ``tensor`` among the members of ``process_set``, along dimension 0.

    Member ``k`` of the set receives rows ``[sum(splits[:k]), sum(splits[:k+1]))`` of this
    rank's ``tensor``; the output is the blocks received from every member, concatenated in
    set-rank order. Rows past ``sum(splits)`` are not sent. Members must agree on the dtype and
    on dimensions 1 and up.

    Args:
        tensor: a dense CPU NDArray with at least one dimension, of dtype bool, uint8, int8,
            int32, int64, float16, float32 or float64.
        splits: None (default) to send ``tensor.shape[0] / set size`` rows to every member (the
            division must be exact), or the rows for each member in set-rank order: a list of
            ints or a 1-D int32 CPU NDArray.
        name: a name unique among the operations in flight, the same on every rank; default
            ``horovod_alltoall.noname.<k>``.
        priority: int; accepted for compatibility, no effect.
        process_set: the ``ProcessSet`` to exchange within (default: all ranks).

    Returns:
        ``output`` when ``splits`` is None, else ``(output, received_splits)``: an NDArray of
        shape ``[rows received] + tensor.shape[1:]``, and a 1-D int32 CPU NDArray with the rows
        received from each member.

    Raises:
        ValueError: not a dense CPU NDArray, unsupported dtype, a non-int priority.
        AlltoallArgumentError (a ValueError and an mxnet.base.MXNetError): splits that are not
            ints or an int32 CPU NDArray, of the wrong length, summing past dimension 0, or
            (without splits) dimension 0 not divisible by the set size; a name already in
            flight, an unregistered process set or this rank not in it.
        HorovodInternalError: members disagree on dtype or dimensions 1 and up; Horovod is not
            running; a peer was lost.
    """
    _check_array(tensor, _MOVE_DTYPES, 'alltoall')
    _check_priority(priority)
    try:
        engine_splits = _splits_list(splits)
        set_id = _process_set_id(process_set)
        [engine_name] = _engine_names('alltoall', name, set_id)
        handle = _ops.alltoall_async(_dlpack.for_read(tensor), engine_splits, engine_name, set_id,
                                     context=tensor)
    except ValueError as error:
        if isinstance(error, AlltoallArgumentError):
            raise
        raise AlltoallArgumentError(str(error)) from None
    output, received_splits = _wait(handle)
    return output if splits is None else (output, received_splits)


def _start_reducescatter(tensors, name, op, process_set, prescale_factor, postscale_factor,
                         grouped):
    if op not in (Average, Sum):
        raise UnsupportedOpError(f'reducescatter supports op=Average and op=Sum only, got '
                                 f'{op!r}.')
    for t in tensors:
        if t.ndim == 0:
            raise ValueError('reducescatter needs arrays with at least one dimension (it '
                             'splits dimension 0), got a scalar.')
    set_id = _process_set_id(process_set)
    names = _engine_names('reducescatter', name, set_id, len(tensors) if grouped else None)
    handle = _ops.reducescatter_async([_dlpack.for_read(t) for t in tensors], names, op,
                                      float(prescale_factor), float(postscale_factor), set_id,
                                      context=tuple(tensors))
    return handle


def reducescatter(tensor, op=Average, name=None, priority=0, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """This rank's block of the reduction of ``tensor`` over the ranks of ``process_set``.

    The element-wise ``postscale_factor * SUM_ranks(prescale_factor * tensor)`` (divided by the
    set size for ``Average``) is split along dimension 0: member ``r`` of ``n`` gets
    ``d0 // n + (1 if r < d0 % n else 0)`` rows, after the rows of the members before it.

    Args:
        tensor: a dense CPU NDArray with at least one dimension, of dtype int32, int64,
            float16, float32 or float64; the same shape on every rank.
        op: ``Average`` (default) or ``Sum``.
        name: a name unique among the operations in flight, the same on every rank; default
            ``horovod_reducescatter.noname.<k>``.
        priority: int; accepted for compatibility, no effect.
        process_set: the ``ProcessSet`` to reduce over (default: all ranks).
        prescale_factor: factor applied to the input before the reduction.
        postscale_factor: factor applied to the result after the reduction.

    Returns:
        mxnet.nd.NDArray of shape ``[rows of this member] + tensor.shape[1:]``, on the CPU.

    Raises:
        ValueError: a scalar, not a dense CPU NDArray, unsupported dtype, a non-int priority, a
            name already in flight, an unregistered process set or this rank not in it.
        UnsupportedOpError: ``op`` other than ``Average`` and ``Sum`` (a ``ValueError`` and an
            ``AssertionError``).
        HorovodInternalError: ranks disagree on shape, dtype or scale factors; Horovod is not
            running; a peer was lost.
    """
    _check_array(tensor, _REDUCESCATTER_DTYPES, 'reducescatter')
    _check_priority(priority)
    return _wait(_start_reducescatter([tensor], name, op, process_set, prescale_factor,
                                      postscale_factor, grouped=False))[0]


def grouped_reducescatter(tensors, op=Average, name=None, priority=0,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """Reducescatter of each NDArray of a list, negotiated and executed together; member ``i``
    of ``n`` is named ``horovod_reducescatter.<name>_<i+1>of<n>``.

    Args:
        tensors: a non-empty list of NDArrays, each as for :func:`reducescatter`.
        op, name, priority, process_set, prescale_factor, postscale_factor: as for
            :func:`reducescatter`.

    Returns:
        list of NDArrays, one per input, each as :func:`reducescatter` returns it.

    Raises:
        ValueError, UnsupportedOpError, HorovodInternalError: as for :func:`reducescatter`
            (any scalar in the list raises ``ValueError``), or ``tensors`` is not a non-empty
            list.
    """
    _check_arrays(tensors, _REDUCESCATTER_DTYPES, 'grouped_reducescatter')
    _check_priority(priority)
    return _wait(_start_reducescatter(list(tensors), name, op, process_set, prescale_factor,
                                      postscale_factor, grouped=True))
