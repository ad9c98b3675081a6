"""Tuning arguments: from the YAML config file into args, and from args into ``HOROVOD_*`` env."""

from horovod.runner.common.util import env_names
from horovod.runner.common.util.hosts import parse_hosts_and_slots

# The variables the tuning arguments set. Upstream's module names each by a constant whose value
# is its own name; here the names come from env_names, which takes them from the engine's knob table.
HOROVOD_FUSION_THRESHOLD = env_names.FUSION_THRESHOLD
HOROVOD_CYCLE_TIME = env_names.CYCLE_TIME
HOROVOD_CACHE_CAPACITY = env_names.CACHE_CAPACITY
HOROVOD_HIERARCHICAL_ALLREDUCE = env_names.HIERARCHICAL_ALLREDUCE
HOROVOD_HIERARCHICAL_ALLGATHER = env_names.HIERARCHICAL_ALLGATHER
HOROVOD_TORUS_ALLREDUCE = env_names.TORUS_ALLREDUCE
HOROVOD_AUTOTUNE = env_names.AUTOTUNE
HOROVOD_AUTOTUNE_LOG = env_names.AUTOTUNE_LOG
HOROVOD_AUTOTUNE_WARMUP_SAMPLES = env_names.AUTOTUNE_WARMUP_SAMPLES
HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE = env_names.AUTOTUNE_STEPS_PER_SAMPLE
HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES = env_names.AUTOTUNE_BAYES_OPT_MAX_SAMPLES
HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE = env_names.AUTOTUNE_GAUSSIAN_PROCESS_NOISE
HOROVOD_TIMELINE = env_names.TIMELINE
HOROVOD_TIMELINE_MARK_CYCLES = env_names.TIMELINE_MARK_CYCLES
HOROVOD_STALL_CHECK_DISABLE = env_names.STALL_CHECK_DISABLE
HOROVOD_STALL_CHECK_TIME_SECONDS = env_names.STALL_CHECK_TIME_SECONDS
HOROVOD_STALL_SHUTDOWN_TIME_SECONDS = env_names.STALL_SHUTDOWN_TIME_SECONDS
HOROVOD_DEADLOCK_TIMEOUT_SECONDS = env_names.DEADLOCK_TIMEOUT_SECONDS
HOROVOD_MPI_THREADS_DISABLE = env_names.MPI_THREADS_DISABLE
HOROVOD_NUM_NCCL_STREAMS = env_names.NUM_NCCL_STREAMS
NCCL_IB_DISABLE = env_names.NCCL_IB_DISABLE
HOROVOD_THREAD_AFFINITY = env_names.THREAD_AFFINITY
HOROVOD_GLOO_TIMEOUT_SECONDS = env_names.GLOO_TIMEOUT_SECONDS
HOROVOD_LOG_LEVEL = env_names.LOG_LEVEL
HOROVOD_LOG_HIDE_TIME = env_names.LOG_HIDE_TIME

LOG_LEVELS = ["TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"]

# Config file sections: {section: {key: dest}}. The controller and the stall-check "enabled"
# switch need a transform and are handled apart.
_SECTIONS = {
    "params": {k: k for k in ("fusion_threshold_mb", "cycle_time_ms", "cache_capacity",
                              "hierarchical_allreduce", "hierarchical_allgather",
                              "torus_allreduce")},
    "autotune": {"enabled": "autotune", "log_file": "autotune_log_file",
                 "warmup_samples": "autotune_warmup_samples",
                 "steps_per_sample": "autotune_steps_per_sample",
                 "bayes_opt_max_samples": "autotune_bayes_opt_max_samples",
                 "gaussian_process_noise": "autotune_gaussian_process_noise"},
    "timeline": {"filename": "timeline_filename", "mark_cycles": "timeline_mark_cycles"},
    "stall_check": {"warning_time_seconds": "stall_check_warning_time_seconds",
                    "shutdown_time_seconds": "stall_check_shutdown_time_seconds"},
    "library_options": {k: k for k in ("mpi_threads_disable", "num_nccl_streams",
                                       "thread_affinity", "gloo_timeout_seconds")},
    "logging": {"level": "log_level", "with_timestamp": "log_with_timestamp"},
}

_NON_NEGATIVE = ["fusion_threshold_mb", "cycle_time_ms", "cache_capacity",
                 "autotune_warmup_samples", "autotune_steps_per_sample",
                 "autotune_bayes_opt_max_samples", "stall_check_warning_time_seconds",
                 "stall_check_shutdown_time_seconds", "deadlock_timeout_seconds", "num_nccl_streams",
                 "thread_affinity", "gloo_timeout_seconds"]


def set_args_from_config(args, config: dict, override_args):
    """Copy values of a loaded YAML config (dict) into ``args``.

    A value is applied only when its dest is not in ``override_args`` (the dests given
    explicitly on the command line). Raises ``ValueError`` for a controller other than
    ``gloo`` or ``mpi``.
    """
    def apply(dest, value):
        if dest not in override_args:
            setattr(args, dest, value)

    controller = config.get("controller")
    if controller is not None:
        if controller not in ("gloo", "mpi"):
            raise ValueError("config file: controller must be 'gloo' or 'mpi', got %r"
                             % (controller,))
        if not (getattr(args, "use_gloo", False) or getattr(args, "use_mpi", False)
                or getattr(args, "use_jsrun", False)):
            args.use_gloo = controller == "gloo"
            args.use_mpi = controller == "mpi"

    for section, keys in _SECTIONS.items():
        values = config.get(section)
        if values is None:
            continue
        if section == "autotune":
            apply("autotune", bool(values.get("enabled", False)))
        for key, dest in keys.items():
            if key in values and dest != "autotune":
                apply(dest, values[key])

    stall_check = config.get("stall_check")
    if stall_check is not None and "enabled" in stall_check:
        apply("no_stall_check", not stall_check["enabled"])


def validate_config_args(args):
    """Check tuning values and host strings.

    Raises ``ValueError`` naming the argument and its value when a count or time is negative,
    when ``autotune_gaussian_process_noise`` is outside [0, 1], or when ``hosts`` is not
    ``name:slots,...``.
    """
    for name in _NON_NEGATIVE:
        value = getattr(args, name, None)
        if value is not None and value < 0:
            raise ValueError("%s must be >= 0, got %r" % (name, value))
    noise = getattr(args, "autotune_gaussian_process_noise", None)
    if noise is not None and not 0 <= noise <= 1:
        raise ValueError("autotune_gaussian_process_noise must be in [0, 1], got %r" % (noise,))
    hosts = getattr(args, "hosts", None)
    if hosts:
        parse_hosts_and_slots(hosts)


def _flag(value) -> str:
    return "1" if value else "0"


def set_env_from_args(env: dict, args) -> dict:
    """Write the ``HOROVOD_*`` variables for the tuning arguments that are set into ``env``.

    An argument that is None leaves ``env`` alone; one that is set overwrites the variable.
    Autotune variables are written only when autotune is on, timeline variables only with a
    timeline file name. Returns ``env``.
    """
    def put(name, value, transform=str):
        if value is not None:
            env[name] = transform(value)

    def arg(name):
        return getattr(args, name, None)

    put(HOROVOD_FUSION_THRESHOLD, arg("fusion_threshold_mb"),
        lambda mb: str(int(mb) * 1024 * 1024))
    put(HOROVOD_CYCLE_TIME, arg("cycle_time_ms"), lambda ms: str(float(ms)))
    put(HOROVOD_CACHE_CAPACITY, arg("cache_capacity"), lambda n: str(int(n)))
    put(HOROVOD_HIERARCHICAL_ALLREDUCE, arg("hierarchical_allreduce"), _flag)
    put(HOROVOD_HIERARCHICAL_ALLGATHER, arg("hierarchical_allgather"), _flag)
    put(HOROVOD_TORUS_ALLREDUCE, arg("torus_allreduce"), _flag)

    if arg("autotune"):
        env[HOROVOD_AUTOTUNE] = "1"
        put(HOROVOD_AUTOTUNE_LOG, arg("autotune_log_file"))
        put(HOROVOD_AUTOTUNE_WARMUP_SAMPLES, arg("autotune_warmup_samples"))
        put(HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE, arg("autotune_steps_per_sample"))
        put(HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES, arg("autotune_bayes_opt_max_samples"))
        put(HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE, arg("autotune_gaussian_process_noise"))

    if arg("timeline_filename"):
        env[HOROVOD_TIMELINE] = str(arg("timeline_filename"))
        put(HOROVOD_TIMELINE_MARK_CYCLES, arg("timeline_mark_cycles"), _flag)

    put(HOROVOD_STALL_CHECK_DISABLE, arg("no_stall_check"), _flag)
    put(HOROVOD_STALL_CHECK_TIME_SECONDS, arg("stall_check_warning_time_seconds"))
    put(HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, arg("stall_check_shutdown_time_seconds"))
    put(HOROVOD_DEADLOCK_TIMEOUT_SECONDS, arg("deadlock_timeout_seconds"))
    put(HOROVOD_MPI_THREADS_DISABLE, arg("mpi_threads_disable"), _flag)
    put(HOROVOD_NUM_NCCL_STREAMS, arg("num_nccl_streams"))
    if arg("tcp_flag"):
        env[NCCL_IB_DISABLE] = "1"
    put(HOROVOD_THREAD_AFFINITY, arg("thread_affinity"))
    put(HOROVOD_GLOO_TIMEOUT_SECONDS, arg("gloo_timeout_seconds"))
    put(HOROVOD_LOG_LEVEL, arg("log_level"))
    put(HOROVOD_LOG_HIDE_TIME, arg("log_with_timestamp"), lambda with_ts: _flag(not with_ts))
    return env
