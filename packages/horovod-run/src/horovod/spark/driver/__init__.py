"""The driver side of :func:`horovod.spark.run_elastic`: the service its Spark tasks talk to and
the host discovery the launcher's elastic driver asks."""
