"""Elastic training with Keras 3, shared by horovod.keras.elastic and
horovod.tensorflow.keras.elastic: a state object holding a model and its optimizer, and the
callbacks that keep it committed while ``model.fit`` runs.
"""

import numpy as np

import horovod._keras as _impl
from horovod.common.elastic import ObjectState


class KerasStateImpl(ObjectState):
    """The weights of ``model``, the variables of ``optimizer`` (default ``model.optimizer``) and
    the picklable values given as keyword arguments (for example ``epoch=0, batch=0``), which
    become attributes of the state.

    ``save`` keeps a numpy copy of every variable; ``restore`` assigns them back; ``sync``
    broadcasts every variable and attribute from rank 0 and saves. When the optimizer is a
    DistributedOptimizer with a compressor with state (PowerSGD, TopK), ``sync`` also gives every
    rank rank 0's step and factors with empty residuals, and every reset (after Horovod
    restarted) empties every rank's residuals.

    Raises:
        ValueError: the model is not built yet (call it on data or ``model.build`` first).
    """

    def __init__(self, backend, model, optimizer=None, **kwargs):
        if not model.built:
            raise ValueError('KerasState needs a built model: call model.build(input_shape) or '
                             'the model on a batch first.')
        self.backend = backend
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, 'optimizer', None)
        self._saved_variables = []
        framework = backend.framework
        super().__init__(bcast_object=framework.broadcast_object, get_rank=framework.rank,
                         **kwargs)
        self._save_variables()

    def _variables(self):
        variables, seen = [], set()
        optimizer_variables = list(self.optimizer.variables) if self.optimizer is not None else []
        for v in list(self.model.weights) + optimizer_variables:
            if id(v) not in seen:
                seen.add(id(v))
                variables.append(v)
        return variables

    def _build_optimizer_like_root(self):
        """Builds the optimizer for the model's trainable weights when it is not built yet but
        rank 0's is (collective: every rank calls it). A worker that joins an elastic job has
        an optimizer without slot variables (momentum, Adam moments) while rank 0's built them
        at its first step; the ranks must broadcast the same variables."""
        optimizer = self.optimizer
        if optimizer is None or not hasattr(optimizer, 'built') or not hasattr(optimizer, 'build'):
            return
        if self._bcast_object(bool(optimizer.built)) and not optimizer.built:
            with self.backend.keras.name_scope(optimizer.name, caller=optimizer):
                optimizer.build(self.model.trainable_weights)
            optimizer.built = True

    def _save_variables(self):
        keras = self.backend.keras
        self._saved_variables = [(v, np.array(keras.ops.convert_to_numpy(v.value)))
                                 for v in self._variables()]

    def save(self):
        self._save_variables()
        super().save()

    def restore(self):
        for v, value in self._saved_variables:
            v.assign(value)
        super().restore()

    def sync(self):
        self._build_optimizer_like_root()
        _impl.broadcast_variables(self.backend.keras, self.backend, self._variables(), 0,
                                  name='KerasState.sync')
        compression = self._stateful_compression()
        if compression is not None:
            compression.sync(self._bcast_object)
        super().sync()
        self.save()

    def reset(self):
        """Empties a compressor's residuals on every rank (run after Horovod restarted)."""
        compression = self._stateful_compression()
        if compression is not None:
            compression.reset_residuals()

    def _stateful_compression(self):
        settings = getattr(self.optimizer, '_hvd_settings', None)
        compression = getattr(settings, 'compression', None)
        return compression if getattr(compression, 'stateful', False) else None


class CommitStateCallbackImpl:
    """Commits ``state`` every ``batches_per_commit`` batches and at every epoch end."""

    def __init__(self, backend, state, batches_per_commit=1, *args):
        super().__init__(*args)
        self.backend = backend
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None):
        self.batches_remaining = self.batches_per_commit

    def on_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()


class UpdateBatchStateCallbackImpl:
    """Keeps ``state.batch`` at the last finished batch of the epoch (0 between epochs), and at
    an epoch's start shortens ``params['steps']`` by the batches already done in it."""

    def __init__(self, backend, state, *args):
        super().__init__(*args)
        self.backend = backend
        self.state = state
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        if self.params.get('steps'):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = self.params['steps']
            self.params['steps'] = self.steps_per_epoch - self.state.batch

    def on_batch_end(self, batch, logs=None):
        self.state.batch = batch

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallbackImpl:
    """Sets ``state.epoch`` to the number of epochs finished: its value when training began plus
    the epochs this ``fit`` finished.

    Keras numbers the epochs of ``fit(..., initial_epoch=k)`` from ``k``, so the epochs finished
    are counted from the first epoch this ``fit`` began, whether or not the script passes
    ``initial_epoch=state.epoch`` (``fit(epochs=epochs - state.epoch)`` numbers them from 0)."""

    def __init__(self, backend, state, *args):
        super().__init__(*args)
        self.backend = backend
        self.state = state
        self.initial_epoch = state.epoch
        self.first_epoch = None

    def on_train_begin(self, logs=None):
        self.initial_epoch = self.state.epoch
        self.first_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        if self.first_epoch is None:
            self.first_epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        first = epoch if self.first_epoch is None else self.first_epoch
        self.state.epoch = self.initial_epoch + epoch - first + 1
