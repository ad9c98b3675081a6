"""Keras callbacks for distributed training: pass them to ``model.fit(callbacks=[...])``."""

import keras

from horovod._keras import callbacks as _impl
from horovod.keras._selected import backend as _backend


class BroadcastGlobalVariablesCallback(_impl.BroadcastGlobalVariablesCallbackImpl,
                                       keras.callbacks.Callback):
    """Makes every rank continue from ``root_rank``'s model weights and optimizer state after the
    first training batch (one broadcast of all of them, bitwise).

    Args:
        root_rank: the rank whose values the others take.
        device: accepted for compatibility; unused.
        local_variables: model variables left out of the broadcast (a variable or a list); more
            can be added with ``register_local_var``.
    """

    def __init__(self, root_rank, device='', local_variables=None):
        super().__init__(_backend, root_rank, device)
        if local_variables is not None:
            if not isinstance(local_variables, (list, tuple)):
                local_variables = [local_variables]
            for var in local_variables:
                self.register_local_var(var)


class MetricAverageCallback(_impl.MetricAverageCallbackImpl, keras.callbacks.Callback):
    """At each epoch end, replaces every metric in ``logs`` by its average over all ranks (one
    allreduce of all of them, float64). Put it before callbacks that read the metrics.

    Args:
        device: accepted for compatibility; the allreduce runs on the CPU.

    Raises:
        ValueError: a ``logs`` entry is not a scalar.
    """

    def __init__(self, device=''):
        super().__init__(_backend, device)


class LearningRateScheduleCallback(_impl.LearningRateScheduleCallbackImpl,
                                   keras.callbacks.Callback):
    """Sets the learning rate to ``initial_lr * multiplier(epoch)`` during epochs
    ``[start_epoch, end_epoch)``.

    Args:
        initial_lr: the rate (float) the multiplier scales; usually the already size-scaled rate.
        multiplier: a number ``m`` (rate ``initial_lr * m ** (epoch - start_epoch)``) or a
            function of the (fractional) epoch returning the factor.
        start_epoch, end_epoch: the epochs (0-based, end excluded; None: no end) it acts in.
        staircase: change at the first batch of each epoch only (True) or at every batch with
            the fractional epoch ``epoch + batch / steps_per_epoch`` (False).
        momentum_correction: scale an optimizer's ``momentum`` by ``new_lr / old_lr`` for the
            batch where the rate changes.
        steps_per_epoch: batches per epoch; by default taken from ``model.fit``'s parameters.

    Raises:
        ValueError: ``initial_lr`` is None; ``steps_per_epoch`` is needed but cannot be found.
    """

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__(_backend, initial_lr, multiplier, start_epoch, end_epoch, staircase,
                         momentum_correction, steps_per_epoch)


class LearningRateWarmupCallback(_impl.LearningRateWarmupCallbackImpl, keras.callbacks.Callback):
    """Gradual warm-up: the learning rate grows linearly, batch by batch, from
    ``initial_lr / size()`` to ``initial_lr`` over the first ``warmup_epochs`` epochs.

    Args:
        initial_lr: the rate reached at the end of the warm-up (float).
        warmup_epochs: epochs the warm-up lasts.
        momentum_correction, steps_per_epoch: as for ``LearningRateScheduleCallback``.
        verbose: when > 0, rank 0 prints a line when the warm-up ends.

    Raises:
        ValueError: ``initial_lr`` is None; ``steps_per_epoch`` cannot be found.
    """

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None,
                 verbose=0):
        super().__init__(_backend, initial_lr, warmup_epochs, momentum_correction, steps_per_epoch,
                         verbose)


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """``keras.callbacks.ModelCheckpoint`` with ``save_best_only=True`` whose ``filepath`` is set
    later, as an attribute (typically on rank 0 only: ``cb.filepath = 'best.keras'``).

    Args:
        monitor (str): the metric that decides which epoch is best, as Keras names it in ``logs``.
        verbose (int): 1 prints a line when a model is saved.
        save_weights_only (bool): save the weights only (``.weights.h5``), not the whole model.
        mode: ``'auto'``, ``'min'`` or ``'max'``: whether smaller or larger ``monitor`` is better.
        save_freq: ``'epoch'``, or a number of batches between checks.

    Raises:
        ValueError: at the start of training, when ``filepath`` was not set or does not end in
            ``.keras`` (``.weights.h5`` with ``save_weights_only``).
    """

    def __init__(self, monitor='val_loss', verbose=0, save_weights_only=False, mode='auto',
                 save_freq='epoch'):
        # Keras checks the file name when the callback is made; give it a valid one and clear it.
        placeholder = 'unset.weights.h5' if save_weights_only else 'unset.keras'
        super().__init__(filepath=placeholder, monitor=monitor, verbose=verbose,
                         save_best_only=True, save_weights_only=save_weights_only, mode=mode,
                         save_freq=save_freq)
        self.filepath = None

    def on_train_begin(self, logs=None):
        """Checks ``filepath`` before training starts.

        Args:
            logs: Keras's logs dict (passed on).

        Raises:
            ValueError: ``filepath`` is unset or has the wrong suffix.
        """
        suffix = '.weights.h5' if self.save_weights_only else '.keras'
        if not self.filepath or not str(self.filepath).endswith(suffix):
            raise ValueError('BestModelCheckpoint needs its filepath attribute set to a path ending '
                             f'in {suffix!r} before training; got {self.filepath!r}.')
        self.filepath = str(self.filepath)
        super().on_train_begin(logs)
