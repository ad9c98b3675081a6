"""Spark settings for :func:`horovod.spark.run_elastic`, as ``(key, value)`` pairs to pass to
``SparkConf.set(*pair)`` (or ``SparkSession.builder.config(*pair)``) before the context starts.

An elastic job recovers through Spark's task retries: a task whose rank failed, or that was lost
with its executor, comes back as a new attempt, which the job takes as a new host. Spark gives up
on the whole job once one task has failed ``spark.task.maxFailures`` times (4 by default on a
cluster, 1 on ``local[N]``), so elastic jobs usually want
:data:`SPARK_CONF_ALWAYS_RESTART_FAILED_TASK` and leave the limits to Horovod's ``reset_limit``.

The ``spark.blacklist.*`` keys are the names upstream Horovod uses. Spark 3.1 renamed them
``spark.excludeOnFailure.*``, and Spark 4 no longer reads the old names at all (it only warns
that they are "not used anymore"). The pairs keep upstream's names and values;
:data:`EXCLUDE_ON_FAILURE_KEYS` maps each old key to its current name, and :func:`current`
translates a pair: ``SparkConf().set(*conf.current(conf.SPARK_CONF_BLACKLIST_ENABLED))``.
"""

SPARK_CONF_MAX_INT = "2147483647"
SPARK_CONF_MAX_INT_MINUS_ONE = "2147483646"

# Spark may run a failed task again any number of times.
SPARK_CONF_ALWAYS_RESTART_FAILED_TASK = ("spark.task.maxFailures", SPARK_CONF_MAX_INT)

# Spark's exclusion of executors and nodes on which tasks failed (off by default).
SPARK_CONF_BLACKLIST_DISABLED = ("spark.blacklist.enabled", "false")
SPARK_CONF_BLACKLIST_ENABLED = ("spark.blacklist.enabled", "true")

# With exclusion on: failed tasks per executor before it is excluded for the stage.
SPARK_CONF_REUSE_FAILED_EXECUTOR = ("spark.blacklist.stage.maxFailedTasksPerExecutor", SPARK_CONF_MAX_INT)
SPARK_CONF_DONT_REUSE_FAILED_EXECUTOR = ("spark.blacklist.stage.maxFailedTasksPerExecutor", "1")

# With exclusion on: excluded executors per node before the node is excluded for the stage.
SPARK_CONF_REUSE_FAILING_NODE = ("spark.blacklist.stage.maxFailedExecutorsPerNode", SPARK_CONF_MAX_INT_MINUS_ONE)
SPARK_CONF_DONT_REUSE_FAILING_NODE = ("spark.blacklist.stage.maxFailedExecutorsPerNode", "1")

# With exclusion on: attempts of one task on one executor.
SPARK_CONF_REUSE_EXECUTOR_ALWAYS_FOR_SAME_TASK = ("spark.blacklist.task.maxTaskAttemptsPerExecutor",
                                                  SPARK_CONF_MAX_INT)
SPARK_CONF_REUSE_EXECUTOR_ONCE_FOR_SAME_TASK = ("spark.blacklist.task.maxTaskAttemptsPerExecutor", "2")
SPARK_CONF_DONT_REUSE_EXECUTOR_FOR_SAME_TASK = ("spark.blacklist.task.maxTaskAttemptsPerExecutor", "1")

# With exclusion on: attempts of one task on one node.
SPARK_CONF_REUSE_NODE_ALWAYS_FOR_SAME_TASK = ("spark.blacklist.task.maxTaskAttemptsPerNode",
                                              SPARK_CONF_MAX_INT_MINUS_ONE)
SPARK_CONF_REUSE_NODE_ONCE_FOR_SAME_TASK = ("spark.blacklist.task.maxTaskAttemptsPerNode", "2")
SPARK_CONF_DONT_REUSE_NODE_FOR_SAME_TASK = ("spark.blacklist.task.maxTaskAttemptsPerNode", "1")

# With exclusion on: the same two limits for the whole application (under dynamic allocation,
# only executors excluded for the application are given back to the cluster manager).
SPARK_CONF_REUSE_FAILED_EXECUTOR_IN_APP = ("spark.blacklist.application.maxFailedTasksPerExecutor",
                                           SPARK_CONF_MAX_INT)
SPARK_CONF_DONT_REUSE_FAILED_EXECUTOR_IN_APP = ("spark.blacklist.application.maxFailedTasksPerExecutor", "1")
SPARK_CONF_REUSE_FAILING_NODE_IN_APP = ("spark.blacklist.application.maxFailedExecutorsPerNode", SPARK_CONF_MAX_INT)
SPARK_CONF_DONT_REUSE_FAILING_NODE_IN_APP = ("spark.blacklist.application.maxFailedExecutorsPerNode", "1")

# Spark's defaults of those keys, to restore them.
SPARK_CONF_DEFAULT_VALUES = {
    "spark.task.maxFailures": "4",
    "spark.blacklist.enabled": "false",
    "spark.blacklist.stage.maxFailedTasksPerExecutor": "2",
    "spark.blacklist.stage.maxFailedExecutorsPerNode": "2",
    "spark.blacklist.task.maxTaskAttemptsPerExecutor": "1",
    "spark.blacklist.task.maxTaskAttemptsPerNode": "2",
    "spark.blacklist.application.maxFailedTasksPerExecutor": "2",
    "spark.blacklist.application.maxFailedExecutorsPerNode": "2",
}

# The current (Spark >= 3.1) name of each deprecated key.
EXCLUDE_ON_FAILURE_KEYS = {
    "spark.blacklist.enabled": "spark.excludeOnFailure.enabled",
    "spark.blacklist.stage.maxFailedTasksPerExecutor": "spark.excludeOnFailure.stage.maxFailedTasksPerExecutor",
    "spark.blacklist.stage.maxFailedExecutorsPerNode": "spark.excludeOnFailure.stage.maxFailedExecutorsPerNode",
    "spark.blacklist.task.maxTaskAttemptsPerExecutor": "spark.excludeOnFailure.task.maxTaskAttemptsPerExecutor",
    "spark.blacklist.task.maxTaskAttemptsPerNode": "spark.excludeOnFailure.task.maxTaskAttemptsPerNode",
    "spark.blacklist.application.maxFailedTasksPerExecutor":
        "spark.excludeOnFailure.application.maxFailedTasksPerExecutor",
    "spark.blacklist.application.maxFailedExecutorsPerNode":
        "spark.excludeOnFailure.application.maxFailedExecutorsPerNode",
}


def current(pair):
    """``pair`` (a ``(key, value)`` of this module) under the key's current Spark name:
    ``spark.blacklist.*`` becomes ``spark.excludeOnFailure.*``, other keys are kept.

    Raises:
        ValueError: ``pair`` is not a ``(str, str)`` pair.
    """
    if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(v, str) for v in pair)):
        raise ValueError("expected a (key, value) pair of strings, got %r" % (pair,))
    key, value = pair
    return EXCLUDE_ON_FAILURE_KEYS.get(key, key), value
