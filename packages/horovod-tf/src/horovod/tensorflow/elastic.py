"""Elastic training for TensorFlow: state objects and the ``run`` decorator.

``@hvd.elastic.run`` wraps ``train(state, ...)``: the state is synchronised from rank 0 before
each attempt, rolled back to its last ``commit()`` after a ``HorovodInternalError``, and Horovod
is re-initialised between attempts (spec tensorflow_keras.md §1.9). Variables are snapshotted as
numpy copies in every mode.
"""

import functools

import tensorflow as tf

from horovod.common.elastic import ObjectState, run_fn
from horovod.common.exceptions import HorovodInternalError
from horovod.tensorflow.functions import broadcast_object, broadcast_variables
from horovod.tensorflow.mpi_ops import init, rank, shutdown

__all__ = ['TensorFlowKerasState', 'TensorFlowState', 'run']

# Ops whose failure inside a graph TF reports as UnknownError naming them.
_HOROVOD_OPS = ('HorovodAllreduce', 'HorovodAllgather', 'HorovodBroadcast', 'HorovodAlltoall',
                'HorovodReducescatter', 'HorovodJoin')


def run(func):
    """Decorator making ``func(state, *args, **kwargs)`` survive failed collectives and host
    changes (see ``horovod.common.elastic.run_fn``). A ``tf.errors.UnknownError`` whose message
    names a Horovod op (a collective that failed inside a graph) counts as a
    ``HorovodInternalError``; any other error propagates unchanged."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except tf.errors.UnknownError as e:
            if any(op in str(e) for op in _HOROVOD_OPS):
                raise HorovodInternalError(str(e)) from e
            raise

    return run_fn(wrapper, _reset)


def _reset():
    shutdown()
    init()


def _build_optimizer_like_root(model, optimizer, bcast_object):
    """Builds a Keras 3 ``optimizer`` that is not built yet (no slot variables) for the model's
    trainable variables when rank 0's is built (collective: every rank must call it).

    A worker that joins an elastic job, or whose optimizer never stepped, has fewer optimizer
    variables than rank 0, whose optimizer built its slots (momentum, Adam moments) at its first
    step; without this the ranks would broadcast different lists of variables.
    """
    if optimizer is None or not hasattr(optimizer, 'built') or not hasattr(optimizer, 'build'):
        return
    if bcast_object(bool(optimizer.built)) and not optimizer.built:
        with tf.keras.name_scope(optimizer.name, caller=optimizer):
            optimizer.build(model.trainable_variables)
        optimizer.built = True


def _snapshot(variables):
    return [tf.convert_to_tensor(v).numpy().copy() for v in variables]


class TensorFlowKerasState(ObjectState):
    """Elastic state of a Keras model and its optimizer, plus picklable attributes (``kwargs``).

    An optimizer from ``hvd.DistributedOptimizer`` with a compressor with state (``hvd.PowerSGD``,
    ``hvd.TopK``) has it kept consistent as ``hvd.elastic.TorchState`` does: ``sync`` gives every
    rank rank 0's step and factors and empties the residuals; every reset empties every rank's
    residuals (those of ranks that left are lost, and each rank's share of the data changed).

    Args:
        model: a built Keras model.
        optimizer: its optimizer (default ``model.optimizer``).
        backend: accepted for compatibility; unused.
        **kwargs: attributes kept in the state (epoch, batch, ...).

    Raises:
        ValueError: the model is not built yet (build it, or call it on a batch, first).
    """

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        if not getattr(model, 'built', False):
            raise ValueError('TensorFlowKerasState needs a built model: build the model first '
                             '(model.build(input_shape) or call it on a batch).')
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, 'optimizer', None)
        self.backend = backend
        self._saved_variables = _snapshot(self._variables())
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def _variables(self):
        variables = list(self.model.variables)
        if self.optimizer is not None:
            variables += list(self.optimizer.variables)
        return variables

    def save(self):
        """Copies the model's and optimizer's variables (in memory), then the attributes."""
        self._saved_variables = _snapshot(self._variables())
        super().save()

    def restore(self):
        """Assigns the variables and attributes their values at the last :meth:`save`."""
        variables = self._variables()
        for variable, value in zip(variables, self._saved_variables, strict=False):
            variable.assign(value)
        super().restore()

    def sync(self):
        """Broadcasts the variables (building the optimizer's first where rank 0's is built) and
        the attributes from rank 0, then saves them; a collective: every rank calls it."""
        _build_optimizer_like_root(self.model, self.optimizer, self._bcast_object)
        broadcast_variables(self._variables(), root_rank=0)
        self._saved_variables = _snapshot(self._variables())
        compression = self._stateful_compression()
        if compression is not None:
            compression.sync(self._bcast_object)
        super().sync()

    def reset(self):
        """Empties a stateful compressor's residuals on every rank (after Horovod restarted)."""
        compression = self._stateful_compression()
        if compression is not None:
            compression.reset_residuals()

    def _stateful_compression(self):
        compression = getattr(self.optimizer, '_hvd_compression', None)
        return compression if getattr(compression, 'stateful', False) else None


class TensorFlowState(ObjectState):
    """Elastic state of a list of ``tf.Variable`` (default: the TF1 global variables), plus
    picklable attributes (``kwargs``). ``session`` is accepted for compatibility and unused."""

    def __init__(self, variables=None, session=None, **kwargs):
        self.variables = list(variables) if variables is not None else tf.compat.v1.global_variables()
        self.session = session
        self._saved_variables = _snapshot(self.variables)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def save(self):
        """Copies the variables (in memory), then the attributes."""
        self._saved_variables = _snapshot(self.variables)
        super().save()

    def restore(self):
        """Assigns the variables and attributes their values at the last :meth:`save`."""
        for variable, value in zip(self.variables, self._saved_variables, strict=True):
            variable.assign(value)
        super().restore()

    def sync(self):
        """Broadcasts the variables and attributes from rank 0, then saves them; a collective:
        every rank calls it."""
        if self.variables:
            broadcast_variables(self.variables, root_rank=0)
        self._saved_variables = _snapshot(self.variables)
        super().sync()
