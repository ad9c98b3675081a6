"""Elastic training with Keras 3: ``hvd.elastic.run`` retries ``train(state)`` from the last
commit when a rank fails or hosts change, and these callbacks keep the state committed during
``model.fit``::

    state = hvd.elastic.KerasState(model, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        model.fit(..., initial_epoch=state.epoch, callbacks=[
            hvd.elastic.UpdateBatchStateCallback(state), hvd.elastic.UpdateEpochStateCallback(state),
            hvd.elastic.CommitStateCallback(state)])

The commit callback comes last, so that what it commits at an epoch's end includes the epoch
just finished.
"""

import keras

from horovod._keras import elastic as _impl
from horovod.common.elastic import run_fn
from horovod.keras._selected import backend as _backend

__all__ = ['KerasState', 'CommitStateCallback', 'UpdateBatchStateCallback',
           'UpdateEpochStateCallback', 'run']


def run(func):
    """Decorator making ``func(state, *args, **kwargs)`` survive failures and host changes: the
    state is synchronised from rank 0 before each attempt, rolled back to its last commit after
    a ``HorovodInternalError``, and Horovod is re-initialised between attempts.

    On the TensorFlow backend this is ``horovod.tensorflow.elastic.run``: a collective that fails
    inside the graph Keras runs reaches the script as a ``tf.errors.UnknownError`` naming the
    Horovod op, which it turns into a ``HorovodInternalError``."""
    if _backend.NAME == 'tensorflow':
        from horovod.tensorflow.elastic import run as tensorflow_run
        return tensorflow_run(func)
    return run_fn(func, _reset)


def _reset():
    _backend.framework.shutdown()
    _backend.framework.init()


class KerasState(_impl.KerasStateImpl):
    """State of a Keras model and its optimizer, plus picklable attributes (``**kwargs``).

    Args:
        model: a built Keras model.
        optimizer: the optimizer whose variables are kept; default ``model.optimizer``.
        **kwargs: attributes kept with the state, e.g. ``epoch=0, batch=0``.

    Raises:
        ValueError: the model is not built.
    """

    def __init__(self, model, optimizer=None, **kwargs):
        super().__init__(_backend, model, optimizer, **kwargs)


class CommitStateCallback(_impl.CommitStateCallbackImpl, keras.callbacks.Callback):
    """Commits ``state`` every ``batches_per_commit`` batches and at each epoch end."""

    def __init__(self, state, batches_per_commit=1):
        super().__init__(_backend, state, batches_per_commit)


class UpdateBatchStateCallback(_impl.UpdateBatchStateCallbackImpl, keras.callbacks.Callback):
    """Records the last finished batch in ``state.batch`` (0 at each epoch end)."""

    def __init__(self, state):
        super().__init__(_backend, state)


class UpdateEpochStateCallback(_impl.UpdateEpochStateCallbackImpl, keras.callbacks.Callback):
    """Records the number of finished epochs in ``state.epoch``."""

    def __init__(self, state):
        super().__init__(_backend, state)
