"""Python objects over the engine's collectives, shared by every binding's broadcast_object and
allgather_object.

A binding passes one function that runs its broadcast (or allgather) on a 1-D numpy array
under the engine name ``<base>.sz`` or ``<base>.t``. Two collectives follow:
1. a header, int32 ``[status, nbytes]`` per rank: status 0 when the object was serialised,
   1 when serialising it raised;
2. the bytes: the cloudpickle of the object, or, after a failure, the text of the exception.
So a rank whose object cannot be serialised still takes part in both collectives, and the other
ranks raise instead of waiting for bytes that never come. numpy and cloudpickle are the
bindings' dependencies (not the core's): imported when called.
"""

import io

_OK, _FAILED = 0, 1

# Default base names: the same on every rank, whatever the local object is (the idiom
# ``broadcast_object(obj if rank() == root else None)`` gives the ranks objects of different types).
BROADCAST_NAME = "broadcast_object"
ALLGATHER_NAME = "allgather_object"


class ObjectTransferError(RuntimeError):
    """Raised on the ranks of broadcast_object / allgather_object whose own part worked, when
    another rank could not serialise its object (the message names that rank and its error).
    The failing rank raises its own exception."""


def _serialise(obj):
    """(status, bytes, exception): the object's cloudpickle, or the exception's text."""
    import cloudpickle
    try:
        buffer = io.BytesIO()
        cloudpickle.dump(obj, buffer)
        return _OK, buffer.getvalue(), None
    except Exception as e:  # noqa: BLE001 - reported to every rank, then raised here
        return _FAILED, f"{type(e).__name__}: {e}".encode("utf-8", "replace"), e


def _array(data):
    import numpy as np
    # A writable copy: engines take no read-only buffers.
    return np.frombuffer(bytearray(data), dtype=np.uint8)


def broadcast_object(obj, is_root, root_rank, broadcast):
    """Sends ``obj`` from the root.

    Args:
        obj: the object (used on the root only).
        is_root (bool): whether this rank is the root.
        root_rank (int): the root's rank, for messages.
        broadcast: ``broadcast(array, suffix) -> array``: the binding's broadcast from the root of
            a 1-D numpy array (int32 header, then uint8 bytes), engine name ``<base><suffix>``,
            ``suffix`` being ``'.sz'`` or ``'.t'``; on other ranks ``array`` has the right shape
            and dtype and its content is ignored.

    Returns:
        The root's object (the root gets ``obj`` itself, the others an unpickled copy).

    Raises:
        the root's own exception, on the root, when ``obj`` cannot be serialised;
        ObjectTransferError: on the other ranks in that case, naming the root and its error.
    """
    import cloudpickle
    import numpy as np
    if is_root:
        status, data, error = _serialise(obj)
        header = np.array([status, len(data)], dtype=np.int32)
    else:
        header = np.zeros(2, dtype=np.int32)
    header = np.asarray(broadcast(header, ".sz"))
    status, nbytes = int(header[0]), int(header[1])
    payload = _array(data) if is_root else np.zeros(nbytes, dtype=np.uint8)
    payload = np.asarray(broadcast(payload, ".t"))
    if status != _OK:
        if is_root:
            raise error
        raise ObjectTransferError(f"broadcast_object: root rank {root_rank} could not serialise its object: "
                                  f"{payload.tobytes().decode('utf-8', 'replace')}")
    return obj if is_root else cloudpickle.loads(payload.tobytes())


def allgather_object(obj, allgather):
    """Gathers every rank's ``obj``.

    Args:
        obj: this rank's object.
        allgather: ``allgather(array, suffix) -> array``: the binding's allgather of a 1-D numpy
            array (int32 header of 2 elements, then uint8 bytes; the result is the members' arrays
            concatenated in rank order), engine name ``<base><suffix>``.

    Returns:
        list of the members' objects in rank order (unpickled copies, this rank's included).

    Raises:
        this rank's own exception when its ``obj`` cannot be serialised;
        ObjectTransferError: on the other ranks in that case, naming the failed ranks and errors.
    """
    import cloudpickle
    import numpy as np
    status, data, error = _serialise(obj)
    headers = np.asarray(allgather(np.array([status, len(data)], dtype=np.int32), ".sz")).reshape(-1, 2)
    gathered = np.asarray(allgather(_array(data), ".t"))
    offsets = np.concatenate([[0], np.cumsum(headers[:, 1])])
    chunks = [gathered[offsets[i]:offsets[i + 1]].tobytes() for i in range(len(headers))]
    if error is not None:
        raise error
    failed = [f"rank {i}: {chunks[i].decode('utf-8', 'replace')}" for i in range(len(headers))
              if headers[i, 0] != _OK]
    if failed:
        raise ObjectTransferError("allgather_object: some ranks could not serialise their objects: "
                                  + "; ".join(failed))
    return [cloudpickle.loads(chunk) for chunk in chunks]
