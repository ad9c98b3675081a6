"""Collective operations on TensorFlow tensors, over the horovod-core engine.

Each function works eagerly and inside ``tf.function`` or a TF1 graph. Eagerly it submits the
tensors and waits at once. In a graph it adds two nodes per call that each call Python once: a
``tf.numpy_function`` that submits the whole group of tensors, and one that waits for it (in a
TF1 graph without holding an inter-op thread; see ``_engine``), so one Python op per group
reaches the engine, several groups can be in flight together, and a graph run of any number of
independent collectives completes with any number of inter-op threads.

XLA: the engine is reached through Python, which XLA cannot compile; building any of these ops
inside ``tf.function(jit_compile=True)`` raises ``ValueError``.

Names: tensors are matched across ranks by name. In a graph, an unnamed op is named
``Horovod<Op>_<tensor name>`` (``_normalize_name``), made unique in its graph with the current
name scope, as TF names nodes; ``name`` replaces the ``Horovod<Op>_<tensor name>`` part, and
``ignore_name_scope=True`` drops the scope. Eagerly, an unnamed op is named after a per-op,
per-process-set counter (horovod.common.ops' automatic names, ``<op>.noname.<k>``), so the ranks
must issue their unnamed ops in the same order.

Errors: bad arguments (dtype, type, root, splits, op) raise ``ValueError`` (in a graph: when the
op is built, or ``tf.errors.InvalidArgumentError`` when it runs). Ranks that disagree on shape,
dtype, op or root raise ``tf.errors.FailedPreconditionError`` on every rank; a shutdown or a lost
peer raises ``tf.errors.UnknownError``. The types are the same eagerly, in ``tf.function`` and in
TF1 graphs (``_status_op`` carries them out of the graph's Python calls); the message names the
failed op (``HorovodAllreduce``, ...) and the engine's reason. Eagerly these errors are also
``HorovodInternalError`` (engine failures) or ``ValueError`` (refused arguments).
"""

import os
import re

import numpy as np
import tensorflow as tf

from horovod.common import dtypes as _dtypes
from horovod.common import ops as _ops
from horovod.common.api import *  # noqa: F403 (hvd.size, hvd.Average, hvd.ProcessSet, ...: api.__all__)
from horovod.common.api import (  # noqa: F401 (used here, or exported by horovod.tensorflow only)
    Adasum, Average, Max, Min, ProcessSet, Product, Sum, basics as _basics, global_process_set,
    handle_average_backwards_compatibility, is_homogeneous, is_initialized, local_rank, local_size, rank, size,
)
from horovod.common.process_sets import (  # noqa: F401 (_temp_process_set_object: as upstream's mpi_ops)
    _registered_id as _registered_process_set_id,
    _temp_process_set_object,
    check_adasum_process_set,
)
from horovod.tensorflow import _engine
from horovod.tensorflow.util import _no_autograph


def _process_set_id(process_set):
    """The id of a registered ``process_set``; otherwise tf.errors.InvalidArgumentError (also
    ValueError)."""
    try:
        return _registered_process_set_id(process_set)
    except ValueError as error:
        raise _engine.invalid_argument(str(error)) from None

# bfloat16 joins the lists upstream Horovod had: its tensors go to the engine without a copy
# (eager ones through DLPack, graph ones as numpy arrays whose bits the engine reads in place).
_ALLREDUCE_DTYPES = _dtypes.of(tf, 'uint8 int8 int32 int64 float16 float32 float64 bfloat16')
_MOVE_DTYPES = _ALLREDUCE_DTYPES + _dtypes.of(tf, 'uint16 int16 bool')
_REDUCESCATTER_DTYPES = _dtypes.of(tf, 'int32 int64 float16 float32 float64 bfloat16')
_REDUCE_OPS = (Average, Sum, Min, Max, Product)


def init(*args, **kwargs):
    """Starts Horovod in this process. Starting the engine drops the handles of an earlier run
    and restarts the automatic names.

    Args:
        *args: ``comm`` and ``process_sets``, as ``horovod.common.basics.HorovodBasics.init``
            takes them: ``comm`` None for every process of the job; ``process_sets`` None, a
            list of ``ProcessSet`` objects (the same list on every rank) or ``"dynamic"``.
        **kwargs: the same, by name.

    Raises:
        ValueError: the engine cannot start (the message says why: an invalid HOROVOD_*
            variable, a rendezvous timeout, a duplicate process set).
    """
    return _basics.init(*args, **kwargs)


def shutdown(*args, **kwargs):
    """Stops Horovod in this process; pending operations on every rank fail. Safe when Horovod
    is not running; ``init()`` may be called again afterwards.

    Args:
        *args: upstream's signature; ``HorovodBasics.shutdown`` takes no argument, so any
            raises ``TypeError``.
        **kwargs: the same.
    """
    return _basics.shutdown(*args, **kwargs)


def _normalize_name(name):
    """``name`` with every character outside ``[a-zA-Z0-9_]`` replaced by ``_``."""
    return re.sub('[^a-zA-Z0-9_]', '_', name)


def _executing_eagerly():
    return tf.executing_eagerly()


def _check_not_xla(op_name):
    from tensorflow.python.ops import control_flow_util
    if control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
        raise ValueError(
            f'{op_name} cannot be compiled with XLA: horovod.tensorflow reaches its engine through '
            'Python (tf.numpy_function), which tf.function(jit_compile=True) does not support. '
            'Use tf.function without jit_compile for the step that calls Horovod (with Keras: '
            'model.compile(..., jit_compile=False)).')



def _to_tensor(value, op_name):
    if isinstance(value, tf.IndexedSlices):
        raise ValueError(f'{op_name} expects a dense tf.Tensor, got tf.IndexedSlices '
                         '(only allreduce takes IndexedSlices).')
    try:
        return tf.convert_to_tensor(value)
    except (TypeError, ValueError) as error:
        raise ValueError(f'{op_name} expects a tf.Tensor or a value convertible to one, got '
                         f'{type(value).__name__}: {error}') from None


def _check_dtype(tensor, allowed, op_name):
    # Strings in particular must never reach the engine: they have no DLPack form.
    if tensor.dtype not in allowed:
        names = ', '.join(d.name for d in allowed)
        raise ValueError(f'{op_name} does not support dtype {tensor.dtype.name}; supported dtypes: {names}.')


def check_num_rank_power_of_2(num_rank):
    """Whether ``num_rank`` is a positive power of 2."""
    return num_rank > 0 and (num_rank & (num_rank - 1)) == 0


def _check_reduce_op(op, process_set, op_name):
    if op == Adasum:
        check_adasum_process_set(process_set, op_name)
        if not check_num_rank_power_of_2(size()):
            raise NotImplementedError(f'{op_name} with op=Adasum needs a power-of-2 number of ranks; '
                                      f'non-power-of-2 ranks ({size()}) are unsupported.')
        return
    if op not in _REDUCE_OPS:
        raise ValueError(f'Unknown reduce op {op!r}; expected one of hvd.Average, hvd.Sum, hvd.Min, '
                         'hvd.Max, hvd.Product, hvd.Adasum.')


def _names(prefix, title, tensors, name, set_id, ignore_name_scope):
    """The engine names of one group (see the module docstring): a group of several tensors
    gives member ``i`` of ``n`` the name ``<base>_<i+1>of<n>``."""
    count = None if len(tensors) == 1 else len(tensors)
    if tf.executing_eagerly():
        return _ops.op_names(prefix, name, set_id, count)
    if name is None:
        name = f'{title}_{_normalize_name(tensors[0].name)}'
    full = tf.compat.v1.get_default_graph().unique_name(name)
    return _ops.member_names(full.rsplit('/', 1)[-1] if ignore_name_scope else full, count)


class _Started:
    """A submitted group: an int handle (eager), or the outputs of a graph's start node (handle,
    status code, message: ``_engine.start_node``)."""

    def __init__(self, kind, handle, tensors, out_dtypes, out_shapes):
        self.kind = kind
        self.handle = handle
        self.tensors = tensors
        self.out_dtypes = out_dtypes
        self.out_shapes = out_shapes


def _start(kind, tensors, names, params, out_dtypes, out_shapes):
    """Submits ``tensors`` as one group; see ``_engine.start``. ``out_dtypes``/``out_shapes``
    describe what ``_finish`` returns (shapes may have unknown dimensions)."""
    if tf.executing_eagerly():
        # Eager tensors go to the engine as they are: it reads them in place through DLPack.
        handle = _engine.start(kind, list(tensors), names, params)
        return _Started(kind, handle, tensors, out_dtypes, out_shapes)
    _check_not_xla(_engine._op_title(kind))

    def submit(*arrays):
        return np.int64(_engine.start(kind, list(arrays), names, params))

    handle = _engine.start_node(submit, list(tensors), f'{_engine._op_title(kind)}Start')
    return _Started(kind, handle, tensors, out_dtypes, out_shapes)


@_no_autograph
def _finish(started):
    """Waits for a group started by ``_start``; returns its output tensors (a list)."""
    if tf.executing_eagerly():
        arrays = _engine.finish(started.handle)
        return [tf.convert_to_tensor(a, dtype=d) for a, d in zip(arrays, started.out_dtypes, strict=True)]
    outputs = _engine.blocking_node(_engine.finish_started, started.handle, started.out_dtypes,
                                    f'{_engine._op_title(started.kind)}Wait')
    for out, shape in zip(outputs, started.out_shapes, strict=True):
        out.set_shape(shape)
    return outputs


def _run(kind, tensors, names, params, out_dtypes, out_shapes):
    return _finish(_start(kind, tensors, names, params, out_dtypes, out_shapes))


try:
    from tensorflow.python.eager.record import could_possibly_record as _could_record
except ImportError:  # another TF layout: always go through tf.custom_gradient
    _could_record = None


def _differentiable(fn):
    """``tf.custom_gradient(fn)``, except eagerly while no gradient tape is recording: then no
    gradient can ever be asked for, and ``fn``'s outputs are returned without custom_gradient's
    bookkeeping (which costs as much as a small collective)."""
    wrapped = tf.custom_gradient(fn)

    def call(*args):
        if _could_record is not None and tf.executing_eagerly() and not _could_record():
            return fn(*args)[0]
        return wrapped(*args)

    return call


def _prepare(tensors, allowed, op_name):
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise ValueError(f'{op_name} expects a non-empty list of tensors, got {type(tensors).__name__}.')
    out = [_to_tensor(t, op_name) for t in tensors]
    for t in out:
        _check_dtype(t, allowed, op_name)
    return out


def _allreduce_group(tensors, names_arg, op, prescale_factor, postscale_factor, ignore_name_scope,
                     process_set, grouped):
    op_name = 'grouped_allreduce' if grouped else 'allreduce'
    tensors = _prepare(tensors, _ALLREDUCE_DTYPES, op_name)
    _check_reduce_op(op, process_set, op_name)
    set_id = _process_set_id(process_set)
    prescale_factor, postscale_factor = float(prescale_factor), float(postscale_factor)

    @_differentiable
    def forward(*xs):
        names = _names(op_name, 'HorovodAllreduce', xs, names_arg, set_id, ignore_name_scope)
        params = {'set_id': set_id, 'op': op, 'prescale': prescale_factor, 'postscale': postscale_factor}
        outputs = _run('allreduce', xs, names, params, [x.dtype for x in xs], [x.shape for x in xs])

        def grad(*dys):
            # d(REDUCE)/dx for Sum/Average is the same reduction of the incoming gradients.
            dys = [tf.zeros_like(x) if dy is None else dy for x, dy in zip(xs, dys, strict=True)]
            return _allreduce_group(dys, None, op, prescale_factor, postscale_factor, False, process_set,
                                    grouped)

        return outputs, grad

    return list(forward(*tensors))


@_no_autograph
def _allreduce_start(tensors, name, op, prescale_factor, postscale_factor, process_set, ignore_name_scope=False):
    """Submits dense ``tensors`` as one allreduce group and returns at once; ``_finish`` of the
    result waits and returns the reduced tensors. Not differentiable: gradient reduction uses it
    to have every group in flight before waiting for the first."""
    tensors = _prepare(tensors, _ALLREDUCE_DTYPES, 'grouped_allreduce')
    _check_reduce_op(op, process_set, 'grouped_allreduce')
    set_id = _process_set_id(process_set)
    names = _names('grouped_allreduce', 'HorovodAllreduce', tensors, name, set_id, ignore_name_scope)
    params = {'set_id': set_id, 'op': op, 'prescale': float(prescale_factor), 'postscale': float(postscale_factor)}
    return _start('allreduce', tensors, names, params, [t.dtype for t in tensors], [t.shape for t in tensors])


@_no_autograph
def _allreduce(tensor, name=None, op=Sum, prescale_factor=1.0, postscale_factor=1.0, ignore_name_scope=False,
               process_set=global_process_set):
    """Raw allreduce of a dense tensor (default op Sum); differentiable (the gradient is the
    same allreduce of the incoming gradient).

    Returns ``postscale_factor * REDUCE_ranks(prescale_factor * tensor)``, shape and dtype of
    ``tensor``. Dtypes: uint8, int8, int32, int64, float16, bfloat16, float32, float64. Errors: see the
    module docstring.
    """
    return _allreduce_group([tensor], name, op, prescale_factor, postscale_factor, ignore_name_scope,
                            process_set, grouped=False)[0]


@_no_autograph
def _grouped_allreduce(tensors, name=None, op=Sum, prescale_factor=1.0, postscale_factor=1.0,
                       ignore_name_scope=False, process_set=global_process_set):
    """Raw allreduce of a list of dense tensors submitted as one group (fused by the engine);
    returns a list. Differentiable. As ``_allreduce`` otherwise."""
    return _allreduce_group(tensors, name, op, prescale_factor, postscale_factor, ignore_name_scope,
                            process_set, grouped=True)


def _gather_offsets(dim0s, process_set):
    """Where this rank's rows start in each gathered tensor: the sum of each entry of ``dim0s``
    over the set members before this rank (int64 tensor of len(dim0s))."""
    local = tf.reshape(tf.stack([tf.cast(d, tf.int64) for d in dim0s]), [1, -1])
    every = allgather(local, process_set=process_set)
    set_rank = _set_rank_op(process_set)
    return tf.reduce_sum(every[:set_rank], axis=0)


def _set_rank_op(process_set):
    set_id = process_set.process_set_id
    if tf.executing_eagerly():
        return process_set.rank()
    return tf.numpy_function(lambda: np.int32(_basics._process_set_rank(set_id)), [], tf.int32, stateful=True)


def _allgather_group(tensors, name, ignore_name_scope, process_set, grouped):
    op_name = 'grouped_allgather' if grouped else 'allgather'
    tensors = _prepare(tensors, _MOVE_DTYPES, op_name)
    for t in tensors:
        if t.shape.rank == 0:
            raise ValueError(f'{op_name} needs tensors with at least one dimension, got a scalar.')
    set_id = _process_set_id(process_set)

    @_differentiable
    def forward(*xs):
        names = _names(op_name, 'HorovodAllgather', xs, name, set_id, ignore_name_scope)
        shapes = [tf.TensorShape([None]).concatenate(x.shape[1:]) for x in xs]
        outputs = _run('allgather', xs, names, {'set_id': set_id}, [x.dtype for x in xs], shapes)

        def grad(*dys):
            dys = [tf.zeros_like(y) if dy is None else dy for y, dy in zip(outputs, dys, strict=True)]
            reduced = _allreduce_group(dys, None, Average, 1.0, 1.0, False, process_set, grouped=True)
            dim0s = [tf.shape(x, out_type=tf.int64)[0] for x in xs]
            offsets = _gather_offsets(dim0s, process_set)
            return [g[offsets[i]:offsets[i] + dim0s[i]] for i, g in enumerate(reduced)]

        return outputs, grad

    return list(forward(*tensors))


@_no_autograph
def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Concatenates every rank's ``tensor`` along dimension 0, in set-rank order.

    Args:
        tensor: a tensor with at least one dimension, of dtype uint8, int8, uint16, int16, int32,
            int64, float16, bfloat16, float32, float64 or bool. Dimension 0 may differ between ranks; the
            others and the dtype must agree.
        name, ignore_name_scope: the engine name (module docstring).
        process_set: the ``ProcessSet`` to gather over.

    Returns:
        tf.Tensor of shape ``[sum of the ranks' dim 0] + tensor.shape[1:]``. Differentiable: the
        gradient is this rank's rows of the average over ranks of the incoming gradient.

    Raises:
        ValueError: a scalar, an unsupported dtype (strings included), an unregistered set.
        tf.errors.FailedPreconditionError: ranks disagree on dtype or trailing dimensions.
    """
    return _allgather_group([tensor], name, ignore_name_scope, process_set, grouped=False)[0]


@_no_autograph
def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=global_process_set):
    """:func:`allgather` of a list of tensors, submitted to the engine as one group.

    Args:
        tensors: a list of tensors, each as :func:`allgather` takes it (dtypes and shapes may
            differ between the entries; dimension 0 may differ between ranks).
        name, ignore_name_scope: the group's engine name (see the module's docstring).
        process_set: the ``ProcessSet`` to gather over.

    Returns:
        A list of the gathered tensors, in input order.

    Raises:
        ValueError: as for :func:`allgather`, for any entry.
    """
    return _allgather_group(tensors, name, ignore_name_scope, process_set, grouped=True)


def _check_root(root_rank):
    if isinstance(root_rank, bool) or not isinstance(root_rank, (int, np.integer)):
        raise ValueError(f'root_rank must be an int (a global rank), got {root_rank!r}.')
    return int(root_rank)


def _broadcast_group(tensors, root_rank, name, ignore_name_scope, process_set):
    tensors = _prepare(tensors, _MOVE_DTYPES, 'broadcast')
    root_rank = _check_root(root_rank)
    set_id = _process_set_id(process_set)

    @_differentiable
    def forward(*xs):
        names = _names('broadcast', 'HorovodBroadcast', xs, name, set_id, ignore_name_scope)
        outputs = _run('broadcast', xs, names, {'set_id': set_id, 'root': root_rank},
                       [x.dtype for x in xs], [x.shape for x in xs])

        def grad(*dys):
            dys = [tf.zeros_like(x) if dy is None else dy for x, dy in zip(xs, dys, strict=True)]
            reduced = _allreduce_group(dys, None, Average, 1.0, 1.0, False, process_set, grouped=True)
            is_root = tf.cast(tf.equal(_rank_value(), root_rank), reduced[0].dtype)
            return [g * tf.cast(is_root, g.dtype) for g in reduced]

        return outputs, grad

    return list(forward(*tensors))


def _rank_value():
    return rank() if tf.executing_eagerly() else rank_op()


@_no_autograph
def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=global_process_set):
    """The root's ``tensor`` on every rank of ``process_set``.

    Args:
        tensor: same shape and dtype on every rank; dtypes as for ``allgather``.
        root_rank: global rank (int) whose tensor is sent; it must belong to the set.
        name, ignore_name_scope: the engine name (module docstring).
        process_set: the ``ProcessSet`` to broadcast within.

    Returns:
        tf.Tensor with the root's values. Differentiable: the root's gradient is the average over
        ranks of the incoming gradients, the other ranks' gradient is zero.

    Raises:
        ValueError: root_rank not an int, unsupported dtype, unregistered set; the root not in the
            set (eager; in a graph ``tf.errors.InvalidArgumentError`` at run time).
        tf.errors.FailedPreconditionError: ranks disagree on shape, dtype or root.
    """
    return _broadcast_group([tensor], root_rank, name, ignore_name_scope, process_set)[0]


@_no_autograph
def reduce(tensor, root_rank, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,
           ignore_name_scope=False, process_set=global_process_set):
    """The reduction of ``tensor`` over the ranks of ``process_set``, on ``root_rank``.

    On the root the result is ``postscale_factor * REDUCE_over_ranks(prescale_factor * tensor)``
    (``Average``: the sum divided by the set's size; integer dtypes truncate); on every other rank
    it is ``tensor``'s value unchanged. Every rank must submit the same shape, dtype, op, scale
    factors and root.

    Args:
        tensor: a dense tensor of dtype uint8, int8, int32, int64, float16, bfloat16, float32 or float64, any
            shape.
        root_rank: global rank (int) that receives the reduction; it must belong to the set.
        name, ignore_name_scope: the engine name (module docstring).
        op: ``Average`` (default), ``Sum``, ``Min``, ``Max`` or ``Product`` (not ``Adasum``).
        prescale_factor: factor applied to the input before the reduction.
        postscale_factor: factor applied to the result after the reduction (on the root).
        process_set: the ``ProcessSet`` to reduce over.

    Returns:
        tf.Tensor of ``tensor``'s shape and dtype. Not differentiable.

    Raises:
        ValueError: root_rank not an int, an unknown op or Adasum, unsupported dtype, unregistered
            set; the root not in the set (eager; in a graph ``tf.errors.InvalidArgumentError`` at
            run time).
        tf.errors.FailedPreconditionError: ranks disagree on shape, dtype, op, scale factors or root.
    """
    tensors = _prepare([tensor], _ALLREDUCE_DTYPES, 'reduce')
    root_rank = _check_root(root_rank)
    if op not in _REDUCE_OPS:
        raise ValueError(f'reduce supports op=hvd.Average, Sum, Min, Max and Product, got {op!r}.')
    set_id = _process_set_id(process_set)
    names = _names('reduce', 'HorovodReduce', tensors, name, set_id, ignore_name_scope)
    params = {'set_id': set_id, 'op': op, 'prescale': float(prescale_factor), 'postscale': float(postscale_factor),
              'root': root_rank}
    return _run('reduce', tensors, names, params, [tensors[0].dtype], [tensors[0].shape])[0]


def _variable_kind(variable):
    if isinstance(variable, tf.Variable) and hasattr(variable, 'handle'):
        return 'resource'
    if isinstance(variable, tf.Variable):
        return 'ref'
    raise ValueError(f'broadcast_ expects tf.Variable objects, got {type(variable).__name__}.')


@_no_autograph
def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Broadcasts the root's values into ``variables`` on every rank (one group).

    Args:
        variables: a tf.Variable or a list of them, all resource variables or all ref variables.
        root_rank, name, process_set: as for ``broadcast``.

    Returns:
        The updated values: a tensor for one variable, else a list (in a graph, the values after
        the assignment ran).

    Raises:
        ValueError: a mix of resource and ref variables, or a non-variable; as ``broadcast``.
    """
    single = not isinstance(variables, (list, tuple))
    variables = [variables] if single else list(variables)
    if not variables:
        raise ValueError('broadcast_ expects at least one variable.')
    kinds = {_variable_kind(v) for v in variables}
    if len(kinds) > 1:
        raise ValueError('broadcast_ expects all variables to be resource variables or all to be ref '
                         'variables, got a mix.')
    values = _broadcast_group([v.read_value() if hasattr(v, 'read_value') else v for v in variables],
                              root_rank, name, False, process_set)
    updated = [v.assign(value) for v, value in zip(variables, values, strict=True)]
    if not tf.executing_eagerly():
        updated = [tf.convert_to_tensor(u) for u in updated]
    else:
        updated = [v.read_value() for v in variables]
    return updated[0] if single else updated


def _splits_array(splits):
    if splits is None:
        return None
    if isinstance(splits, (list, tuple)) and all(isinstance(s, (int, np.integer)) and not isinstance(s, bool)
                                                 for s in splits):
        return tf.constant(list(splits), dtype=tf.int32)
    splits = _to_tensor(splits, 'alltoall')
    if splits.dtype not in (tf.int32, tf.int64):
        raise _engine.invalid_argument(
            f'alltoall splits must be int32 (or a list of ints), got dtype {splits.dtype.name}.')
    if splits.shape.rank is not None and splits.shape.rank != 1:
        raise _engine.invalid_argument(f'alltoall splits must be a 1-D tensor, got shape {splits.shape}.')
    return tf.cast(splits, tf.int32)


def _alltoall_raw(tensor, splits, name, ignore_name_scope, process_set, set_id):
    names = _names('alltoall', 'HorovodAlltoall', [tensor], name, set_id, ignore_name_scope)
    given = splits is not None
    inputs = [tensor, splits if given else tf.zeros([0], tf.int32)]
    out_shape = tf.TensorShape([None]).concatenate(tensor.shape[1:])
    if tf.executing_eagerly():
        params = {'set_id': set_id, 'splits': splits.numpy() if given else None}
        handle = _engine.start('alltoall', [tensor], names, params)
        out, received = _engine.finish(handle)
        return tf.convert_to_tensor(out, dtype=tensor.dtype), tf.convert_to_tensor(received, dtype=tf.int32)
    _check_not_xla('HorovodAlltoall')

    def submit(array, splits_array):
        params = {'set_id': set_id, 'splits': splits_array if given else None}
        return np.int64(_engine.start('alltoall', [array], names, params))

    handle = _engine.start_node(submit, inputs, 'HorovodAlltoallStart')
    out, received = _engine.blocking_node(_engine.finish_started, handle, [tensor.dtype, tf.int32],
                                          'HorovodAlltoallWait')
    out.set_shape(out_shape)
    received.set_shape([None])
    return out, received


@_no_autograph
def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Sends rows of ``tensor`` to every member of ``process_set`` and receives theirs.

    Member ``k`` receives rows ``[sum(splits[:k]), sum(splits[:k+1]))``; rows past ``sum(splits)``
    are not sent.

    Args:
        tensor: at least one dimension; dtypes as for ``allgather``; dimensions 1.. and the dtype
            agree across ranks.
        splits: None (``tensor.shape[0] / set size`` rows to each member; dim 0 must divide), or
            one row count per member: a list of ints or a 1-D int32 tensor.
        name, ignore_name_scope, process_set: as for ``allgather``.

    Returns:
        ``output`` when ``splits`` is None, else ``(output, received_splits)``: the received rows
        in sender order, shape ``[rows received] + tensor.shape[1:]``, and a 1-D int32 tensor of
        the rows received from each member. Differentiable in ``tensor`` (the gradient travels
        back with the received splits; unsent rows get zero).

    Raises:
        ValueError: a scalar, bad dtype, bad splits (eager; in a graph InvalidArgumentError).
        tf.errors.FailedPreconditionError: ranks disagree on dtype or trailing dimensions.
    """
    tensor = _prepare([tensor], _MOVE_DTYPES, 'alltoall')[0]
    if tensor.shape.rank == 0:
        raise ValueError('alltoall needs a tensor with at least one dimension, got a scalar.')
    set_id = _process_set_id(process_set)
    splits_t = _splits_array(splits)

    @_differentiable
    def forward(x):
        out, received = _alltoall_raw(x, splits_t, name, ignore_name_scope, process_set, set_id)

        def grad(dy, _unused=None):
            dy = tf.zeros_like(out) if dy is None else dy
            back, _ = _alltoall_raw(dy, received, None, False, process_set, set_id)
            missing = tf.shape(x)[0] - tf.shape(back)[0]
            pad = tf.zeros(tf.concat([[missing], tf.shape(x)[1:]], 0), dtype=back.dtype)
            return tf.concat([back, pad], 0)

        return (out, tf.stop_gradient(received)), grad

    output, received_splits = forward(tensor)
    return output if splits is None else (output, received_splits)


def _reducescatter_group(tensors, name, op, ignore_name_scope, process_set, prescale_factor, postscale_factor,
                         grouped):
    op_name = 'grouped_reducescatter' if grouped else 'reducescatter'
    tensors = _prepare(tensors, _REDUCESCATTER_DTYPES, op_name)
    if op not in (Average, Sum):
        raise ValueError(f'{op_name} supports op=hvd.Average and op=hvd.Sum only, got {op!r}.')
    for t in tensors:
        if t.shape.rank == 0:
            raise ValueError(f'{op_name} needs tensors with at least one dimension, got a scalar.')
    set_id = _process_set_id(process_set)
    prescale_factor, postscale_factor = float(prescale_factor), float(postscale_factor)

    @_differentiable
    def forward(*xs):
        names = _names(op_name, 'HorovodReducescatter', xs, name, set_id, ignore_name_scope)
        shapes = [tf.TensorShape([None]).concatenate(x.shape[1:]) for x in xs]
        params = {'set_id': set_id, 'op': op, 'prescale': prescale_factor, 'postscale': postscale_factor}
        outputs = _run('reducescatter', xs, names, params, [x.dtype for x in xs], shapes)

        def grad(*dys):
            dys = [tf.zeros_like(y) if dy is None else dy for y, dy in zip(outputs, dys, strict=True)]
            gathered = _allgather_group(dys, None, False, process_set, grouped=True)
            # The allgather of the incoming gradient, times the set size for Sum and times the
            # scale factors (spec tensorflow_keras.md §1.2: as in torch).
            n = tf.cast(_set_size_value(process_set), gathered[0].dtype) if op == Sum else 1
            return [g * tf.cast(n, g.dtype) * tf.cast(prescale_factor * postscale_factor, g.dtype)
                    for g in gathered]

        return outputs, grad

    return list(forward(*tensors))


def _set_size_value(process_set):
    if tf.executing_eagerly():
        return process_set.size()
    return size_op(process_set.process_set_id)


@_no_autograph
def _reducescatter(tensor, name=None, op=Sum, ignore_name_scope=False, process_set=global_process_set,
                   prescale_factor=1.0, postscale_factor=1.0):
    """Raw reducescatter (default op Sum): the reduction of every rank's ``tensor`` split along
    dimension 0, member ``r`` receiving ``dim0 // n + (r < dim0 % n)`` rows.

    Dtypes int32, int64, float16, bfloat16, float32, float64; ``op`` Average or Sum (else ValueError).
    Differentiable (allgather of the incoming gradient, times the set size for Sum, times the
    scale factors). Errors: module docstring.
    """
    return _reducescatter_group([tensor], name, op, ignore_name_scope, process_set, prescale_factor,
                                postscale_factor, grouped=False)[0]


@_no_autograph
def _grouped_reducescatter(tensors, name=None, op=Sum, ignore_name_scope=False, process_set=global_process_set,
                           prescale_factor=1.0, postscale_factor=1.0):
    """Raw reducescatter of a list of tensors as one group; returns a list."""
    return _reducescatter_group(tensors, name, op, ignore_name_scope, process_set, prescale_factor,
                                postscale_factor, grouped=True)


@_no_autograph
def join():
    """Tells the engine this rank has no more data, and waits until every rank has joined.

    Until then this rank contributes zeros to the allreduces of the others. Returns an int32
    scalar tensor: the global rank that joined last. In a graph the join happens when the op runs.
    """
    if tf.executing_eagerly():
        return tf.constant(_engine.join(), dtype=tf.int32)
    _check_not_xla('HorovodJoin')
    # Off the inter-op threads like every wait (see _engine): the join returns only once every
    # rank has joined, and until then this rank's other collectives must still be submitted.
    # (A tf.data element needs at least one component: the node takes a dummy input.)
    out, = _engine.blocking_node(lambda _: [np.int32(_engine.join())], [tf.zeros([], tf.int32)], [tf.int32],
                                 'HorovodJoin')
    out.set_shape([])
    return out


def _runtime_int(fn, name, default_name):
    if tf.executing_eagerly():
        return tf.constant(fn(), dtype=tf.int32)
    _check_not_xla(default_name)
    out = tf.numpy_function(lambda: np.int32(fn()), [], tf.int32, stateful=True, name=name or default_name)
    out.set_shape([])
    return out


@_no_autograph
def size_op(process_set_id=0, name=None):
    """int32 scalar tensor: the number of ranks of the process set, read when the op runs (it
    follows re-initialisation in elastic mode). Not differentiable.

    Args:
        process_set_id (int): the set's id (``ProcessSet.process_set_id``); 0 is the global set.
        name (str): the TensorFlow op's name; None for a default.
    """
    return _runtime_int(lambda: _basics._process_set_size(process_set_id), name, 'HorovodSize')


@_no_autograph
def local_size_op(name=None):
    """int32 scalar tensor: the number of ranks on this host, read when the op runs.

    Args:
        name (str): the TensorFlow op's name; None for a default.
    """
    return _runtime_int(local_size, name, 'HorovodLocalSize')


@_no_autograph
def rank_op(name=None):
    """int32 scalar tensor: this process's global rank, read when the op runs.

    Args:
        name (str): the TensorFlow op's name; None for a default.
    """
    return _runtime_int(rank, name, 'HorovodRank')


@_no_autograph
def local_rank_op(name=None):
    """int32 scalar tensor: this process's rank on its host, read when the op runs.

    Args:
        name (str): the TensorFlow op's name; None for a default.
    """
    return _runtime_int(local_rank, name, 'HorovodLocalRank')


def _process_set_included(process_set_id):
    if not is_initialized():
        return _basics.HOROVOD_PROCESS_SET_ERROR_INIT
    ids = _basics._get_process_set_ids_and_ranks()
    if process_set_id not in ids:
        return _basics.HOROVOD_PROCESS_SET_ERROR_UNKNOWN_SET
    return int(rank() in ids[process_set_id])


@_no_autograph
def process_set_included_op(process_set_id=0, name=None):
    """int32 scalar tensor, evaluated when the op runs: 1 if this rank belongs to the process set,
    0 if not, -1 if Horovod is not initialised, -3 if the set is unknown.

    Args:
        process_set_id (int): the set's id (``ProcessSet.process_set_id``); 0 is the global set.
        name (str): the TensorFlow op's name; None for a default.
    """
    return _runtime_int(lambda: _process_set_included(process_set_id), name, 'HorovodProcessSetIncluded')


def _elastic():
    return os.environ.get('HOROVOD_ELASTIC') == '1'
