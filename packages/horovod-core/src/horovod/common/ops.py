"""Framework-neutral collectives over any DLPack tensor (see packages/horovod-core/README.md).

Every ``*_async`` function queues an operation in the engine and returns its handle at once;
``wait`` blocks (with the GIL released) until it is done. Tensors are used in place, without
copies: they must be C-contiguous, on the CPU, and stay alive until the handle is waited on (this
module keeps a reference until then).

Errors: a mistake the caller can see at submission (duplicate name in flight, bad root rank,
unsupported dtype, non-contiguous tensor) raises ``ValueError`` from the ``*_async`` call; Horovod
not initialised or already shut down raises ``HorovodInternalError``; a failure negotiated among the
ranks (for example ranks disagreeing on shape or dtype) or a lost peer raises
``HorovodInternalError`` from ``wait`` on every rank.
"""

from horovod.common import _core

_in_flight = {}


def new_handle():
    """The next handle of this process's counter (1, 2, ...; restarts after init)."""
    return _core.new_handle()


def allreduce_async(handle, inputs, outputs, names, op, prescale_factor=1.0, postscale_factor=1.0,
                    process_set_id=0):
    """Queues an allreduce of ``inputs`` (a group, negotiated and executed together, when there
    are several) into ``outputs`` (``outputs[i]`` may be ``inputs[i]``: in place).

    ``result = postscale_factor * REDUCE_ranks(prescale_factor * x)``; ``op`` is Average (0, Sum
    then division by the process set size), Sum (1), Min (3), Max (4) or Product (5). Inputs and
    outputs must match in dtype and shape. Returns ``handle``."""
    _core.enqueue_allreduce(handle, inputs, outputs, names, op, prescale_factor, postscale_factor,
                            process_set_id)
    _in_flight[handle] = (inputs, outputs)
    return handle


def allgather_async(handle, inputs, names, process_set_id=0):
    """Queues an allgather of each input: the ranks' tensors concatenated along dimension 0 in rank
    order (first dimensions may differ between ranks; the others must agree). The outputs are
    allocated by the engine and returned by ``wait``. Returns ``handle``."""
    _core.enqueue_allgather(handle, inputs, names, process_set_id)
    _in_flight[handle] = (inputs,)
    return handle


def broadcast_async(handle, tensors, names, root_rank, process_set_id=0):
    """Queues a broadcast of the root's ``tensors`` into the other ranks' ``tensors`` (in place;
    the root's data is unchanged). ``root_rank`` is a global rank. Returns ``handle``."""
    _core.enqueue_broadcast(handle, tensors, names, root_rank, process_set_id)
    _in_flight[handle] = (tensors,)
    return handle


def poll(handle):
    """Whether the operation has finished (successfully or not). Raises ValueError for an unknown
    handle."""
    return _core.poll(handle)


def wait(handle):
    """Waits for the operation and returns one entry per tensor: None where the caller provided the
    output, or an engine-allocated array (a DLPack producer; wrap it with ``torch.from_dlpack`` or
    ``numpy.from_dlpack``, zero copy). Raises HorovodInternalError when the operation failed."""
    try:
        return _core.wait(handle)
    finally:
        _in_flight.pop(handle, None)
