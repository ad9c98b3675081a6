"""The bridge between TensorFlow and the horovod-core engine.

Every collective of ``horovod.tensorflow`` reaches the engine in two steps: ``start`` submits a
whole group of tensors (as numpy arrays viewing the TF buffers) and returns an integer handle at
once; ``finish`` waits for that handle and returns the results as numpy arrays. Eagerly the two
run back to back on the caller's thread. Inside a graph (``tf.function`` or a TF1 session) the
start node is one ``tf.numpy_function`` that takes the group's tensors and yields the handle (an
int64 scalar); the wait node (``blocking_node``) takes the handle and yields the group's
outputs. Neither raises inside the graph: each hands its error on as a status, and one check
node after the wait raises it with its TensorFlow error type (``_status_op``). Because the two
are separate nodes, several groups can be started before the first is waited on, so the engine
fuses and overlaps them; and the number of Python ops per group does not grow with the number of
tensors.

No wait may keep this rank's other collectives from being submitted. TensorFlow runs a graph's
ready nodes on a fixed pool of inter-op threads
(``tf.config.threading.set_inter_op_parallelism_threads``), and a synchronous kernel keeps its
thread until it returns. Were the wait such a kernel, a rank could fill every
thread with waits on groups that another rank has not submitted yet, while its own start nodes
that this other rank waits for sit unscheduled: each rank then waits for the other forever (one
``session.run`` of a few dozen independent allgathers, whose nodes the ranks happen to schedule in
different orders, is enough). So in a TF1 graph (and a ``tf.compat.v1.wrap_function``) the
wait's Python call runs inside a one-element ``tf.data`` pipeline: ``DatasetToSingleElement`` is
an asynchronous kernel (it hands the work to tf.data's own unbounded thread pool and gives its
inter-op thread back), and the pipeline's map function runs inline on that thread, so each
blocked call occupies a thread of its own. Start nodes never block, hence on every rank each start
runs as soon as its inputs exist, whatever the number of inter-op threads, the size of the graph
and the order the ranks pick: every group that all ranks submit completes.

``tf.function`` needs no such detour, and skips it (it costs 0.1 to 0.5 ms per wait and run on a
loaded 2-core machine, against 0.05 ms for a ``tf.numpy_function``): there TensorFlow's automatic
control dependencies chain every stateful node that takes no resource, so all of Horovod's nodes,
in the order the program creates them. A wait then blocks only after every earlier node of the
chain ran, on every rank, and nothing later can run before it anyway; the ranks must create their
collectives in the same order there (as they do when they run the same code). ``blocking_node``
picks the form by the graph it builds into.

Alignment: TensorFlow adopts a numpy array's buffer without copying only when it is 64-byte
aligned, and requires that alignment of buffers it receives through DLPack. Every array this
module hands back to TF is therefore 64-byte aligned: outputs the caller provides are allocated
aligned, and engine-allocated outputs (allgather, alltoall, reducescatter) that are not aligned
are copied once into aligned memory. String tensors never reach DLPack: the public wrappers
refuse them before anything is submitted.

Threading: ``start`` runs on the caller's thread (eager) or on a TF inter-op thread (graph);
``finish`` on the caller's thread (eager), on an inter-op thread (tf.function) or on a thread of
tf.data's unbounded pool (TF1 graph), and waits with the GIL released (inside the core).
horovod.common.ops' table of operations in flight keeps each group's input and output arrays
alive until its handle is finished, with what ``finish`` needs (the kind, the outputs, the names)
as the context.
"""

import numpy as np

from horovod.common import ops as _ops
from horovod.common.exceptions import HorovodInternalError
from horovod.tensorflow import _status_op

ALIGNMENT = 64


def aligned_empty(shape, dtype):
    """An uninitialised C-contiguous array whose data starts on a 64-byte boundary."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    raw = np.empty(count * dtype.itemsize + ALIGNMENT, dtype=np.uint8)
    offset = (-raw.ctypes.data) % ALIGNMENT
    return raw[offset:offset + count * dtype.itemsize].view(dtype).reshape(shape)


def aligned(array):
    """``array`` itself when it is C-contiguous and 64-byte aligned, else an aligned copy."""
    array = np.asarray(array)
    if array.flags["C_CONTIGUOUS"] and (array.size == 0 or array.ctypes.data % ALIGNMENT == 0):
        return array
    copy = aligned_empty(array.shape, array.dtype)
    copy[...] = array
    return copy


class EngineError(HorovodInternalError):
    """Base of the errors ``finish`` raises when the engine reports a failed collective."""


def _error_class(tf_error_class):
    # A TF error class and HorovodInternalError at once: TF code catches tf.errors.*, elastic
    # code catches HorovodInternalError.
    def __init__(self, message):
        tf_error_class.__init__(self, None, None, message)

    return type(tf_error_class.__name__, (tf_error_class, EngineError), {"__init__": __init__})


_error_classes = {}


def _tf_error(message):
    """The exception for an engine failure: ``tf.errors.FailedPreconditionError`` when the ranks
    disagreed (dtype, shape, op, root, ...), ``tf.errors.UnknownError`` otherwise (shutdown, a
    lost peer); both are also ``HorovodInternalError``."""
    import tensorflow as tf
    if "mismatch" not in _error_classes:
        _error_classes["mismatch"] = _error_class(tf.errors.FailedPreconditionError)
        _error_classes["other"] = _error_class(tf.errors.UnknownError)
    kind = "mismatch" if "ismatch" in message else "other"
    return _error_classes[kind](message)


def invalid_argument(message):
    """The exception for an argument the engine (or the binding) refuses when an operation is
    submitted: unknown or unregistered process set, this rank or the root outside the set, bad
    alltoall splits, a name already in flight. A ``tf.errors.InvalidArgumentError`` (core.md's
    status mapping) that is also a ``ValueError`` (the project's rule for bad input)."""
    import tensorflow as tf
    if "invalid" not in _error_classes:
        def __init__(self, message):
            tf.errors.InvalidArgumentError.__init__(self, None, None, message)

        _error_classes["invalid"] = type("InvalidArgumentError", (tf.errors.InvalidArgumentError, ValueError),
                                         {"__init__": __init__, "__module__": __name__})
    return _error_classes["invalid"](message)


def not_initialised(message):
    """``tf.errors.FailedPreconditionError`` that is also ``HorovodInternalError``: an operation
    submitted before ``hvd.init()`` or after ``hvd.shutdown()``."""
    _tf_error("mismatch")  # makes the classes
    return _error_classes["mismatch"](message)


def _op_title(kind):
    # "HorovodAllreduce", "HorovodReducescatter", ...
    return "Horovod" + kind.capitalize()


def _as_input(a):
    """What the engine reads: an eager ``tf.Tensor`` itself (read in place through DLPack; the
    callers never pass string tensors), or a C-contiguous, writable numpy array (DLPack cannot
    mark a buffer read-only, so the engine refuses read-only arrays)."""
    if hasattr(a, "__dlpack__") and not isinstance(a, np.ndarray):
        return a
    # np.asarray, not np.ascontiguousarray: the latter turns 0-d arrays into 1-d ones.
    a = np.asarray(a)
    if a.flags["C_CONTIGUOUS"] and a.flags["WRITEABLE"]:
        return a
    return np.array(a, order="C")


def _numpy_dtype(a):
    return a.dtype if isinstance(a, np.ndarray) else np.dtype(a.dtype.as_numpy_dtype)


def start(kind, arrays, names, params):
    """Submits one group to the engine and returns its handle (int).

    Args:
        kind: 'allreduce', 'allgather', 'broadcast', 'alltoall', 'reducescatter' or 'reduce'.
        arrays: list of numpy arrays or eager CPU ``tf.Tensor`` (alltoall: one, plus
            ``params['splits']``); never string tensors.
        names: one engine name per array.
        params: dict with ``set_id`` and, per kind, ``op``, ``prescale``, ``postscale``,
            ``root`` or ``splits`` (None or a 1-D int32 array): ``_COLLECTIVES``.

    Raises:
        tf.errors.InvalidArgumentError (also ValueError): what the engine refuses at submission
            (a name in flight, a bad root, bad splits, an unknown process set, this rank not a
            member).
        tf.errors.FailedPreconditionError (also HorovodInternalError): Horovod is not initialised
            or was shut down.
    """
    try:
        return _start(kind, arrays, names, params)
    except EngineError:
        raise
    except ValueError as error:
        if isinstance(error, tf_errors().InvalidArgumentError):
            raise
        raise invalid_argument(str(error)) from None
    except HorovodInternalError as error:
        raise not_initialised(str(error)) from None


def tf_errors():
    import tensorflow as tf
    return tf.errors


# One line per collective: how its outputs are made (None: the engine allocates them; "new": empty
# arrays of the inputs' shapes; "copy": copies of the inputs, which the engine overwrites in
# place), and the params it reads, as {param: option of horovod.common.ops.submit}.
_SCALED = {"op": "op", "prescale": "prescale_factor", "postscale": "postscale_factor"}
_COLLECTIVES = {
    "allreduce": ("new", _SCALED),
    "allgather": (None, {}),
    "broadcast": ("copy", {"root": "root_rank"}),
    "alltoall": (None, {"splits": "splits"}),
    "reducescatter": (None, _SCALED),
    "reduce": ("new", dict(_SCALED, root="root_rank")),
}


def _start(kind, arrays, names, params):
    if kind not in _COLLECTIVES:
        raise ValueError(f"unknown collective {kind!r}")
    made, read = _COLLECTIVES[kind]
    arrays = [_as_input(a) for a in arrays]
    options = {option: params.get(param) for param, option in read.items()}
    outputs = None
    if made == "new":
        outputs = [aligned_empty(tuple(a.shape), _numpy_dtype(a)) for a in arrays]
    elif made == "copy":
        # The inputs (eager tensors or arrays) are copied into ``outputs``: nothing else to keep.
        outputs = arrays = [aligned(np.array(a)) for a in arrays]
    operation = _ops.allreduce_operation(options["op"]) if kind == "allreduce" else kind
    if kind == "alltoall":
        return _ops.submit(operation, arrays[0], names[0], None, options, params["set_id"],
                           context=(kind, None, names))
    return _ops.submit(operation, arrays, names, outputs, options, params["set_id"], context=(kind, outputs, names))


def finish(handle):
    """Waits for ``handle`` and returns its results: a list of 64-byte-aligned numpy arrays, one
    per input (alltoall: ``[output, received_splits]``).

    Raises:
        tf.errors.FailedPreconditionError / tf.errors.UnknownError (also HorovodInternalError):
            the engine failed the operation (the message names the op and tensor and says why).
        ValueError: ``handle`` is unknown or already finished.
    """
    handle = int(handle)
    entry = _ops.context(handle)
    if entry is None:
        raise ValueError(f"unknown Horovod handle {handle!r}: never issued or already waited on")
    kind, outputs, names = entry
    try:
        results = _ops.wait(handle)
    except HorovodInternalError as error:
        raise _tf_error(f"{_op_title(kind)} of {', '.join(names[:3])}"
                        f"{' ...' if len(names) > 3 else ''} failed: {error}") from None
    if outputs is not None:
        return outputs
    return [_to_numpy(r) for r in results]


def _to_numpy(result):
    """An engine-allocated output as a 64-byte-aligned numpy array. numpy imports no bfloat16
    through DLPack: such an output becomes a TensorFlow tensor over the same memory (the engine
    allocates 64-byte aligned, as TensorFlow requires), whose numpy value shares it too."""
    try:
        return aligned(np.from_dlpack(result))
    except RuntimeError:  # numpy's 'Unsupported dtype in DLTensor.'
        import tensorflow as tf
        return aligned(tf.experimental.dlpack.from_dlpack(result.__dlpack__()).numpy())


def run(kind, arrays, names, params):
    """``finish(start(...))``."""
    return finish(start(kind, arrays, names, params))


def join():
    """Joins the global set and waits; returns the last rank to join (int)."""
    try:
        return int(_ops.join())
    except HorovodInternalError as error:
        raise _tf_error(f"HorovodJoin failed: {error}") from None



def start_node(submit, inputs, name):
    """The graph node that submits a group: calls ``submit(*arrays)`` (numpy in, the handle out)
    and never raises. Returns the list ``[handle, code, message]`` (int64, int32, uint8 bytes):
    what ``submit`` raised travels as a status (``_status_op``) to the wait, which raises it
    through its check node; one check per collective, not two."""
    import tensorflow as tf

    return list(tf.numpy_function(_status_op.guard(submit, [tf.int64]), list(inputs),
                                  [tf.int64, tf.int32, tf.uint8], stateful=True, name=name))


def finish_started(handle, code, message):
    """``finish(handle)`` for the outputs of ``start_node``: raises the start's error instead
    when it failed (code != 0), as a ``tf.errors.OpError`` with that code (all the check node
    reads)."""
    import tensorflow as tf

    if int(code):
        raise tf.errors.OpError(None, None, bytes(message).decode('utf-8', 'replace'), int(code))
    return finish(handle)


def blocking_node(fn, inputs, dtypes, name):
    """Graph nodes that call ``fn(*arrays)`` (numpy in, a list of numpy arrays out, as for
    ``tf.numpy_function``) such that a blocked ``fn`` cannot keep this rank's other collectives
    from being submitted (module docstring): a ``tf.numpy_function`` inside ``tf.function``,
    else a one-element tf.data pipeline that holds no inter-op thread while ``fn`` blocks.

    Args:
        fn: a Python callable that may block, e.g. ``finish``; it gets the numpy values of
            ``inputs`` and returns one array per entry of ``dtypes``.
        inputs: a non-empty list of graph tensors.
        dtypes: the ``tf.DType`` of each output.
        name: the name of the node that yields the outputs.

    Returns:
        A list of tensors of unknown shape (the caller sets what it knows), one per dtype. When
        they are evaluated, ``fn``'s exception reaches the caller with the TensorFlow error type
        eager mode raises (a ``tf.errors.OpError`` keeps its class, a ValueError is an
        ``InvalidArgumentError``; see ``_status_op``), in ``tf.function`` and in TF1 graphs alike.
    """
    import tensorflow as tf
    from tensorflow.python.data.ops.map_op import _MapDataset

    dtypes = list(dtypes)
    # fn's status travels as two more outputs (code, message) to the check node (_status_op):
    # raised inside the Python call, TensorFlow would keep only a few exception types' codes.
    guarded = _status_op.guard(fn, dtypes)
    all_dtypes = dtypes + [tf.int32, tf.uint8]
    # True while tf.function builds the graph with automatic control dependencies; False in TF1
    # graphs and wrap_function (and, should TensorFlow rename it, everywhere: the tf.data form is
    # right in every graph, only slower).
    if getattr(tf.compat.v1.get_default_graph(), '_add_control_dependencies', False):
        outputs = tf.numpy_function(guarded, list(inputs), all_dtypes, stateful=True, name=f'{name}Call')
        return _status_op.check(outputs[-2], outputs[-1], outputs[:-2], name)

    @tf.autograph.experimental.do_not_convert
    def call(*values):
        return tuple(tf.numpy_function(guarded, list(values), all_dtypes, stateful=True))

    # use_inter_op_parallelism=False: tf.data runs the map function with TensorFlow's
    # single-threaded executor, inline on the thread that DatasetToSingleElement took from
    # tf.data's unbounded pool (idle ones are reused: no thread is started per call). With the
    # default, the function's kernels would go back to the inter-op pool. Dataset.map does not
    # expose the flag; _MapDataset is the class it builds (TensorFlow 2.16 to 2.21 at least).
    dataset = _MapDataset(tf.data.Dataset.from_tensors(tuple(inputs)), call, use_inter_op_parallelism=False)
    unknown = [tf.TensorShape(None)] * len(all_dtypes)
    outputs = tf.raw_ops.DatasetToSingleElement(dataset=tf.data.experimental.to_variant(dataset),
                                                output_types=all_dtypes, output_shapes=unknown,
                                                name=f'{name}Call')
    return _status_op.check(outputs[-2], outputs[-1], list(outputs[:-2]), name)
