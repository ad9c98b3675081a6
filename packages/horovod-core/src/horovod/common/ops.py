"""Framework-neutral collectives over any DLPack tensor (see packages/horovod-core/README.md).

Every ``*_async`` function queues an operation in the engine and returns its handle at once;
``wait`` blocks (with the GIL released) until it is done. Tensors are used in place, without
copies: they must be C-contiguous, on the CPU or (builds with NCCL) on a CUDA device, and stay
alive until the handle is waited on (this module keeps a reference until then).

GPU tensors: ``stream`` is the framework's current CUDA stream of the tensor's device, as an int
(``torch.cuda.current_stream(device).cuda_stream``; 0 is the legacy default stream). The core
records an event on it at submission and reads the tensor only after that event; before the
handle completes it makes ``stream`` wait for the collective, so work queued on ``stream`` after
``wait`` returns sees the result. Outputs the engine allocates are on the input's device.
``stream`` is ignored for CPU tensors.

``process_set_id`` selects the process set (0: the global set, every rank). Tensor names are
matched across the ranks of that set; ``root_rank`` is always a global rank.

Errors: a mistake the caller can see at submission (duplicate name in flight, bad root rank,
unsupported dtype, non-contiguous tensor, unknown process set, this rank not a member, bad alltoall
splits) raises ``ValueError`` from the ``*_async`` call; Horovod not initialised or already shut
down raises ``HorovodInternalError``; a failure negotiated among the ranks (ranks disagreeing on
shape or dtype, an op other than allreduce while a rank has joined) or a lost peer raises
``HorovodInternalError`` from ``wait`` on every rank.
"""

from horovod.common import _core

_in_flight = {}


def new_handle():
    """The next handle of this process's counter (1, 2, ...; restarts after init)."""
    return _core.new_handle()


def allreduce_async(handle, inputs, outputs, names, op, prescale_factor=1.0, postscale_factor=1.0,
                    process_set_id=0, stream=0):
    """Queues an allreduce of ``inputs`` (a group, negotiated and executed together, when there
    are several) into ``outputs`` (``outputs[i]`` may be ``inputs[i]``: in place).

    ``result = postscale_factor * REDUCE_ranks(prescale_factor * x)``; ``op`` is Average (0, Sum
    then division by the process set size), Sum (1), Min (3), Max (4) or Product (5). Inputs and
    outputs must match in dtype and shape. A rank that has joined contributes zeros. Returns
    ``handle``; ``wait`` returns ``[None] * len(inputs)``."""
    _core.enqueue_allreduce(handle, inputs, outputs, names, op, prescale_factor, postscale_factor,
                            process_set_id, stream)
    _in_flight[handle] = (inputs, outputs)
    return handle


def allgather_async(handle, inputs, names, process_set_id=0, stream=0):
    """Queues an allgather of each input (a group when there are several): the ranks' tensors
    concatenated along dimension 0 in set-rank order (first dimensions may differ between ranks;
    the others must agree; scalars are refused at negotiation). ``wait`` returns one
    engine-allocated array per input. Returns ``handle``."""
    _core.enqueue_allgather(handle, inputs, names, process_set_id, stream)
    _in_flight[handle] = (inputs,)
    return handle


def broadcast_async(handle, tensors, names, root_rank, process_set_id=0, stream=0):
    """Queues a broadcast of the root's ``tensors`` into the other ranks' ``tensors`` (in place;
    the root's data is unchanged). ``root_rank`` is a global rank and must belong to the set.
    Returns ``handle``; ``wait`` returns ``[None] * len(tensors)``."""
    _core.enqueue_broadcast(handle, tensors, names, root_rank, process_set_id, stream)
    _in_flight[handle] = (tensors,)
    return handle


def alltoall_async(handle, tensor, splits, name, process_set_id=0, stream=0):
    """Queues an alltoall of ``tensor`` (ndim >= 1) along dimension 0 (spec core.md §6.6).

    Args:
        splits: None (equal split; dim 0 must be divisible by the set size) or a sequence of ints
            / 1-D int32 array with one entry per set member: rows sent to each member, in set-rank
            order. Their sum may be below dim 0 (trailing rows are not sent), not above.

    ``wait`` returns ``[output, received_splits]``: the received blocks concatenated in sender
    order, and a 1-D int32 array of the rows received from each member. Raises ValueError at once
    for invalid splits. Returns ``handle``."""
    _core.enqueue_alltoall(handle, tensor, splits, name, process_set_id, stream)
    _in_flight[handle] = (tensor, splits)
    return handle


def reducescatter_async(handle, inputs, names, op, prescale_factor=1.0, postscale_factor=1.0,
                        process_set_id=0, stream=0):
    """Queues a reducescatter of each input (a group when there are several): the element-wise
    reduction (``op``: Average (0) or Sum (1); any other op raises HorovodInternalError at once)
    split along dimension 0, set member ``r`` receiving ``dim0 // n + (r < dim0 % n)`` rows.
    ``wait`` returns one engine-allocated array per input. Returns ``handle``."""
    _core.enqueue_reducescatter(handle, inputs, names, op, prescale_factor, postscale_factor,
                                process_set_id, stream)
    _in_flight[handle] = (inputs,)
    return handle


def barrier_async(handle, process_set_id=0):
    """Queues a barrier over the set's ranks; ``wait`` returns ``[]`` once every member has
    reached it. Returns ``handle``."""
    _core.enqueue_barrier(handle, process_set_id)
    return handle


def join_async(handle):
    """Queues a join on the global set: this rank has no more data. Until every rank has joined,
    this rank contributes zeros to the allreduces the others submit. ``wait`` returns ``[last]``,
    the global rank (a Python int) that joined last. Returns ``handle``."""
    _core.enqueue_join(handle)
    return handle


def join():
    """Joins and blocks until every rank has joined; returns the global rank that joined last."""
    h = join_async(new_handle())
    return wait(h)[0]


def barrier(process_set_id=0):
    """Blocks until every member of the set has reached this barrier."""
    wait(barrier_async(new_handle(), process_set_id))


def poll(handle):
    """Whether the operation has finished (successfully or not). Raises ValueError for an unknown
    handle."""
    return _core.poll(handle)


def wait(handle):
    """Waits for the operation and returns one entry per tensor: None where the caller provided the
    output, or an engine-allocated array (a DLPack producer that also offers the buffer protocol;
    wrap it with ``torch.from_dlpack``, or ``numpy.asarray``, zero copy: numpy before 1.25 cannot
    import bool arrays through ``numpy.from_dlpack``). Raises HorovodInternalError when the
    operation failed."""
    try:
        return _core.wait(handle)
    finally:
        _in_flight.pop(handle, None)
