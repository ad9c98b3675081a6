"""``KerasEstimator``: train a Keras 3 model on a Spark DataFrame with Horovod
(``pip install "horovod-run[spark]" horovod-keras``); see docs/spark.md, Estimators."""

from horovod.spark.common.backend import Backend, SparkBackend
from horovod.spark.common.store import FilesystemStore, HDFSStore, LocalStore, Store
from horovod.spark.keras.estimator import KerasEstimator, KerasModel

__all__ = ["KerasEstimator", "KerasModel", "Backend", "SparkBackend", "Store", "FilesystemStore", "LocalStore",
           "HDFSStore"]
