"""``TorchEstimator``: train a ``torch.nn.Module`` on a Spark DataFrame with Horovod
(``pip install "horovod-run[spark]" horovod-torch``); see docs/spark.md, Estimators."""

from horovod.spark.common.backend import Backend, SparkBackend
from horovod.spark.common.store import FilesystemStore, HDFSStore, LocalStore, Store
from horovod.spark.torch.estimator import TorchEstimator, TorchModel

__all__ = ["TorchEstimator", "TorchModel", "Backend", "SparkBackend", "Store", "FilesystemStore", "LocalStore",
           "HDFSStore"]
