"""Broadcasting variables and Python objects, and gathering objects.

Objects travel as cloudpickle bytes (horovod.common.objects): first a header (int32
``[status, length]``, engine name ``<name>.sz``), then the bytes (uint8, ``<name>.t``). They go
straight to the engine as numpy arrays whatever TF's mode, so the ``session`` arguments kept from
upstream's TF1 API are not needed and are ignored.
"""


import tensorflow as tf

from horovod.common import ops as _ops
from horovod.tensorflow.util import _no_autograph

from horovod.tensorflow import _engine
from horovod.tensorflow.mpi_ops import (
    _broadcast_group,
    _check_root,
    _process_set_id,
    broadcast_,
    global_process_set,
    rank,
)


@_no_autograph
def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False):
    """Assigns the root's values to ``variables`` on every rank of ``process_set``.

    Args:
        variables: a list of tf.Variable (same shapes and dtypes, same order on every rank).
        root_rank: global rank (int) whose values are sent.
        process_set: the ``ProcessSet`` to broadcast within.
        inplace: use ``broadcast_`` (same result; kept for compatibility).

    Returns:
        Eagerly None once the values are assigned; in a graph, an op (``tf.group``) that
        broadcasts and assigns when run.

    Raises:
        ValueError: root_rank not an int, unsupported dtype, unregistered set.
        tf.errors.FailedPreconditionError: ranks disagree on the variables' shapes or dtypes.
    """
    variables = list(variables)
    if not variables:
        return None if tf.executing_eagerly() else tf.no_op()
    if inplace:
        broadcast_(variables, root_rank, process_set=process_set)
        return None if tf.executing_eagerly() else tf.group(*[v.read_value() for v in variables])
    values = _broadcast_group([v.read_value() if hasattr(v, 'read_value') else v for v in variables], root_rank,
                              None, False, process_set)
    assigns = [v.assign(value) for v, value in zip(variables, values, strict=True)]
    if tf.executing_eagerly():
        return None
    return tf.group(*assigns)


def broadcast_global_variables(root_rank):
    """A TF1 graph op that broadcasts every global variable from ``root_rank``.

    Raises:
        RuntimeError: in eager mode, where there are no global variables; use
            ``hvd.broadcast_variables(model.variables, root_rank)`` instead.
    """
    if tf.executing_eagerly():
        raise RuntimeError('hvd.broadcast_global_variables() does not support eager execution; use '
                           'hvd.broadcast_variables(variables, root_rank) instead.')
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """A TF1 ``SessionRunHook`` that broadcasts every global variable from ``root_rank`` when the
    session is created, so that every rank starts from the same initial values (or checkpoint).

    Args:
        root_rank: global rank whose values are sent.
        device: device to place the broadcast op on ('' for the default).
    """

    def __init__(self, root_rank, device=''):
        super().__init__()
        self.root_rank = root_rank
        self.bcast_op = None
        self.device = device

    def begin(self):
        """Builds the broadcast op in the default graph (called by the session before it is
        created; again for a new graph)."""
        graph = tf.compat.v1.get_default_graph()
        if self.bcast_op is None or self.bcast_op.graph is not graph:
            with tf.device(self.device):
                self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session, coord):
        """Runs the broadcast op once the session exists.

        Args:
            session: the ``tf.compat.v1.Session`` just created.
            coord: its ``tf.train.Coordinator`` (unused).
        """
        session.run(self.bcast_op)


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """Sends a picklable Python object from the root to every rank of ``process_set``.

    Args:
        obj: anything cloudpickle can serialise; ignored on other ranks (``None`` is fine).
        root_rank: global rank whose object is sent.
        session: ignored (TF1 compatibility).
        name: base engine name; default ``'broadcast_object'`` (``'allgather_object'`` for
            allgather_object); the same on every rank.
        process_set: the ``ProcessSet`` to broadcast within.

    Returns:
        The root's object (the root gets ``obj`` itself, the others an unpickled copy).

    Raises:
        ValueError: root_rank not an int or not in the set.
        tf.errors.FailedPreconditionError (also HorovodInternalError): ranks disagree on the
            name's payload or root.
        the root's exception (on the root) and horovod.common.objects.ObjectTransferError (on
            the other ranks, naming the root): ``obj`` cannot be serialised on the root.
    """
    from horovod.common import objects
    root_rank = _check_root(root_rank)
    params = {'set_id': _process_set_id(process_set), 'root': root_rank}
    base = objects.BROADCAST_NAME if name is None else name

    def run(array, suffix):
        return _engine.run('broadcast', [array], _ops.op_names('broadcast', base + suffix), params)[0]

    return objects.broadcast_object(obj, rank() == root_rank, root_rank, run)


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """Returns ``_bcast(obj)``, which broadcasts ``obj`` from ``root_rank`` as
    :func:`broadcast_object` does.

    Args:
        root_rank (int): the global rank whose object is sent.
        session: ignored (TF1 compatibility).
        name (str): the base engine name of every broadcast; default ``'broadcast_object_fn'``.
        process_set: the ``ProcessSet`` to broadcast over.
    """
    name = name or 'broadcast_object_fn'

    def _bcast(obj):
        return broadcast_object(obj, root_rank, session=session, name=name, process_set=process_set)

    return _bcast


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """Gathers a picklable Python object from every rank of ``process_set``.

    Args:
        obj: anything cloudpickle can serialise.
        session: ignored (TF1 compatibility).
        name: base engine name; default ``'broadcast_object'`` (``'allgather_object'`` for
            allgather_object); the same on every rank.
        process_set: the ``ProcessSet`` to gather over.

    Returns:
        list of the members' objects in set-rank order (unpickled copies, this rank's included).

    Raises:
        tf.errors.FailedPreconditionError (also HorovodInternalError): the ranks' names disagree.
        this rank's exception when its ``obj`` cannot be serialised, and
            horovod.common.objects.ObjectTransferError on the others, naming the failed ranks.
    """
    from horovod.common import objects
    params = {'set_id': _process_set_id(process_set)}
    base = objects.ALLGATHER_NAME if name is None else name
    return objects.allgather_object(
        obj, lambda array, suffix: _engine.run('allgather', [array], _ops.op_names('allgather', base + suffix),
                                               params)[0])
