"""``tf.keras`` callbacks for distributed training; the same classes as
``horovod.keras.callbacks`` (``tf.keras`` is Keras 3)."""

from horovod.keras.callbacks import (  # noqa: F401  (re-exported)
    BestModelCheckpoint,
    BroadcastGlobalVariablesCallback,
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
    MetricAverageCallback,
)
