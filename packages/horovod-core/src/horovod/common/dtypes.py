"""The engine's element types, the one table the framework packages map their dtypes onto.

Each framework names its dtypes as the engine does (``torch.float16``, ``tf.float16``,
``numpy.dtype('float16')``), so a framework's list of the dtypes one of its operations accepts is
one line: ``of(torch, 'int32 int64 float32')``. Which dtypes each framework accepts for which
operation stays the framework's choice (it follows what upstream Horovod accepted there); this
table says what the engine itself knows of each one.
"""

from typing import NamedTuple


class DType(NamedTuple):
    """One element type of the engine (csrc/common/common.h ``DataType``).

    Attributes:
        name: str, the name numpy, torch and TensorFlow give it (``'bfloat16'``: numpy has none).
        code: int, the engine's ``DataType`` value.
        size: int, bytes per element.
        is_float: bool, a floating-point type (scaling keeps fractions; integers truncate).
        reduced: bool, whether the engine reduces it (allreduce, reducescatter, reduce) on the CPU;
            the others are moved only (allgather, broadcast, alltoall).
    """
    name: str
    code: int
    size: int
    is_float: bool
    reduced: bool


# One line per dtype, in the engine's order.
DTYPES = {d.name: d for d in (
    DType('uint8', 0, 1, False, True),
    DType('int8', 1, 1, False, True),
    DType('uint16', 2, 2, False, True),
    DType('int16', 3, 2, False, True),
    DType('int32', 4, 4, False, True),
    DType('int64', 5, 8, False, True),
    DType('float16', 6, 2, True, True),
    DType('float32', 7, 4, True, True),
    DType('float64', 8, 8, True, True),
    DType('bool', 9, 1, False, True),
    DType('bfloat16', 10, 2, True, True),
)}


def of(namespace, names):
    """The framework dtypes named ``names``, as a tuple in the order given.

    Args:
        namespace: a module whose attributes are the dtypes (``torch``, ``tensorflow``), or a
            callable from a name to the dtype (``numpy.dtype``).
        names: str, engine dtype names separated by spaces (``'int32 float32'``).

    Raises:
        ValueError: a name that is not one of the engine's (``DTYPES``).
    """
    result = []
    for name in names.split():
        if name not in DTYPES:
            raise ValueError(f'{name!r} is not an engine dtype; expected one of {", ".join(DTYPES)}.')
        result.append(namespace(name) if callable(namespace) else getattr(namespace, name))
    return tuple(result)
