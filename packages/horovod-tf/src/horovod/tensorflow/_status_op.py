"""Carries a Python call's error out of a graph with its TensorFlow error type.

Inside a graph, Horovod's Python code runs in ``tf.numpy_function`` nodes. TensorFlow's py_func
kernel turns an exception raised there into a status by the exception's Python type alone:
ValueError and TypeError become INVALID_ARGUMENT, NotImplementedError UNIMPLEMENTED, and
everything else UNKNOWN, including a ``tf.errors.FailedPreconditionError``, whose code is dropped
(py_func.cc: "TODO: Check if exception is an OpError and use the OpError.error_code"). A rank
mismatch then reached ``Session.run`` or a ``tf.function`` call as ``tf.errors.UnknownError``,
where eager mode raises ``FailedPreconditionError``.

So the Python call does not raise: ``guard`` makes it return its status as two extra outputs, an
int32 error code (0 when it succeeded) and the message as uint8 bytes, and ``check`` adds the
node ``HorovodStatusCheck`` that forwards the call's outputs when the code is 0 and otherwise
fails with that code and message, which TensorFlow (and tf.data around it) reports with the
matching ``tf.errors`` class. The op has no compiled library of its own: it is registered at run
time through TensorFlow's stable C API (``tensorflow/c/ops.h`` and ``kernels.h``, the interface of
pluggable kernels), and its CPU kernel is a ctypes callback into this module. Without that C API
(an unexpected TensorFlow build) ``check`` falls back to a ``tf.numpy_function`` that re-raises,
which gives the py_func mapping above.

Threading: the kernel runs on a TensorFlow inter-op thread and takes the GIL (ctypes does) only
to read the code and, on failure, the message; it never blocks.
"""

import ctypes
import glob
import os
import threading
import traceback

import numpy as np

OP_NAME = 'HorovodStatusCheck'

_lock = threading.Lock()
_state = {}  # 'available': bool once registration was tried; 'api', 'callbacks' when it worked


def status_of(error):
    """``(code, message)`` of an exception, as TensorFlow's error codes: a ``tf.errors.OpError``
    keeps its code; ValueError and TypeError are INVALID_ARGUMENT, NotImplementedError
    UNIMPLEMENTED, anything else UNKNOWN (with its traceback, as py_func reports it)."""
    import tensorflow as tf
    if isinstance(error, tf.errors.OpError):
        return error.error_code, error.message
    if isinstance(error, (ValueError, TypeError)):
        code = tf.errors.INVALID_ARGUMENT
    elif isinstance(error, NotImplementedError):
        code = tf.errors.UNIMPLEMENTED
    else:
        code = tf.errors.UNKNOWN
    return code, ''.join(traceback.format_exception(error)).rstrip()


_OK = (np.int32(0), np.zeros(0, np.uint8))


def guard(fn, dtypes):
    """``fn`` (numpy arrays in, a list of arrays out, one per ``dtypes`` entry) made to return
    its outputs followed by the code and message instead of raising: on an exception the outputs
    are empty placeholders of the right dtypes, never read, since ``check`` then fails."""
    dtypes = list(dtypes)

    def call(*arrays):
        try:
            outputs = fn(*arrays)
            outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
            return outputs + list(_OK)
        except Exception as error:  # noqa: BLE001 - every error is handed to the check node
            code, message = status_of(error)
            placeholders = [np.zeros(0, d.as_numpy_dtype) for d in dtypes]
            return placeholders + [np.int32(code), np.frombuffer(message.encode('utf-8', 'replace'), np.uint8)]

    return call


def check(code, message, values, name):
    """The node that forwards ``values`` (a list of tensors) when ``code`` (int32 scalar) is 0,
    and otherwise fails the graph run with that TensorFlow error code and ``message`` (uint8
    bytes, UTF-8). Returns the list of forwarded tensors (shapes unknown)."""
    import tensorflow as tf
    if _register():
        from tensorflow.python.framework import op_def_library
        _, _, op, _ = op_def_library._apply_op_helper(OP_NAME, code=code, message=message, values=list(values),
                                                      name=name)
        return list(op.outputs)

    def reraise(code_value, message_bytes, *arrays):
        # py_func keeps these two codes for these Python types, and makes the rest UNKNOWN.
        code_value, message = int(code_value), bytes(message_bytes).decode('utf-8', 'replace')
        if code_value == tf.errors.INVALID_ARGUMENT:
            raise ValueError(message)
        if code_value == tf.errors.UNIMPLEMENTED:
            raise NotImplementedError(message)
        if code_value:
            raise tf.errors.OpError(None, None, message, code_value)
        return list(arrays)

    outputs = tf.numpy_function(reraise, [code, message] + list(values), [v.dtype for v in values],
                                stateful=True, name=name)
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


def _framework_library():
    import tensorflow as tf
    for pattern in ('libtensorflow_framework.so.*', 'libtensorflow_framework.*.dylib', 'libtensorflow_framework.so'):
        found = sorted(glob.glob(os.path.join(tf.sysconfig.get_lib(), pattern)))
        if found:
            return ctypes.CDLL(found[0])
    raise OSError('libtensorflow_framework not found')


class _Api:
    """The C API functions the op needs, with their signatures (tensorflow/c/c_api.h, ops.h,
    kernels.h, tf_status.h, tf_tensor.h)."""

    create_t = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
    compute_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
    delete_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

    def __init__(self, lib):
        p, s, i = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int

        def bind(name, restype, *argtypes):
            function = getattr(lib, name)
            function.restype, function.argtypes = restype, list(argtypes)
            setattr(self, name[3:], function)

        bind('TF_NewStatus', p)
        bind('TF_DeleteStatus', None, p)
        bind('TF_GetCode', i, p)
        bind('TF_Message', s, p)
        bind('TF_SetStatus', None, p, i, s)
        bind('TF_NewOpDefinitionBuilder', p, s)
        bind('TF_OpDefinitionBuilderAddInput', None, p, s)
        bind('TF_OpDefinitionBuilderAddOutput', None, p, s)
        bind('TF_OpDefinitionBuilderAddAttr', None, p, s)
        bind('TF_OpDefinitionBuilderSetIsStateful', None, p, ctypes.c_bool)
        bind('TF_RegisterOpDefinition', None, p, p)
        bind('TF_NewKernelBuilder', p, s, s, self.create_t, self.compute_t, self.delete_t)
        bind('TF_RegisterKernelBuilder', None, s, p, p)
        bind('TF_NumInputs', i, p)
        bind('TF_GetInput', None, p, i, ctypes.POINTER(p), p)
        bind('TF_SetOutput', None, p, i, p, p)
        bind('TF_OpKernelContext_Failure', None, p, p)
        bind('TF_TensorData', p, p)
        bind('TF_TensorByteSize', ctypes.c_size_t, p)
        bind('TF_DeleteTensor', None, p)


def _compute(api, context):
    """The kernel: inputs ``code``, ``message``, ``values...``; outputs ``values...``."""
    status = api.NewStatus()
    tensor = ctypes.c_void_p()
    try:
        api.GetInput(context, 0, ctypes.byref(tensor), status)
        code = ctypes.c_int32.from_address(api.TensorData(tensor)).value
        api.DeleteTensor(tensor)
        if code:
            api.GetInput(context, 1, ctypes.byref(tensor), status)
            size = api.TensorByteSize(tensor)
            message = ctypes.string_at(api.TensorData(tensor), size) if size else b''
            api.DeleteTensor(tensor)
            api.SetStatus(status, code, message)
            api.OpKernelContext_Failure(context, status)
            return
        for index in range(2, api.NumInputs(context)):
            api.GetInput(context, index, ctypes.byref(tensor), status)
            if api.GetCode(status) == 0:
                api.SetOutput(context, index - 2, tensor, status)  # shares the buffer, no copy
            api.DeleteTensor(tensor)
            if api.GetCode(status):
                api.OpKernelContext_Failure(context, status)
                return
    finally:
        api.DeleteStatus(status)


def _register():
    """Registers the op and its CPU kernel once per process; False when the C API is missing."""
    if 'available' in _state:
        return _state['available']
    with _lock:
        if 'available' in _state:
            return _state['available']
        try:
            _state['available'] = _register_locked()
        except (OSError, AttributeError):
            _state['available'] = False
        return _state['available']


def _register_locked():
    import tensorflow as tf
    from tensorflow.python.framework import op_def_registry
    if op_def_registry.get(OP_NAME) is not None:
        # Registered by another copy of this module (whose kernel callbacks then live on).
        return True
    api = _Api(_framework_library())
    # Kept for the life of the process: TensorFlow holds raw pointers to these callbacks.
    callbacks = (api.create_t(lambda construction: None),
                 api.compute_t(lambda kernel, context: _compute(api, context)),
                 api.delete_t(lambda kernel: None))
    status = api.NewStatus()
    try:
        builder = api.NewOpDefinitionBuilder(OP_NAME.encode())
        api.OpDefinitionBuilderAddInput(builder, b'code: int32')
        api.OpDefinitionBuilderAddInput(builder, b'message: uint8')
        api.OpDefinitionBuilderAddInput(builder, b'values: T')
        api.OpDefinitionBuilderAddOutput(builder, b'outputs: T')
        api.OpDefinitionBuilderAddAttr(builder, b'T: list(type) >= 0')
        # Stateful: never pruned or folded, so a failure is always reported.
        api.OpDefinitionBuilderSetIsStateful(builder, True)
        api.RegisterOpDefinition(builder, status)
        if api.GetCode(status):
            return False
        kernel = api.NewKernelBuilder(OP_NAME.encode(), b'CPU', *callbacks)
        api.RegisterKernelBuilder(OP_NAME.encode(), kernel, status)
        if api.GetCode(status):
            return False
    finally:
        api.DeleteStatus(status)
    _state['api'], _state['callbacks'] = api, callbacks
    tf.no_gradient(OP_NAME)
    return True
