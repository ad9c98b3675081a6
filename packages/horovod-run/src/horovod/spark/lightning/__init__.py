"""``TorchEstimator`` for Lightning: train a ``LightningModule`` on a Spark DataFrame with
Lightning's ``Trainer`` over ``horovod.lightning.HorovodStrategy``
(``pip install "horovod-run[spark]" horovod-torch lightning``); see docs/spark.md, Estimators."""

from horovod.spark.common.backend import Backend, SparkBackend
from horovod.spark.common.store import FilesystemStore, HDFSStore, LocalStore, Store
from horovod.spark.lightning.estimator import TorchEstimator, TorchModel

__all__ = ["TorchEstimator", "TorchModel", "Backend", "SparkBackend", "Store", "FilesystemStore", "LocalStore",
           "HDFSStore"]
