"""MXNet NDArrays to and from the engine's DLPack tensors.

MXNet 1.x arrays have no ``__dlpack__``: they export a ``"dltensor"`` capsule through
``to_dlpack_for_read`` (which first waits until MXNet's engine has finished every pending write
to the array) and ``to_dlpack_for_write`` (which also waits for pending reads). The core's
bindings take such a capsule as it is (nanobind imports capsules as well as ``__dlpack__``
objects) and consume it, so a capsule must be made only right before it is handed over: an
unconsumed MXNet capsule fails in MXNet's own capsule destructor under Python 3.11.

MXNet describes bool as an unsigned integer of 1 bit, while DLPack (>= 0.8) and the core use type
code ``kDLBool`` with 8 bits; both store one byte per element, so only the type tag in the
capsule's ``DLTensor`` is rewritten, in each direction, and no data is copied.
"""

import ctypes

import mxnet as mx
import numpy as np

# DLPack type codes (dlpack.h, DLDataTypeCode).
_DL_UINT = 1
_DL_BOOL = 6

# Byte offset of ``dtype`` in ``DLTensor`` (the first member of ``DLManagedTensor``): after
# ``void* data`` (8 bytes), ``DLDevice device`` (two int32) and ``int32_t ndim``.
_DTYPE_OFFSET = 8 + 8 + 4


class _DLDataType(ctypes.Structure):
    _fields_ = [('code', ctypes.c_uint8), ('bits', ctypes.c_uint8), ('lanes', ctypes.c_uint16)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _dtype(capsule):
    return _DLDataType.from_address(_capsule_pointer(capsule, b'dltensor') + _DTYPE_OFFSET)


def _retag(capsule, code, bits):
    dtype = _dtype(capsule)
    dtype.code, dtype.bits = code, bits
    return capsule


def for_read(array):
    """A capsule the engine reads ``array`` through, once MXNet has finished writing it."""
    capsule = array.to_dlpack_for_read()
    return _retag(capsule, _DL_BOOL, 8) if array.dtype == np.bool_ else capsule


def for_write(array):
    """A capsule the engine writes ``array`` through, once MXNet has finished using it."""
    capsule = array.to_dlpack_for_write()
    return _retag(capsule, _DL_BOOL, 8) if array.dtype == np.bool_ else capsule


def to_ndarray(result):
    """Wraps an engine-allocated array (an object with ``__dlpack__``) as a CPU NDArray without a
    copy; the NDArray keeps the engine's buffer alive."""
    capsule = result.__dlpack__()
    if _dtype(capsule).code == _DL_BOOL:
        _retag(capsule, _DL_UINT, 1)
    return mx.nd.from_dlpack(capsule)
