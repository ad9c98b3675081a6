"""Helpers shared by the Spark driver side and the Spark tasks of :mod:`horovod.spark`."""

import collections

# See horovod/spark/__init__.py (SPARK-22674).
collections.namedtuple.__hijack = 1
