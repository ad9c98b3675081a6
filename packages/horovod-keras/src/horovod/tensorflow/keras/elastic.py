"""Elastic training with ``tf.keras``: the classes of ``horovod.keras.elastic`` (``tf.keras`` is
Keras 3) and ``run`` of ``horovod.tensorflow.elastic``."""

from horovod.keras.elastic import (  # noqa: F401  (re-exported)
    CommitStateCallback,
    KerasState,
    UpdateBatchStateCallback,
    UpdateEpochStateCallback,
)
from horovod.tensorflow.elastic import run  # noqa: F401  (re-exported)

__all__ = ['KerasState', 'CommitStateCallback', 'UpdateBatchStateCallback',
           'UpdateEpochStateCallback', 'run']
