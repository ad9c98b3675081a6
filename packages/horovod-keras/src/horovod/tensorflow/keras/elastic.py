"""Elastic training with ``tf.keras``: the classes of ``horovod.keras.elastic`` (``tf.keras`` is
Keras 3)."""

from horovod.keras.elastic import (  # noqa: F401  (re-exported)
    CommitStateCallback,
    KerasState,
    UpdateBatchStateCallback,
    UpdateEpochStateCallback,
    run,
)

__all__ = ['KerasState', 'CommitStateCallback', 'UpdateBatchStateCallback',
           'UpdateEpochStateCallback', 'run']
