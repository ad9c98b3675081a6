"""Collective operations on torch tensors, over the horovod-core engine.

Every collective comes in an asynchronous form that submits the tensor to the engine and returns
an integer handle at once, and a synchronous form that waits for it. The engine reads and writes
the tensors' memory directly through DLPack, so no copies are made on the way in or out.

Threading: the ``*_async*`` functions and :func:`synchronize` run on the caller's thread; the
collective itself runs on the engine's background thread. A tensor passed to an asynchronous
call must not be modified or freed by the caller until its handle has been synchronized; this
module keeps a reference to it until then, in ``_handle_map`` (horovod.common.ops' table of
operations in flight, shared by every framework package).

CUDA tensors (a horovod-core built with NCCL, docs/gpu.md): the collective runs on the GPU, ordered
after the work queued on the tensor's current CUDA stream when it was submitted; the results are
ready for work queued on that stream once :func:`synchronize` returns.
"""

import functools

from horovod.common import dtypes as _dtypes
from horovod.common import ops as _ops
from horovod.common.api import *  # noqa: F403 (hvd.size, hvd.Average, hvd.ProcessSet, ...: api.__all__)
from horovod.common.api import (  # noqa: F401 (used here, or only in mpi_ops: is_homogeneous)
    Adasum, Average, Max, Min, cuda_built, ProcessSet, Product, Sum, basics as _basics, global_process_set,
    handle_average_backwards_compatibility, is_homogeneous, rank, size,
)
from horovod.common.process_sets import _registered_id as _process_set_id, check_adasum_process_set
# The casts live in horovod.torch.compression, which also exports the compressors with state that
# are built on these collectives: only the default is needed here.
from horovod.common.compression import NoneCompressor

import torch

# horovod.common.ops' one table of operations in flight (handle -> (engine objects, context)),
# under the name upstream's torch binding gives its own. The context of a torch operation is
# ``(inputs, outputs)``: ``inputs``, the caller's tensors (kept alive while the engine reads
# them); ``outputs``, what synchronize() returns: a single entry for single-tensor ops, a list for
# grouped ops, a tuple ``(None, None)`` for alltoall (output and received splits); each entry is
# the tensor the engine writes into, or None where the engine allocates the output itself
# (allgather, alltoall, reducescatter). The table is emptied when the engine starts and after it
# stops (horovod.common.basics).
_handle_map = _ops._in_flight

_REDUCE_DTYPES = _dtypes.of(torch, 'int32 int64 float16 bfloat16 float32 float64')
_MOVE_DTYPES = _dtypes.of(torch, 'uint8 int8 int16 int32 int64 float16 bfloat16 float32 float64 bool')
_REDUCE_OPS = (Average, Sum, Min, Max, Product)
_STRIDED = torch.strided


def _synchronized(start):
    """The blocking forms, one decorator line each: the decorated def gives the signature and the
    docstring (what help() and the docs show), and its call is ``synchronize(start(...))`` with
    the same arguments; ``start`` is its ``*_async`` form, whose parameters it has, in order."""
    def make(declared):
        @functools.wraps(declared)
        def blocking(*args, **kwargs):
            return synchronize(start(*args, **kwargs))
        return blocking
    return make


def init(*args, **kwargs):
    """Starts Horovod in this process (see ``horovod.common.basics.HorovodBasics.init``).

    Drops every handle left from an earlier run before starting the engine, and restarts the
    automatic names.

    Args:
        args, kwargs: passed on: ``comm`` and ``process_sets`` as ``HorovodBasics.init`` takes
            them.

    Raises:
        ValueError: the engine could not start (the log output says why).
    """
    return _basics.init(*args, **kwargs)


def shutdown(*args, **kwargs):
    """Stops Horovod in this process; pending operations on every rank fail.

    Safe to call when Horovod is not running; ``init()`` may be called again afterwards.

    Args:
        args, kwargs: upstream's signature; passed on to ``HorovodBasics.shutdown``, which
            takes none (any given raise ``TypeError``).
    """
    return _basics.shutdown(*args, **kwargs)


def _check_tensor(tensor, allowed_dtypes, op_name):
    # The common case (a dense, contiguous CPU tensor of an allowed dtype) in five cheap reads,
    # about 0.2 us; anything else goes through the checks below, which say what is wrong.
    if (isinstance(tensor, torch.Tensor) and tensor.is_cpu and tensor.layout is _STRIDED
            and tensor.dtype in allowed_dtypes and tensor.is_contiguous()):
        return
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f'{op_name} expects a torch.Tensor, got {type(tensor).__name__}.')
    if not tensor.is_cpu and not (tensor.is_cuda and _cuda_built()):
        if tensor.is_cuda:
            raise ValueError(f'{op_name} got a tensor on device {tensor.device}: this build of '
                             'Horovod has no NCCL support, so it handles CPU tensors only. '
                             'Reinstall horovod-core with HOROVOD_GPU_OPERATIONS=NCCL, or move '
                             'the tensor with .cpu().')
        raise ValueError(f'{op_name} got a tensor on device {tensor.device}: Horovod handles CPU '
                         'tensors, and CUDA (GPU) tensors in builds with NCCL, only.')
    if tensor.layout != torch.strided:
        raise ValueError(f'{op_name} expects a dense tensor, got layout {tensor.layout}.')
    if tensor.dtype not in allowed_dtypes:
        supported = ', '.join(str(d) for d in allowed_dtypes)
        raise ValueError(f'{op_name} does not support tensor type {tensor.type()} '
                         f'(dtype {tensor.dtype}); supported dtypes: {supported}.')
    if not tensor.is_contiguous():
        raise ValueError(f'{op_name}: tensor must be contiguous (call .contiguous() first).')


def _cuda_built():
    global _CUDA_BUILT
    if _CUDA_BUILT is None:
        _CUDA_BUILT = bool(cuda_built())
    return _CUDA_BUILT


_CUDA_BUILT = None


def _stream(tensors):
    """The current CUDA stream of the device of ``tensors`` (a list) as an int, for the core to
    order its work after (see horovod.common.ops); 0 for CPU tensors, which never touch
    torch.cuda."""
    first = tensors[0]
    if not first.is_cuda:
        return 0
    return torch.cuda.current_stream(first.device).cuda_stream


def _check_tensor_list(tensors, allowed_dtypes, op_name):
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise ValueError(f'{op_name} expects a non-empty list of torch.Tensor, '
                         f'got {type(tensors).__name__}.')
    for t in tensors:
        _check_tensor(t, allowed_dtypes, op_name)


def _check_reduce_op(op, process_set):
    if op == Adasum:
        check_adasum_process_set(process_set, 'allreduce')
        n = size()
        if n & (n - 1):
            raise NotImplementedError(f'Adasum on CPU tensors needs a power-of-2 number of '
                                      f'ranks; non-power-of-2 ranks ({n}) are unsupported.')
        return
    if op not in _REDUCE_OPS:
        raise ValueError(f'Unknown reduce op {op!r}; expected one of hvd.Average, hvd.Sum, '
                         'hvd.Min, hvd.Max, hvd.Product, hvd.Adasum.')



# Tensor.__dlpack__ validates its keyword arguments in Python, which costs several microseconds: the
# largest part of submitting a small tensor. Its checks that matter here (a CPU, dense, contiguous
# tensor without autograd) are made before export, so the allreduce path calls the C function
# behind it when this torch has one, and __dlpack__ otherwise (the core calls it).
_to_dlpack_versioned = getattr(torch._C, '_to_dlpack_versioned', None)


def _export(tensor):
    """``tensor`` (checked by _check_tensor: no complex dtype, so no conjugate or negative bit)
    without autograd, as a DLPack capsule for the core to import without a copy."""
    if tensor.requires_grad:
        tensor = tensor.detach()
    if _to_dlpack_versioned is None:
        return tensor
    return _to_dlpack_versioned(tensor)


def _pick_increment_versions():
    """A function bumping the autograd version counter of each tensor of a sequence.

    ``torch.autograd.graph.increment_version`` does this in Python around
    ``torch._C._increment_version``, which takes a sequence of tensors in the releases that have
    it so; that function is used directly when a probe shows it bumps the counter (it saves a
    third of a microsecond per synchronize), the public one otherwise."""
    bump = getattr(torch._C, '_increment_version', None)
    if bump is not None:
        probe = torch.zeros(1)
        before = probe._version
        try:
            bump((probe,))
        except (TypeError, RuntimeError):
            pass
        else:
            if probe._version == before + 1:
                return bump
    increment = torch.autograd.graph.increment_version

    def increment_each(tensors):
        for t in tensors:
            increment(t)

    return increment_each


_increment_versions = _pick_increment_versions()


def _submit_allreduce(prefix, inputs, outputs, average, name, op, prescale_factor,
                      postscale_factor, process_set, grouped):
    # The hot path of every training step (one call per gradient): plain local operations only,
    # and the helpers called only where the common case needs them (issue 23). `grouped`: inputs
    # and outputs are lists; otherwise each is one tensor, submitted through the core's
    # single-tensor entry (no lists on either side). outputs None: in place.
    if op is None or average is not None:
        op = handle_average_backwards_compatibility(op, average)
    set_id = 0 if process_set is global_process_set else _process_set_id(process_set)
    if type(prescale_factor) is not float or type(postscale_factor) is not float:
        prescale_factor, postscale_factor = float(prescale_factor), float(postscale_factor)
    if op not in _REDUCE_OPS:
        _check_reduce_op(op, process_set)  # Adasum's conditions, or the error for an unknown op
    if not grouped:
        exported = _export(inputs)
        if outputs is None:
            outputs = inputs
            exported_output = exported
        else:
            exported_output = _export(outputs)
        stream = _stream((inputs,)) if inputs.is_cuda else 0
        return _ops.allreduce_one_async(exported, exported_output, _ops.op_name(prefix, name, set_id), op,
                                        prescale_factor, postscale_factor, set_id, stream,
                                        context=((inputs,), outputs))
    names = _ops.op_names(prefix, name, set_id, len(inputs))
    exported = [_export(t) for t in inputs]
    # In place, the engine writes into the inputs themselves (the same objects are passed as
    # outputs, which the core imports once).
    if outputs is None:
        given = inputs
        exported_outputs = exported
    else:
        given = outputs
        exported_outputs = [_export(t) for t in outputs]
    stream = _stream(inputs) if inputs[0].is_cuda else 0
    return _ops.allreduce_async(exported, exported_outputs, names, op, prescale_factor, postscale_factor,
                                set_id, stream, context=(tuple(inputs), given))


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Starts an allreduce of ``tensor`` into a new tensor; returns a handle at once.

    The result, ``postscale_factor * REDUCE_over_ranks(prescale_factor * tensor)``, has the shape
    and dtype of ``tensor``. ``Average`` is a sum divided by the number of ranks in
    ``process_set``. Every rank of the set must submit a tensor of the same shape and dtype under
    the same name.

    Args:
        tensor: a contiguous CPU or CUDA tensor of dtype int32, int64, float16, bfloat16, float32 or
            float64, any shape (scalars allowed).
        average: deprecated; use ``op``. True means ``Average``, False means ``Sum``.
        name: a name unique among the operations in flight; the same on every rank. Default: an
            automatic name ``allreduce.noname.<k>`` for the k-th unnamed allreduce on
            ``process_set`` (the ranks must then submit their unnamed allreduces on this set in
            the same order; other unnamed ops do not shift ``k``).
        op: ``Average`` (default), ``Sum``, ``Min``, ``Max``, ``Product`` or ``Adasum``
            (float tensors; Maleki et al., "Scaling Distributed Training with Adaptive
            Summation", MLSys 2021).
        prescale_factor: factor applied to the input before the reduction.
        postscale_factor: factor applied to the result after the reduction.
        process_set: the ``ProcessSet`` to reduce over (default: all ranks).

    Returns:
        int handle for :func:`poll` and :func:`synchronize`, which returns the result tensor.

    Raises:
        ValueError: unsupported dtype or device, non-contiguous tensor, ``op`` and ``average``
            both given, unknown op, a name already in flight, or an unregistered process set.
        NotImplementedError: ``op`` is ``Adasum`` with a process set other than the global
            one, or with a number of ranks that is not a power of 2.
        HorovodInternalError: Horovod is not initialised or has been shut down.
    """
    _check_tensor(tensor, _REDUCE_DTYPES, 'allreduce')
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _submit_allreduce('allreduce', tensor, output, average, name, op, prescale_factor,
                             postscale_factor, process_set, grouped=False)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """Starts an in-place allreduce of ``tensor``; returns a handle at once.

    Same arguments, semantics and errors as :func:`allreduce_async`, but the result is written
    into ``tensor`` itself; :func:`synchronize` returns ``tensor``.

    Args:
        tensor: the tensor reduced in place, as for :func:`allreduce_async`.
        average, name, op, prescale_factor, postscale_factor, process_set: as for
            :func:`allreduce_async`.
    """
    _check_tensor(tensor, _REDUCE_DTYPES, 'allreduce')
    return _submit_allreduce('allreduce', tensor, None, average, name, op, prescale_factor,
                             postscale_factor, process_set, grouped=False)


@_synchronized(allreduce_async_)
def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """In-place allreduce of ``tensor``; blocks until done and returns ``tensor``.

    Same arguments and errors as :func:`allreduce_async`; a failure in the engine (ranks
    disagreeing on shape, dtype or op; shutdown; a lost peer) raises ``HorovodInternalError``.
    Not differentiable: use :func:`allreduce` inside a model.

    Args:
        tensor: the tensor reduced in place, as for :func:`allreduce_async`.
        average, name, op, prescale_factor, postscale_factor, process_set: as for
            :func:`allreduce_async`.
    """


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Starts one allreduce of a list of tensors into new tensors; returns a handle at once.

    The tensors are negotiated and executed together (fused into as few collectives as the
    fusion threshold allows); each result equals the single-tensor allreduce of that tensor.
    Dtypes may differ within the list; op and scale factors are shared. The engine names tensor
    ``i`` of ``n`` ``grouped_allreduce.<name>_<i+1>of<n>``.

    Args:
        tensors: non-empty list of tensors, each as for :func:`allreduce_async`.
        average, name, op, prescale_factor, postscale_factor, process_set: as for
            :func:`allreduce_async`.

    Returns:
        int handle; :func:`synchronize` returns the list of result tensors in input order.

    Raises:
        ValueError: as for :func:`allreduce_async`, or ``tensors`` is not a non-empty list.
        HorovodInternalError: Horovod is not initialised or has been shut down.
    """
    _check_tensor_list(tensors, _REDUCE_DTYPES, 'grouped_allreduce')
    outputs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    return _submit_allreduce('grouped_allreduce', list(tensors), outputs, average, name, op,
                             prescale_factor, postscale_factor, process_set, grouped=True)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """Starts an in-place grouped allreduce; returns a handle at once.

    Same arguments, semantics and errors as :func:`grouped_allreduce_async`, but each result is
    written into its input tensor; :func:`synchronize` returns the input tensors as a list.

    Args:
        tensors: the tensors reduced in place, as for :func:`grouped_allreduce_async`.
        average, name, op, prescale_factor, postscale_factor, process_set: as for
            :func:`allreduce_async`.
    """
    _check_tensor_list(tensors, _REDUCE_DTYPES, 'grouped_allreduce')
    return _submit_allreduce('grouped_allreduce', list(tensors), None, average, name,
                             op, prescale_factor, postscale_factor, process_set, grouped=True)


@_synchronized(grouped_allreduce_async_)
def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    """In-place grouped allreduce; blocks until done and returns the list of input tensors.

    Same arguments and errors as :func:`grouped_allreduce_async`; engine failures raise
    ``HorovodInternalError``. Not differentiable: use :func:`grouped_allreduce` in a model.

    Args:
        tensors: the tensors reduced in place, as for :func:`grouped_allreduce_async`.
        average, name, op, prescale_factor, postscale_factor, process_set: as for
            :func:`allreduce_async`.
    """


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts an allgather of ``tensor``; returns a handle at once.

    The result concatenates every rank's tensor along dimension 0 in rank order: shape
    ``[sum of every rank's d0] + tensor.shape[1:]``, dtype of ``tensor``. Dimension 0 may differ
    between ranks; all other dimensions and the dtype must agree.

    Args:
        tensor: a contiguous CPU or CUDA tensor with at least one dimension, of dtype uint8, int8,
            int16, int32, int64, float16, bfloat16, float32, float64 or bool.
        name: a name unique among the operations in flight, the same on every rank; default: an
            automatic name from a per-op counter.
        process_set: the ``ProcessSet`` to gather over (default: all ranks).

    Returns:
        int handle; :func:`synchronize` returns the gathered tensor (allocated by the engine).

    Raises:
        ValueError: unsupported dtype or device, non-contiguous tensor, a name already in
            flight, an unregistered process set.
        HorovodInternalError: from :func:`synchronize` when ranks disagree (dtype, ndim, a
            dimension other than 0, a scalar input), or Horovod is not running.
    """
    _check_tensor(tensor, _MOVE_DTYPES, 'allgather')
    set_id = _process_set_id(process_set)
    handle = _ops.allgather_async([tensor.detach()], _ops.op_names('allgather', name, set_id),
                                  set_id, _stream([tensor]), context=((tensor,), None))
    return handle


def _submit_broadcast(tensor, output, root_rank, name, process_set):
    set_id = _process_set_id(process_set)
    if isinstance(root_rank, bool) or not isinstance(root_rank, int):
        raise ValueError(f'root_rank must be an int (a global rank), got {root_rank!r}.')
    handle = _ops.broadcast_async([output.detach()], _ops.op_names('broadcast', name, set_id),
                                  root_rank, set_id, _stream([output]), context=((tensor,), output))
    return handle


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts a broadcast of the root's ``tensor`` into a new tensor; returns a handle at once.

    Args:
        tensor: a contiguous CPU or CUDA tensor of dtype uint8, int8, int16, int32, int64, float16,
            bfloat16, float32, float64 or bool; same shape and dtype on every rank.
        root_rank: the global rank whose tensor is sent; it must belong to ``process_set``.
        name: a name unique among the operations in flight, the same on every rank; default: an
            automatic name from a per-op counter.
        process_set: the ``ProcessSet`` to broadcast within (default: all ranks).

    Returns:
        int handle; :func:`synchronize` returns a new tensor holding the root's data (on the
        root, a copy of its input). ``tensor`` is never modified.

    Raises:
        ValueError: unsupported dtype or device, non-contiguous tensor, a root that is not an int
            or not in the set, a name already in flight, an unregistered process set.
        HorovodInternalError: from :func:`synchronize` when ranks disagree on shape, dtype or
            root, or Horovod is not running.
    """
    _check_tensor(tensor, _MOVE_DTYPES, 'broadcast')
    output = tensor.detach().clone(memory_format=torch.contiguous_format)
    return _submit_broadcast(tensor, output, root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts an in-place broadcast: non-root ranks get the root's data written into ``tensor``.

    Same arguments and errors as :func:`broadcast_async`; the root's tensor is not modified.
    :func:`synchronize` returns ``tensor``.

    Args:
        tensor: the tensor written in place on the non-root ranks, as for :func:`broadcast_async`.
        root_rank, name, process_set: as for :func:`broadcast_async`.
    """
    _check_tensor(tensor, _MOVE_DTYPES, 'broadcast')
    return _submit_broadcast(tensor, tensor, root_rank, name, process_set)


@_synchronized(broadcast_async_)
def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place broadcast from ``root_rank``; blocks until done and returns ``tensor``.

    Same arguments and errors as :func:`broadcast_async`. Not differentiable: use
    :func:`broadcast` inside a model.

    Args:
        tensor: the tensor written in place on the non-root ranks, as for :func:`broadcast_async`.
        root_rank, name, process_set: as for :func:`broadcast_async`.
    """


def reduce_async(tensor, root_rank, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,
                 process_set=global_process_set):
    """Starts a reduce of ``tensor`` to ``root_rank`` into a new tensor; returns a handle at once.

    On the root the result is ``postscale_factor * REDUCE_over_ranks(prescale_factor * tensor)``,
    as for :func:`allreduce_async` (``Average`` is the sum divided by the number of ranks in
    ``process_set``); on every other rank it is a copy of ``tensor`` (torch.distributed.reduce
    leaves it unspecified). Every rank of the set must submit a tensor of the same shape and dtype
    under the same name, with the same op, scale factors and root.

    Args:
        tensor: a contiguous CPU or CUDA tensor of dtype int32, int64, float16, bfloat16, float32 or
            float64, any shape (scalars allowed).
        root_rank: the global rank that receives the reduction; it must belong to ``process_set``.
        name: a name unique among the operations in flight, the same on every rank; default: an
            automatic name ``reduce.noname.<k>``.
        op: ``Average`` (default), ``Sum``, ``Min``, ``Max`` or ``Product`` (not ``Adasum``).
        prescale_factor: factor applied to the input before the reduction.
        postscale_factor: factor applied to the result after the reduction (on the root).
        process_set: the ``ProcessSet`` to reduce over (default: all ranks).

    Returns:
        int handle; :func:`synchronize` returns the result tensor (shape and dtype of ``tensor``).

    Raises:
        ValueError: unsupported dtype or device, non-contiguous tensor, a root that is not an int
            or not in the set, ``Adasum`` or an unknown op, a name already in flight, an
            unregistered process set.
        HorovodInternalError: from :func:`synchronize` when ranks disagree on shape, dtype, op,
            scale factors or root, or a rank has joined; Horovod not running.
    """
    _check_tensor(tensor, _REDUCE_DTYPES, 'reduce')
    if isinstance(root_rank, bool) or not isinstance(root_rank, int):
        raise ValueError(f'root_rank must be an int (a global rank), got {root_rank!r}.')
    set_id = _process_set_id(process_set)
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _ops.reduce_async(_export(tensor), _export(output), _ops.op_name('reduce', name, set_id), root_rank,
                             op, float(prescale_factor), float(postscale_factor), set_id, _stream([tensor]),
                             context=((tensor,), output))


@_synchronized(reduce_async)
def reduce(tensor, root_rank, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,
           process_set=global_process_set):
    """Reduce of ``tensor`` to ``root_rank``; blocks until done and returns a new tensor.

    Same arguments, result and errors as :func:`reduce_async`; engine failures raise
    ``HorovodInternalError``. Not differentiable.

    Args:
        tensor: the tensor to reduce, as for :func:`reduce_async`.
        root_rank, name, op, prescale_factor, postscale_factor, process_set: as for
            :func:`reduce_async`.
    """


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Starts one allgather of a list of tensors; returns a handle at once.

    The tensors are negotiated and executed together; each result equals the single-tensor
    allgather of that tensor. The engine names tensor ``i`` of ``n``
    ``grouped_allgather.<name>_<i+1>of<n>``.

    Args:
        tensors: non-empty list of tensors, each as for :func:`allgather_async`.
        name, process_set: as for :func:`allgather_async`.

    Returns:
        int handle; :func:`synchronize` returns the list of gathered tensors in input order.

    Raises:
        ValueError, HorovodInternalError: as for :func:`allgather_async`, or ``tensors`` is not
            a non-empty list.
    """
    _check_tensor_list(tensors, _MOVE_DTYPES, 'grouped_allgather')
    set_id = _process_set_id(process_set)
    handle = _ops.allgather_async([t.detach() for t in tensors],
                                  _ops.op_names('grouped_allgather', name, set_id, len(tensors)), set_id,
                                  _stream(tensors), context=(tuple(tensors), [None] * len(tensors)))
    return handle


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Starts the reduction of a sparse COO tensor by allgathering its indices and values;
    returns a callable handle at once.

    Two allgathers run: ``<name>.indices`` on the ``[nnz, ndim]`` transposed index matrix and
    ``<name>.values`` on the ``[nnz, ...]`` values. Concatenating every rank's entries sums the
    tensors, since duplicate indices add up; the result is left uncoalesced (call
    ``.coalesce()`` to merge duplicates). ``nnz`` may differ between ranks; the dense shape and
    the dtype must agree.

    Args:
        tensor: a sparse COO CPU tensor (``layout == torch.sparse_coo``) whose values have one
            of the dtypes :func:`allgather_async` takes; it need not be coalesced.
        name: base name of the two allgathers, the same on every rank; None for an automatic
            name (the ranks must then submit in the same order).
        op: ``Average`` (values divided by the set size; integer values truncate toward zero)
            or ``Sum``; None means ``Average``.
        process_set: the ``ProcessSet`` to reduce over (default: all ranks).

    Returns:
        A zero-argument callable. Calling it waits for both allgathers and returns the sparse
        COO tensor of ``tensor``'s size and dtype holding every rank's entries (indices
        ``[ndim, total nnz]`` in rank order). Call it exactly once; :func:`synchronize` does not
        take it.

    Raises:
        ValueError: ``tensor`` is not a sparse COO tensor, unsupported dtype or device, an op
            other than ``Average`` and ``Sum``, a name already in flight, an unregistered
            process set.
        HorovodInternalError: from the callable, when ranks disagree on dtype or dense shape,
            or Horovod was shut down.
    """
    if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.sparse_coo:
        raise ValueError('sparse_allreduce_async expects a sparse COO torch.Tensor, got '
                         f'{getattr(tensor, "layout", type(tensor).__name__)}.')
    op = Average if op is None else op
    if op not in (Average, Sum):
        raise ValueError(f'sparse_allreduce_async supports op=Average and op=Sum only, got '
                         f'{op!r}: the values are combined by concatenation.')
    indices = tensor._indices().transpose(0, 1).contiguous()
    values = tensor._values().contiguous()
    if name is None:
        # Both parts share one automatic base name, like a named call.
        name = _ops.op_name('sparse_allreduce', None, _process_set_id(process_set))
    values_handle = allgather_async(values, f'{name}.values', process_set)
    indices_handle = allgather_async(indices, f'{name}.indices', process_set)
    set_size = process_set.size()

    def handle():
        gathered_values = synchronize(values_handle)
        gathered_indices = synchronize(indices_handle)
        if gathered_values.dim() == 0 or gathered_indices.dim() == 0:
            return torch.sparse_coo_tensor(size=tensor.size(), dtype=tensor.dtype)
        if op == Average:
            if gathered_values.is_floating_point():
                gathered_values = gathered_values / set_size
            else:
                gathered_values = torch.div(gathered_values, set_size, rounding_mode='trunc')
        return torch.sparse_coo_tensor(gathered_indices.transpose(0, 1), gathered_values,
                                       tensor.size(), dtype=tensor.dtype)

    return handle


def _splits_tensor(splits):
    """The alltoall ``splits`` argument as the engine takes it: None, or a CPU int32 tensor."""
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        if splits.dtype != torch.int32:
            raise ValueError(f'alltoall splits must be an int32 tensor, got dtype {splits.dtype} '
                             '(a list of ints is converted automatically).')
        if splits.device.type != 'cpu':
            raise ValueError(f'alltoall splits must be a CPU tensor, got one on {splits.device}.')
        return splits.detach()
    if isinstance(splits, (list, tuple)):
        if not all(isinstance(s, int) and not isinstance(s, bool) for s in splits):
            raise ValueError(f'alltoall splits must be ints, got {list(splits)!r}.')
        return torch.tensor(splits, dtype=torch.int32)
    raise ValueError('alltoall splits must be None, a list of ints or an int32 tensor, '
                     f'got {type(splits).__name__}.')


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts an alltoall of ``tensor`` along dimension 0; returns a handle at once.

    Set member ``k`` receives rows ``[sum(splits[:k]), sum(splits[:k+1]))`` of this rank's
    ``tensor``; the output is the blocks received from every member, concatenated in set-rank
    order: shape ``[sum of received rows] + tensor.shape[1:]``, dtype of ``tensor``. Rows past
    ``sum(splits)`` are not sent. Every member must agree on dtype and on dimensions 1 and up.

    Args:
        tensor: a contiguous CPU or CUDA tensor with at least one dimension, of dtype uint8, int8,
            int16, int32, int64, float16, bfloat16, float32, float64 or bool.
        splits: None (default) to send ``tensor.shape[0] / set size`` rows to every member, or
            one row count per set member (in set-rank order): a list of ints, or a 1-D int32
            CPU tensor.
        name: a name unique among the operations in flight, the same on every rank; default: an
            automatic name from a per-op counter.
        process_set: the ``ProcessSet`` to exchange within (default: all ranks).

    Returns:
        int handle; :func:`synchronize` returns ``(output, received_splits)``, where
        ``received_splits`` is a 1-D int32 CPU tensor of the rows received from each member.

    Raises:
        ValueError: unsupported dtype or device, non-contiguous tensor, splits that are not
            ints / an int32 tensor, of the wrong length or ndim, summing past dimension 0, no
            splits with dimension 0 not divisible by the set size, a name already in flight, an
            unregistered process set or this rank not in it.
        HorovodInternalError: from :func:`synchronize` when ranks disagree (dtype, ndim, a
            dimension other than 0), a rank has joined, or Horovod is not running.
    """
    _check_tensor(tensor, _MOVE_DTYPES, 'alltoall')
    engine_splits = _splits_tensor(splits)
    set_id = _process_set_id(process_set)
    handle = _ops.alltoall_async(tensor.detach(), engine_splits, _ops.op_name('alltoall', name, set_id),
                                 set_id, _stream([tensor]), context=((tensor,), (None, None)))
    return handle


def _submit_reducescatter(prefix, tensors, name, op, prescale_factor, postscale_factor,
                          process_set, grouped):
    # No op check here: the engine refuses ops other than Average and Sum at enqueue with
    # HorovodInternalError (spec core.md §6.7).
    set_id = _process_set_id(process_set)
    names = _ops.op_names(prefix, name, set_id, len(tensors) if grouped else None)
    handle = _ops.reducescatter_async([t.detach() for t in tensors], names, op,
                                      float(prescale_factor), float(postscale_factor), set_id,
                                      _stream(tensors),
                                      context=(tuple(tensors), [None] * len(tensors) if grouped else None))
    return handle


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Starts a reducescatter of ``tensor``; returns a handle at once.

    The element-wise reduction over the set, ``postscale_factor * SUM_ranks(prescale_factor *
    tensor)`` (divided by the set size for ``Average``), is split along dimension 0: set member
    ``r`` of ``n`` gets ``d0 // n + (1 if r < d0 % n else 0)`` rows, after the earlier members'
    rows. The result has shape ``[rows_r] + tensor.shape[1:]`` and the dtype of ``tensor``.

    Args:
        tensor: a contiguous CPU or CUDA tensor with at least one dimension, of dtype int32, int64,
            float16, bfloat16, float32 or float64; same shape on every rank.
        name: a name unique among the operations in flight, the same on every rank; default: an
            automatic name from a per-op counter.
        op: ``Average`` (default) or ``Sum``.
        process_set: the ``ProcessSet`` to reduce over (default: all ranks).
        prescale_factor: factor applied to the input before the reduction.
        postscale_factor: factor applied to the result after the reduction.

    Returns:
        int handle; :func:`synchronize` returns this rank's part of the reduction.

    Raises:
        ValueError: unsupported dtype or device, non-contiguous tensor, a name already in
            flight, an unregistered process set or this rank not in it.
        HorovodInternalError: at submission for an op other than ``Average`` and ``Sum``, or when
            Horovod is not running; from :func:`synchronize` when ranks disagree on shape,
            dtype or scale factors, the tensor is a scalar, or a rank has joined.
    """
    _check_tensor(tensor, _REDUCE_DTYPES, 'reducescatter')
    return _submit_reducescatter('reducescatter', [tensor], name, op, prescale_factor,
                                 postscale_factor, process_set, grouped=False)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    """Starts one reducescatter of a list of tensors; returns a handle at once.

    The tensors are negotiated and executed together; each result equals the single-tensor
    reducescatter of that tensor. Op and scale factors are shared. The engine names tensor ``i``
    of ``n`` ``grouped_reducescatter.<name>_<i+1>of<n>``.

    Args:
        tensors: non-empty list of tensors, each as for :func:`reducescatter_async`.
        name, op, process_set, prescale_factor, postscale_factor: as for
            :func:`reducescatter_async`.

    Returns:
        int handle; :func:`synchronize` returns the list of results in input order.

    Raises:
        ValueError, HorovodInternalError: as for :func:`reducescatter_async`, or ``tensors`` is
            not a non-empty list.
    """
    _check_tensor_list(tensors, _REDUCE_DTYPES, 'grouped_reducescatter')
    return _submit_reducescatter('grouped_reducescatter', list(tensors), name, op,
                                 prescale_factor, postscale_factor, process_set, grouped=True)


def join(device=-1):
    """Tells the other ranks that this rank has no more data, and blocks until every rank has
    joined.

    Until then this rank takes part in the allreduces the other ranks submit, contributing zeros
    (``Average`` still divides by the full set size). Allgather, broadcast, alltoall and
    reducescatter fail on the other ranks while this rank is joined.

    Args:
        device: accepted for compatibility (the device of the zero tensors; -1 for the CPU).
            This release handles CPU tensors only.

    Returns:
        int: the global rank that joined last, the same on every rank.

    Raises:
        HorovodInternalError: Horovod is not running, or was shut down while waiting.
    """
    del device  # zeros are made by the engine; every tensor is on the CPU
    handle = _ops.join_async()
    return int(_ops.wait(handle)[0])


def barrier(process_set=global_process_set):
    """Blocks until every member of ``process_set`` has called ``barrier`` (operations submitted
    earlier may still be in flight).

    Raises:
        ValueError: an unregistered process set, or this rank is not in it.
        HorovodInternalError: Horovod is not running, or was shut down while waiting.
    """
    set_id = _process_set_id(process_set)
    _ops.wait(_ops.barrier_async(set_id))


def poll(handle):
    """Tells whether the operation behind ``handle`` has finished (successfully or not).

    Args:
        handle: an int returned by an ``*_async*`` function and not yet synchronized.

    Returns:
        bool; True once :func:`synchronize` would return without waiting.

    Raises:
        ValueError: ``handle`` is unknown (never issued, or already synchronized).
    """
    if not _ops.in_flight(handle):
        raise ValueError(f'Unknown handle {handle!r}: it was never issued or has already been '
                         'synchronized.')
    return _ops.poll(handle)


def synchronize(handle):
    """Waits for the operation behind ``handle`` and returns its result.

    The wait releases the GIL. The handle is forgotten afterwards, whether the operation
    succeeded or not.

    Args:
        handle: an int returned by an ``*_async*`` function.

    Returns:
        The result tensor; for grouped ops, the list of result tensors in input order; for
        alltoall, the tuple ``(output, received_splits)``. None if ``handle`` is not pending
        (unknown or already synchronized).

    Raises:
        HorovodInternalError: the operation failed: ranks disagreed on dtype, shape, op, scale
            factors or root, Horovod was shut down, or a peer was lost.
    """
    submitted = _ops.context(handle)
    if submitted is None:
        return None
    # wait forgets the handle, whether the operation succeeded or not.
    results = _ops.wait(handle)
    outputs = submitted[1]
    if not isinstance(outputs, (list, tuple)):
        # A single tensor: the path of every allreduce of a training step.
        if outputs is None:
            return torch.from_dlpack(results[0])
        # The engine wrote through DLPack, behind autograd's back: bump the version counter
        # so that a backward pass that saved this tensor notices it changed.
        _increment_versions((outputs,))
        return outputs
    tensors = []
    for output, result in zip(outputs, results, strict=True):
        if output is None:
            tensors.append(torch.from_dlpack(result))
        else:
            tensors.append(output)
    written = [t for t, output in zip(tensors, outputs, strict=True) if output is not None]
    if written:
        _increment_versions(written)
    return tuple(tensors) if isinstance(outputs, tuple) else tensors


# The synchronous forms below are torch.autograd.Functions, so a collective can sit inside a
# model. Backward passes issue collectives too (with automatic names), so every rank must run
# the same backward pass.


class HorovodAllreduce(torch.autograd.Function):
    """Differentiable allreduce: the gradient is the allreduce of the incoming gradient with the
    forward's op, scale factors and process set."""

    @staticmethod
    def forward(ctx, tensor, op, name, prescale_factor, postscale_factor, process_set):
        ctx.settings = (op, prescale_factor, postscale_factor, process_set)
        return synchronize(allreduce_async(tensor, None, name, op, prescale_factor,
                                           postscale_factor, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        op, prescale_factor, postscale_factor, process_set = ctx.settings
        grad = synchronize(allreduce_async(grad_output.contiguous(), None, None, op,
                                           prescale_factor, postscale_factor, process_set))
        return grad, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=NoneCompressor, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Allreduce of ``tensor`` into a new tensor; blocks until done. Differentiable.

    ``compression.compress`` is applied before the reduction and ``decompress`` after it, so the
    result has the dtype of ``tensor``. The gradient with respect to ``tensor`` is the same
    allreduce of the incoming gradient.

    Args:
        tensor, average, name, op, prescale_factor, postscale_factor, process_set: as for
            :func:`allreduce_async`.
        compression: ``Compression.none`` (default), ``Compression.fp16`` or ``Compression.bf16``.

    Returns:
        torch.Tensor of the shape and dtype of ``tensor``.

    Raises:
        ValueError, NotImplementedError: as for :func:`allreduce_async`.
        HorovodInternalError: ranks disagree on shape, dtype, op or scale factors; Horovod was
            shut down or a peer was lost.
    """
    op = handle_average_backwards_compatibility(op, average)
    compressed, ctx = compression.compress(tensor)
    reduced = HorovodAllreduce.apply(compressed, op, name, prescale_factor, postscale_factor,
                                     process_set)
    return compression.decompress(reduced, ctx)


class HorovodGroupedAllreduce(torch.autograd.Function):
    """Differentiable grouped allreduce: the gradients are the grouped allreduce of the incoming
    gradients with the forward's settings."""

    @staticmethod
    def forward(ctx, op, name, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.settings = (op, prescale_factor, postscale_factor, process_set)
        return tuple(synchronize(grouped_allreduce_async(list(tensors), None, name, op,
                                                         prescale_factor, postscale_factor,
                                                         process_set)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        op, prescale_factor, postscale_factor, process_set = ctx.settings
        grads = synchronize(grouped_allreduce_async([g.contiguous() for g in grad_outputs], None,
                                                    None, op, prescale_factor, postscale_factor,
                                                    process_set))
        return (None, None, None, None, None, *grads)


def grouped_allreduce(tensors, average=None, name=None, compression=NoneCompressor, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Grouped allreduce of a list of tensors into new tensors; blocks. Differentiable.

    Args:
        tensors, average, name, op, prescale_factor, postscale_factor, process_set: as for
            :func:`grouped_allreduce_async`.
        compression: ``Compression.none`` (default), ``Compression.fp16`` or ``Compression.bf16``,
            applied per tensor.

    Returns:
        list of torch.Tensor, one per input, each of its input's shape and dtype.

    Raises:
        ValueError, NotImplementedError, HorovodInternalError: as for
            :func:`grouped_allreduce_async` and :func:`allreduce`.
    """
    op = handle_average_backwards_compatibility(op, average)
    if not isinstance(tensors, (list, tuple)):
        raise ValueError('grouped_allreduce expects a non-empty list of torch.Tensor, '
                         f'got {type(tensors).__name__}.')
    compressed = [compression.compress(t) for t in tensors]
    reduced = HorovodGroupedAllreduce.apply(op, name, prescale_factor, postscale_factor,
                                            process_set, *(t for t, _ in compressed))
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(reduced, compressed, strict=True)]


class HorovodAllgather(torch.autograd.Function):
    """Differentiable allgather: each rank's gradient is its own rows of the averaged incoming
    gradient."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.dim0 = tensor.shape[0] if tensor.dim() > 0 else 0
        ctx.process_set = process_set
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        process_set = ctx.process_set
        grad = synchronize(allreduce_async(grad_output.contiguous(), None, None, Average, 1.0,
                                           1.0, process_set))
        # Where this rank's rows start: the sum of dim 0 over the ranks before it in the set.
        dims = synchronize(allgather_async(torch.tensor([ctx.dim0], dtype=torch.int64), None,
                                           process_set))
        set_rank = process_set.rank()
        offset = int(dims[:set_rank].sum())
        return grad.narrow(0, offset, ctx.dim0), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Allgather of ``tensor`` along dimension 0 in rank order; blocks. Differentiable.

    The gradient with respect to ``tensor`` is this rank's slice of the average over ranks of
    the incoming gradient.

    Args:
        tensor, name, process_set: as for :func:`allgather_async`.

    Returns:
        torch.Tensor of shape ``[sum of every rank's d0] + tensor.shape[1:]``.

    Raises:
        ValueError, HorovodInternalError: as for :func:`allgather_async`.
    """
    return HorovodAllgather.apply(tensor, name, process_set)


class HorovodBroadcast(torch.autograd.Function):
    """Differentiable broadcast: the root's gradient is the average over ranks of the incoming
    gradients; the other ranks' gradient is zero."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = synchronize(allreduce_async(grad_output.contiguous(), None, None, Average, 1.0,
                                           1.0, ctx.process_set))
        if rank() != ctx.root_rank:
            grad = grad * 0
        return grad, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Broadcast of the root's ``tensor`` into a new tensor on every rank; blocks.
    Differentiable.

    Args:
        tensor, root_rank, name, process_set: as for :func:`broadcast_async`.

    Returns:
        torch.Tensor holding the root's data, of the shape and dtype of ``tensor``.

    Raises:
        ValueError, HorovodInternalError: as for :func:`broadcast_async`.
    """
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


def _gather_offsets(dim0s, process_set):
    """Where this rank's rows start in each gathered tensor: for every entry of ``dim0s`` (this
    rank's dimension 0 of each input), the sum of that dimension over the earlier set members."""
    local = torch.tensor([dim0s], dtype=torch.int64)
    every = synchronize(allgather_async(local, None, process_set))
    return [int(v) for v in every[:process_set.rank()].sum(dim=0)]


class HorovodGroupedAllgather(torch.autograd.Function):
    """Differentiable grouped allgather: each gradient is this rank's rows of the averaged
    incoming gradient, as for :class:`HorovodAllgather`."""

    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.dim0s = [t.shape[0] if t.dim() > 0 else 0 for t in tensors]
        ctx.process_set = process_set
        return tuple(synchronize(grouped_allgather_async(list(tensors), name, process_set)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        process_set = ctx.process_set
        grads = synchronize(grouped_allreduce_async([g.contiguous() for g in grad_outputs], None,
                                                    None, Average, 1.0, 1.0, process_set))
        offsets = _gather_offsets(ctx.dim0s, process_set)
        rows = [g.narrow(0, offset, d0)
                for g, offset, d0 in zip(grads, offsets, ctx.dim0s, strict=True)]
        return (None, None, *rows)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Grouped allgather of a list of tensors; blocks. Differentiable.

    Each gradient is this rank's slice of the average over ranks of the incoming gradient, as
    for :func:`allgather`.

    Args:
        tensors, name, process_set: as for :func:`grouped_allgather_async`.

    Returns:
        list of torch.Tensor, one per input, of shape ``[sum of every rank's d0] +
        shape[1:]``.

    Raises:
        ValueError, HorovodInternalError: as for :func:`grouped_allgather_async`.
    """
    if not isinstance(tensors, (list, tuple)):
        raise ValueError('grouped_allgather expects a non-empty list of torch.Tensor, '
                         f'got {type(tensors).__name__}.')
    return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))


class HorovodAlltoall(torch.autograd.Function):
    """Differentiable alltoall: the gradient is the alltoall of the incoming gradient sent back
    with the received splits; rows the forward did not send get a zero gradient."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received_splits = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.dim0 = tensor.shape[0] if tensor.dim() > 0 else 0
        ctx.process_set = process_set
        ctx.received_splits = received_splits.clone()
        ctx.mark_non_differentiable(received_splits)
        return output, received_splits

    @staticmethod
    def backward(ctx, grad_output, grad_received_splits):
        grad, _ = synchronize(alltoall_async(grad_output.contiguous(), ctx.received_splits, None,
                                             ctx.process_set))
        missing = ctx.dim0 - grad.shape[0]
        if missing > 0:
            # Rows past sum(splits) were never sent: they do not affect the output.
            grad = torch.cat([grad, grad.new_zeros((missing, *grad.shape[1:]))])
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Alltoall of ``tensor`` along dimension 0; blocks. Differentiable.

    The gradient with respect to ``tensor`` is the alltoall of the incoming gradient with the
    received splits (each block goes back to the rank it came from); ``received_splits`` is not
    differentiable.

    Args:
        tensor, splits, name, process_set: as for :func:`alltoall_async`.

    Returns:
        ``output`` when ``splits`` is None, else ``(output, received_splits)``: the received
        rows, shape ``[sum of received rows] + tensor.shape[1:]``, and a 1-D int32 CPU tensor of
        the rows received from each set member.

    Raises:
        ValueError, HorovodInternalError: as for :func:`alltoall_async`.
    """
    output, received_splits = HorovodAlltoall.apply(tensor, splits, name, process_set)
    return output if splits is None else (output, received_splits)


def _reducescatter_grad_scale(op, prescale_factor, postscale_factor, process_set):
    # spec torch.md §4.3: the gradient is the allgather of the incoming gradient, times the set
    # size for Sum and times the scale factors.
    scale = float(process_set.size()) if op == Sum else 1.0
    return scale * prescale_factor * postscale_factor


def _scaled(tensor, scale):
    return tensor.contiguous() if scale == 1.0 else (tensor * scale).contiguous()


class HorovodReducescatter(torch.autograd.Function):
    """Differentiable reducescatter: the gradient is the allgather of the incoming gradient,
    scaled by the set size for ``Sum`` and by the scale factors."""

    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.settings = (op, prescale_factor, postscale_factor, process_set)
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                               postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        process_set = ctx.settings[3]
        scale = _reducescatter_grad_scale(*ctx.settings)
        grad = synchronize(allgather_async(_scaled(grad_output, scale), None, process_set))
        return grad, None, None, None, None, None


def reducescatter(tensor, name=None, compression=NoneCompressor, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reducescatter of ``tensor``; blocks until done. Differentiable.

    ``compression.compress`` is applied before the operation and ``decompress`` after it. The
    gradient with respect to ``tensor`` is the allgather of the incoming gradient, multiplied by
    the set size for ``Sum`` and by ``prescale_factor * postscale_factor``.

    Args:
        tensor, name, op, process_set, prescale_factor, postscale_factor: as for
            :func:`reducescatter_async`.
        compression: ``Compression.none`` (default), ``Compression.fp16`` or ``Compression.bf16``.

    Returns:
        torch.Tensor: this rank's rows of the reduction, shape ``[rows_r] + tensor.shape[1:]``.

    Raises:
        ValueError, HorovodInternalError: as for :func:`reducescatter_async`.
    """
    compressed, ctx = compression.compress(tensor)
    reduced = HorovodReducescatter.apply(compressed, name, op, process_set, prescale_factor,
                                         postscale_factor)
    return compression.decompress(reduced, ctx)


class HorovodGroupedReducescatter(torch.autograd.Function):
    """Differentiable grouped reducescatter: each gradient is as for
    :class:`HorovodReducescatter`, the allgathers grouped."""

    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.settings = (op, prescale_factor, postscale_factor, process_set)
        return tuple(synchronize(grouped_reducescatter_async(list(tensors), name, op, process_set,
                                                             prescale_factor, postscale_factor)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        process_set = ctx.settings[3]
        scale = _reducescatter_grad_scale(*ctx.settings)
        grads = synchronize(grouped_allgather_async([_scaled(g, scale) for g in grad_outputs],
                                                    None, process_set))
        return (None, None, None, None, None, *grads)


def grouped_reducescatter(tensors, name=None, compression=NoneCompressor, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """Grouped reducescatter of a list of tensors; blocks. Differentiable.

    Args:
        tensors, name, op, process_set, prescale_factor, postscale_factor: as for
            :func:`grouped_reducescatter_async`.
        compression: ``Compression.none`` (default), ``Compression.fp16`` or ``Compression.bf16``,
            applied per tensor.

    Returns:
        list of torch.Tensor, one per input, as for :func:`reducescatter`.

    Raises:
        ValueError, HorovodInternalError: as for :func:`grouped_reducescatter_async`.
    """
    if not isinstance(tensors, (list, tuple)):
        raise ValueError('grouped_reducescatter expects a non-empty list of torch.Tensor, '
                         f'got {type(tensors).__name__}.')
    compressed = [compression.compress(t) for t in tensors]
    reduced = HorovodGroupedReducescatter.apply(name, op, process_set, prescale_factor,
                                                postscale_factor, *(t for t, _ in compressed))
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(reduced, compressed, strict=True)]
