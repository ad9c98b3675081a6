"""Callback implementations shared by horovod.keras and horovod.tensorflow.keras.

Each ``*Impl`` class is a mixin: the public classes put it in front of ``keras.callbacks.Callback``
and pass the backend module (:mod:`horovod._keras.backend`) as ``backend``, whose ``keras`` is
the Keras they run on.
"""

import numpy as np

import horovod._keras as _impl


class BroadcastGlobalVariablesCallbackImpl:
    """At the end of the first training batch, sets the model's weights (minus registered local
    variables) and the optimizer's variables to their values on ``root_rank``, in one broadcast.

    Broadcasting after the first batch rather than before lets the optimizer build its variables
    first; every rank then continues from the same state."""

    def __init__(self, backend, root_rank, device='', *args):
        super().__init__(*args)
        self.backend = backend
        self.root_rank = root_rank
        self.device = device
        self.broadcast_done = False
        self._local_var_ids = set()

    def register_local_var(self, var):
        """Leaves ``var`` (a model variable) out of the broadcast."""
        self._local_var_ids.add(id(var))

    def on_batch_end(self, batch, logs=None):
        if self.broadcast_done:
            return
        variables, seen = [], set(self._local_var_ids)
        optimizer = getattr(self.model, 'optimizer', None)
        for v in list(self.model.weights) + list(optimizer.variables if optimizer else []):
            if id(v) not in seen:
                seen.add(id(v))
                variables.append(v)
        _impl.broadcast_variables(self.backend.keras, self.backend, variables, self.root_rank,
                                  name='BroadcastGlobalVariablesCallback')
        self.broadcast_done = True


class MetricAverageCallbackImpl:
    """At the end of every epoch, replaces each entry of ``logs`` (in sorted key order) by its
    average over all ranks, so that later callbacks (checkpoints, early stopping, the progress
    bar) see the same numbers everywhere. Place it before those callbacks."""

    def __init__(self, backend, device='', *args):
        super().__init__(*args)
        self.backend = backend
        self.device = device

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        keys = sorted(logs)
        values = []
        for key in keys:
            try:
                values.append(float(np.asarray(self.backend.keras.ops.convert_to_numpy(logs[key]))))
            except (TypeError, ValueError) as e:
                raise ValueError(f'MetricAverageCallback averages scalar metrics; logs[{key!r}] '
                                 f'is {logs[key]!r}.') from e
        averaged = self.backend.to_numpy(self.backend.allreduce(
            self.backend.to_tensor(np.array(values, dtype=np.float64)),
            self.backend.framework.Average, name='MetricAverageCallback'))
        for key, value in zip(keys, averaged, strict=True):
            logs[key] = float(value)


def _get_lr(keras, optimizer):
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


class LearningRateScheduleCallbackImpl:
    """Sets the optimizer's learning rate to ``initial_lr * multiplier(epoch)`` for epochs in
    ``[start_epoch, end_epoch)``.

    ``multiplier`` is a number ``m`` (meaning ``m ** (epoch - start_epoch)``) or a function of the
    epoch. With ``staircase`` the rate changes at the first batch of each epoch (integer
    epochs); otherwise at every batch, with the fractional epoch
    ``epoch + batch / steps_per_epoch``. With ``momentum_correction`` and an optimizer that has a
    ``momentum``, the momentum is scaled by ``new_lr / old_lr`` for the batch in which the rate
    changes (Goyal et al. 2017, "Accurate, Large Minibatch SGD", section 2.1) and restored after
    it; a Python-number momentum only takes effect where the train step is not traced (the
    PyTorch backend, or ``run_eagerly=True``).
    """

    def __init__(self, backend, initial_lr, multiplier, start_epoch=0, end_epoch=None,
                 staircase=True, momentum_correction=True, steps_per_epoch=None, *args):
        super().__init__(*args)
        if initial_lr is None:
            raise ValueError('LearningRateScheduleCallback needs initial_lr, the learning rate '
                             'the schedule scales (for example the scaled rate of the optimizer).')
        self.backend = backend
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = None
        self.restore_momentum = None
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            self.multiplier = lambda epoch: multiplier ** (epoch - start_epoch)

    def _autodetect_steps_per_epoch(self):
        params = self.params or {}
        if params.get('steps'):
            return params['steps']
        if params.get('samples') and params.get('batch_size'):
            return params['samples'] // params['batch_size']
        raise ValueError(f'{type(self).__name__} could not find the number of steps per epoch '
                         'in the training parameters; pass steps_per_epoch.')

    def _adjust_learning_rate(self, epoch):
        optimizer = self.model.optimizer
        old_lr = _get_lr(self.backend.keras, optimizer)
        new_lr = self.initial_lr * self.multiplier(epoch)
        optimizer.learning_rate = new_lr
        momentum = getattr(optimizer, 'momentum', None)
        if self.momentum_correction and momentum is not None and old_lr > 0:
            self.restore_momentum = momentum
            correction = new_lr / old_lr
            if hasattr(momentum, 'assign'):
                self.restore_momentum = float(self.backend.keras.ops.convert_to_numpy(momentum))
                momentum.assign(self.restore_momentum * correction)
            else:
                optimizer.momentum = momentum * correction

    def _restore(self):
        if self.restore_momentum is None:
            return
        momentum = self.model.optimizer.momentum
        if hasattr(momentum, 'assign'):
            momentum.assign(self.restore_momentum)
        else:
            self.model.optimizer.momentum = self.restore_momentum
        self.restore_momentum = None

    def on_train_begin(self, logs=None):
        if self.steps_per_epoch is None and not self.staircase:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_batch_begin(self, batch, logs=None):
        if self.current_epoch < self.start_epoch or (
                self.end_epoch is not None and self.current_epoch >= self.end_epoch):
            return
        if self.staircase:
            if batch == 0:
                self._adjust_learning_rate(self.current_epoch)
        else:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_batch_end(self, batch, logs=None):
        self._restore()

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs['lr'] = _get_lr(self.backend.keras, self.model.optimizer)


class LearningRateWarmupCallbackImpl(LearningRateScheduleCallbackImpl):
    """Ramps the learning rate linearly from ``initial_lr / size`` to ``initial_lr`` over the first
    ``warmup_epochs`` epochs, updated every batch (Goyal et al. 2017, section 2.2: gradual
    warm-up for large effective batches)."""

    def __init__(self, backend, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0, *args):
        def multiplier(epoch):
            # The rate of batch b is the one reached at its end, hence the extra 1/steps.
            epoch += 1.0 / self.steps_per_epoch
            size = backend.framework.size()
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(backend, initial_lr, multiplier, 0, warmup_epochs, False,
                         momentum_correction, steps_per_epoch, *args)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and self.backend.framework.rank() == 0:
            print(f'\nEpoch {epoch + 1}: finished gradual learning rate warmup to '
                  f'{_get_lr(self.backend.keras, self.model.optimizer):g}.')
