"""Names of the environment variables the launcher writes for its workers, in one place.

Engine variables are ``HOROVOD_*`` knobs the engine reads; their names come from the engine's
knob table (``horovod.common.knobs``, declared once in csrc/common/config.cc), so a knob the engine
renames or drops fails here, when the launcher is imported, instead of being handed to workers
that no longer read it. Without a loadable core (a launcher-only install, which still launches
commands) the names are built the same way, ``HOROVOD_<short name>``, unchecked; the tests check
that both ways give the same names.

Launcher variables are the launcher's own, read by the launcher itself, by its task services or
by the worker's Python side, and documented in docs/running.md, docs/spark.md and docs/elastic.md.
"""

from horovod.common.rendezvous import SECRET_ENV


def _engine_table():
    try:
        from horovod.common import knobs
        knobs.table()
        return knobs
    except ImportError:
        return None


_knobs = _engine_table()

#: Whether the names below were checked against the engine's knob table.
CHECKED_AGAINST_ENGINE = _knobs is not None


def knob(short):
    """The engine variable ``HOROVOD_<short>``; ValueError when the engine does not declare it."""
    return f"HOROVOD_{short}" if _knobs is None else _knobs.knob(short)


# Engine knobs: where a worker sits in the job.
HOSTNAME = knob("HOSTNAME")
RANK = knob("RANK")
SIZE = knob("SIZE")
LOCAL_RANK = knob("LOCAL_RANK")
LOCAL_SIZE = knob("LOCAL_SIZE")
CROSS_RANK = knob("CROSS_RANK")
CROSS_SIZE = knob("CROSS_SIZE")
# How it reaches the others.
GLOO_RENDEZVOUS_ADDR = knob("GLOO_RENDEZVOUS_ADDR")
GLOO_RENDEZVOUS_PORT = knob("GLOO_RENDEZVOUS_PORT")
GLOO_IFACE = knob("GLOO_IFACE")
CONTROLLER = knob("CONTROLLER")
CPU_OPERATIONS = knob("CPU_OPERATIONS")
ELASTIC = knob("ELASTIC")
# Tuning, from horovodrun's flags and config file (config_parser).
FUSION_THRESHOLD = knob("FUSION_THRESHOLD")
CYCLE_TIME = knob("CYCLE_TIME")
CACHE_CAPACITY = knob("CACHE_CAPACITY")
HIERARCHICAL_ALLREDUCE = knob("HIERARCHICAL_ALLREDUCE")
HIERARCHICAL_ALLGATHER = knob("HIERARCHICAL_ALLGATHER")
TORUS_ALLREDUCE = knob("TORUS_ALLREDUCE")
AUTOTUNE = knob("AUTOTUNE")
AUTOTUNE_LOG = knob("AUTOTUNE_LOG")
AUTOTUNE_WARMUP_SAMPLES = knob("AUTOTUNE_WARMUP_SAMPLES")
AUTOTUNE_STEPS_PER_SAMPLE = knob("AUTOTUNE_STEPS_PER_SAMPLE")
AUTOTUNE_BAYES_OPT_MAX_SAMPLES = knob("AUTOTUNE_BAYES_OPT_MAX_SAMPLES")
AUTOTUNE_GAUSSIAN_PROCESS_NOISE = knob("AUTOTUNE_GAUSSIAN_PROCESS_NOISE")
TIMELINE = knob("TIMELINE")
TIMELINE_MARK_CYCLES = knob("TIMELINE_MARK_CYCLES")
STALL_CHECK_DISABLE = knob("STALL_CHECK_DISABLE")
STALL_CHECK_TIME_SECONDS = knob("STALL_CHECK_TIME_SECONDS")
STALL_SHUTDOWN_TIME_SECONDS = knob("STALL_SHUTDOWN_TIME_SECONDS")
DEADLOCK_TIMEOUT_SECONDS = knob("DEADLOCK_TIMEOUT_SECONDS")
FLIGHT_RECORDER_SIZE = knob("FLIGHT_RECORDER_SIZE")
FLIGHT_RECORDER_DIR = knob("FLIGHT_RECORDER_DIR")
MPI_THREADS_DISABLE = knob("MPI_THREADS_DISABLE")
NUM_NCCL_STREAMS = knob("NUM_NCCL_STREAMS")
THREAD_AFFINITY = knob("THREAD_AFFINITY")
GLOO_TIMEOUT_SECONDS = knob("GLOO_TIMEOUT_SECONDS")
LOG_LEVEL = knob("LOG_LEVEL")
LOG_HIDE_TIME = knob("LOG_HIDE_TIME")

# Launcher variables.
SECRET_KEY = SECRET_ENV  # the job secret (hex) for the rendezvous service's HMAC; never on a command line
START_TIMEOUT = "HOROVOD_START_TIMEOUT"  # seconds for start-up checks (read by horovodrun)
ELASTIC_TIMEOUT = "HOROVOD_ELASTIC_TIMEOUT"  # seconds an elastic round may take (launcher and workers)
SPARK_START_TIMEOUT = "HOROVOD_SPARK_START_TIMEOUT"  # seconds for the Spark tasks to start
SPARK_WORK_DIR = "HOROVOD_SPARK_WORK_DIR"  # a Spark task's working folder, for the process it starts
SPARK_TASK_PID = "HOROVOD_SPARK_TASK_PID"  # the Spark task's process id: its worker dies with it
SPARK_TASK_GPUS = "HOROVOD_SPARK_TASK_GPUS"  # the GPU addresses Spark gave the task, comma-separated
NCCL_SOCKET_IFNAME = "NCCL_SOCKET_IFNAME"  # NCCL's own: the interfaces of the job
NCCL_IB_DISABLE = "NCCL_IB_DISABLE"  # NCCL's own: --tcp

#: Every variable the launcher writes that is not an engine knob.
LAUNCHER_VARIABLES = frozenset({SECRET_KEY, START_TIMEOUT, ELASTIC_TIMEOUT, SPARK_START_TIMEOUT, SPARK_WORK_DIR,
                                SPARK_TASK_PID, SPARK_TASK_GPUS, NCCL_SOCKET_IFNAME, NCCL_IB_DISABLE,
                                "PYTHONUNBUFFERED"})
