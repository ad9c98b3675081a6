"""Horovod inside a PySpark application: :func:`run` runs a function as Horovod ranks placed on
Spark executors, one Spark task per rank (docs/spark.md).

PySpark is an optional extra of horovod-run: ``pip install "horovod-run[spark]"``. This version
has ``run`` (Gloo, or MPI with ``use_mpi=True``) and ``run_elastic`` (Gloo); the Estimator API is
not there.
"""

import collections

try:
    import pyspark  # noqa: F401
except ImportError as e:
    raise ImportError(
        'horovod.spark needs PySpark 4, an optional extra of horovod-run: '
        'pip install "horovod-run[spark]" (could not import pyspark: %s)' % e) from e

# Keep PySpark from replacing collections.namedtuple with its pickling hack (SPARK-22674).
collections.namedtuple.__hijack = 1

from horovod.spark.elastic import run_elastic  # noqa: E402
from horovod.spark.runner import run  # noqa: E402

__all__ = ["run", "run_elastic"]
