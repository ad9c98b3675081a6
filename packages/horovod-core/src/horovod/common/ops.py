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

Framework packages submit through this module alone, so that one table keeps every operation's
objects alive and one set of counters names unnamed operations: each ``*_async`` that takes
tensors also takes ``context=``, any object (the framework's own tensors, what its wait needs to
build the result) kept with the operation until ``wait`` and read back with ``context(handle)``;
``op_name``/``op_names`` make the names the engine matches across ranks (docs/engine.md, "Python:
naming and keep-alive").

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

# The one table that keeps an operation's objects alive until it completes, shared by every
# framework package: handle -> (engine objects, caller's context). The engine objects are what
# was handed to the core (arrays, DLPack capsules, splits); the context is whatever the caller
# passed as ``context=`` (the framework tensors that own the memory, and what its wait needs to
# build its result), given back by ``context(handle)``. An entry is added once the core has
# accepted the operation and removed by ``wait``; ``reset`` empties it when the engine starts
# and after it stops (horovod.common.basics), since no operation of another run can complete.
# Only single dict operations touch it, which the GIL makes atomic: any thread may submit or wait.
_in_flight = {}

# (prefix, process set id) -> number of unnamed operations with that prefix submitted to that
# set. Automatic names count per prefix and per set, not by handle: names only have to agree
# among the ranks that take part, so an extra unnamed operation on one rank (a barrier, a join,
# an operation on a set the others are not in, another kind of operation) does not shift the
# names of the operations that follow. Reset with the table, so a re-initialised process
# (elastic mode) names its operations like a freshly started one.
_noname_counters = {}


def reset():
    """Forgets every operation in flight and restarts the automatic names. Called by
    ``horovod.common.basics`` before the engine starts and after it has stopped (only then can
    no operation still be writing into the tensors this table keeps alive)."""
    _in_flight.clear()
    _noname_counters.clear()


def op_name(prefix, name, process_set_id=0):
    """The engine's name of one tensor: ``<prefix>.<name>``, or ``<prefix>.noname.<k>`` when
    ``name`` is None, for the k-th (1, 2, ...) unnamed operation with this prefix on the set.

    Args:
        prefix: str, the operation's prefix (``allreduce``, ``grouped_allgather``,
            ``horovod_broadcast``, ...); the framework package chooses it, the engine matches
            tensors across ranks by the whole name.
        name: str or None; the caller's name.
        process_set_id: int, the id of the process set the operation runs on.

    Unnamed operations line up across ranks only when every member of the set submits its
    unnamed operations with this prefix in the same order."""
    if name is not None:
        return f'{prefix}.{name}'
    key = (prefix, process_set_id)
    k = _noname_counters.get(key, 0) + 1
    _noname_counters[key] = k
    return f'{prefix}.noname.{k}'


def op_names(prefix, name, process_set_id=0, count=None):
    """The engine's names of an operation's tensors, as a list: ``member_names(op_name(...),
    count)`` (one counter step for the whole group)."""
    return member_names(op_name(prefix, name, process_set_id), count)


def member_names(base, count=None):
    """``[base]`` when ``count`` is None (one tensor), else one name per member of a group of
    ``count`` tensors: ``<base>_<i+1>of<count>`` for member ``i`` (0-based)."""
    if count is None:
        return [base]
    return [f'{base}_{i + 1}of{count}' for i in range(count)]


def context(handle, default=None):
    """The ``context`` an operation was submitted with (None if none was given), or ``default``
    when ``handle`` is not in flight (never issued, a barrier or join, or already waited on)."""
    entry = _in_flight.get(handle)
    return default if entry is None else entry[1]


def in_flight(handle):
    """Whether ``handle`` was submitted with tensors and has not been waited on yet."""
    return handle in _in_flight



def operations():
    """The names of the operations ``submit`` accepts (the engine's registered collectives), sorted:
    ``['add_process_set', 'adasum', 'allgather', 'allreduce', ...]``."""
    return _core.operations()


def submit(op, inputs, names, outputs=None, options=None, process_set_id=0, stream=0, context=None):
    """Queues one operation in the engine; every framework package submits through here (the
    ``*_async`` functions below are its operations, named).

    Args:
        op: str, a name of ``operations()`` (``'allreduce'``, ``'reduce'``, ...).
        inputs: one DLPack tensor when ``names`` is a str, else a sequence of them, one per name
            (negotiated and executed together as a group when there are several); None for the
            operations without tensors (``'barrier'``, ``'join'``).
        names: str (one tensor, or the one name of an operation without tensors) or a list of str:
            the engine's names of the tensors (``op_name``/``op_names``).
        outputs: None (the engine allocates each output; ``wait`` returns them), or the output of
            the one tensor / a sequence with one output per input, each of the input's dtype and
            shape or the input itself (in place).
        options: None or a dict of what the operation reads: ``op`` (int, hvd.Average ...
            hvd.Product), ``prescale_factor`` and ``postscale_factor`` (float), ``root_rank``
            (int, a global rank), ``splits`` (alltoall), ``args`` (list of int, operations
            without tensors). An unknown key raises ValueError.
        process_set_id, stream: as in this module's docstring.
        context: any object kept with the operation until ``wait`` (``context(handle)``).

    The tensors (and outputs) are kept alive until ``wait``. Returns the handle. Raises
    ValueError for an unknown operation or option and as the operation's checks say;
    HorovodInternalError when Horovod is not running."""
    handle = _core.enqueue(op, inputs, outputs, names, options, process_set_id, stream)
    if inputs is not None:
        _in_flight[handle] = ((inputs, outputs, options), context)
    return handle


def allreduce_async(inputs, outputs, names, op, prescale_factor=1.0, postscale_factor=1.0,
                    process_set_id=0, stream=0, context=None):
    """Queues an allreduce of ``inputs`` (a group, negotiated and executed together, when there
    are several) into ``outputs`` (``outputs[i]`` may be ``inputs[i]``: in place).

    ``result = postscale_factor * REDUCE_ranks(prescale_factor * x)``; ``op`` is Average (0, Sum
    then division by the process set size), Sum (1), Adasum (2), Min (3), Max (4) or Product (5).
    Inputs and outputs must match in dtype and shape. A rank that has joined contributes zeros.
    Returns its handle; ``wait`` returns ``[None] * len(inputs)``."""
    return submit(allreduce_operation(op), inputs, names, outputs,
                  _reduction_options(op, prescale_factor, postscale_factor), process_set_id, stream, context)


def allreduce_one_async(input, output, name, op, prescale_factor=1.0, postscale_factor=1.0, process_set_id=0,
                        stream=0, context=None):
    """``allreduce_async([input], [output], [name], ...)`` without the lists: one tensor, the call
    a training step makes per gradient.

    Args:
        input: a C-contiguous DLPack tensor or capsule (or buffer-protocol array), CPU or CUDA, of
            any shape and a dtype the engine reduces.
        output: the same dtype and shape as ``input``, or ``input`` itself (in place; the core then
            imports it once).
        name: str, the engine's name of the tensor (``op_name``).
        op, prescale_factor, postscale_factor, process_set_id, stream, context: as for
            ``allreduce_async``.

    Returns the handle; ``wait`` returns ``[None]``. Raises ValueError and HorovodInternalError
    as ``allreduce_async`` does (a name in flight, an unknown op, a non-contiguous or non-tensor
    argument, an unknown set; Horovod not running)."""
    return submit(allreduce_operation(op), input, name, output,
                  _reduction_options(op, prescale_factor, postscale_factor), process_set_id, stream, context)


# The options of a reduction without scaling, one dict per reduce op made once: a training step
# submits one per gradient, and the engine then reads one key instead of three.
_UNSCALED = {op: {'op': op} for op in range(6)}


def _reduction_options(op, prescale_factor, postscale_factor):
    if prescale_factor == 1.0 and postscale_factor == 1.0:
        options = _UNSCALED.get(op)
        if options is not None:
            return options
    return {'op': op, 'prescale_factor': prescale_factor, 'postscale_factor': postscale_factor}


# hvd.Adasum: the allreduce whose reduction is adaptive summation, its own collective.
_ADASUM = 2


def allreduce_operation(op):
    """The engine's operation of an allreduce with reduce op ``op`` (an int, hvd.Average ...):
    ``'adasum'`` for hvd.Adasum, ``'allreduce'`` otherwise."""
    return 'adasum' if op == _ADASUM else 'allreduce'


def reduce_async(input, output, name, root_rank, op, prescale_factor=1.0, postscale_factor=1.0,
                 process_set_id=0, stream=0, context=None):
    """Queues a reduce of ``input`` to ``root_rank`` (a global rank, a member of the set) into
    ``output`` (the input's dtype, shape and device, or ``input`` itself: in place).

    On the root, ``output = postscale_factor * REDUCE_ranks(prescale_factor * x)`` with ``op``
    Average (0), Sum (1), Min (3), Max (4) or Product (5), as for ``allreduce_async``; on every
    other rank ``output`` is a copy of ``input`` (unchanged when in place). Raises ValueError at
    once for a root outside the set, Adasum, or an output that does not match; ranks that disagree
    on shape, dtype, op, scaling or root fail in ``wait`` with HorovodInternalError, as does a
    reduce while a rank has joined. Returns its handle; ``wait`` returns ``[None]``."""
    return submit('reduce', input, name, output,
                  {'op': op, 'prescale_factor': prescale_factor, 'postscale_factor': postscale_factor,
                   'root_rank': root_rank},
                  process_set_id, stream, context)


def allgather_async(inputs, names, process_set_id=0, stream=0, context=None):
    """Queues an allgather of each input (a group when there are several): the ranks' tensors
    concatenated along dimension 0 in set-rank order (first dimensions may differ between ranks;
    the others must agree; scalars are refused at negotiation). ``wait`` returns one
    engine-allocated array per input. Returns its handle."""
    return submit('allgather', inputs, names, None, None, process_set_id, stream, context)


def broadcast_async(tensors, names, root_rank, process_set_id=0, stream=0, context=None):
    """Queues a broadcast of the root's ``tensors`` into the other ranks' ``tensors`` (in place;
    the root's data is unchanged). ``root_rank`` is a global rank and must belong to the set.
    Returns its handle; ``wait`` returns ``[None] * len(tensors)``."""
    return submit('broadcast', tensors, names, tensors, {'root_rank': root_rank}, process_set_id, stream, context)


def alltoall_async(tensor, splits, name, process_set_id=0, stream=0, context=None):
    """Queues an alltoall of ``tensor`` (ndim >= 1) along dimension 0 (spec core.md §6.6).

    Args:
        splits: None (equal split; dim 0 must be divisible by the set size) or a sequence of ints
            / 1-D int32 array with one entry per set member: rows sent to each member, in set-rank
            order. Their sum may be below dim 0 (trailing rows are not sent), not above.

    ``wait`` returns ``[output, received_splits]``: the received blocks concatenated in sender
    order, and a 1-D int32 array of the rows received from each member. Raises ValueError at once
    for invalid splits. Returns its handle."""
    return submit('alltoall', tensor, name, None, {'splits': splits}, process_set_id, stream, context)


def reducescatter_async(inputs, names, op, prescale_factor=1.0, postscale_factor=1.0,
                        process_set_id=0, stream=0, context=None):
    """Queues a reducescatter of each input (a group when there are several): the element-wise
    reduction (``op``: Average (0) or Sum (1); any other op raises HorovodInternalError at once)
    split along dimension 0, set member ``r`` receiving ``dim0 // n + (r < dim0 % n)`` rows.
    ``wait`` returns one engine-allocated array per input. Returns its handle."""
    return submit('reducescatter', inputs, names, None,
                  {'op': op, 'prescale_factor': prescale_factor, 'postscale_factor': postscale_factor},
                  process_set_id, stream, context)


def barrier_async(process_set_id=0):
    """Queues a barrier over the set's ranks; ``wait`` returns ``[]`` once every member has
    reached it. Returns its handle."""
    return submit('barrier', None, 'barrier.noname', process_set_id=process_set_id)


def join_async():
    """Queues a join on the global set: this rank has no more data. Until every rank has joined,
    this rank contributes zeros to the allreduces the others submit. ``wait`` returns ``[last]``,
    the global rank (a Python int) that joined last. Returns its handle."""
    return submit('join', None, 'join.noname')


def join():
    """Joins and blocks until every rank has joined; returns the global rank that joined last."""
    h = join_async()
    return wait(h)[0]


def barrier(process_set_id=0):
    """Blocks until every member of the set has reached this barrier."""
    wait(barrier_async(process_set_id))


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
