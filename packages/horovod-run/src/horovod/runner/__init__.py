"""horovod.runner: the ``horovodrun`` launcher and its Python API :func:`run`."""

import warnings


class _HorovodArgs:
    """Attribute bag with every ``horovodrun`` argument (all None except ``num_proc = 1``).

    Lets Python callers build the arguments of :func:`horovod.runner.launch._run` without the
    command-line parser.
    """

    def __init__(self):
        self.num_proc = 1
        for name in ("check_build", "ssh_port", "ssh_identity_file", "disable_cache",
                     "start_timeout", "nic", "output_filename", "verbose", "command", "run_func",
                     "config_file", "nics", "executable", "fusion_threshold_mb", "cycle_time_ms",
                     "cache_capacity", "hierarchical_allreduce", "hierarchical_allgather",
                     "torus_allreduce", "autotune", "autotune_log_file",
                     "autotune_warmup_samples", "autotune_steps_per_sample",
                     "autotune_bayes_opt_max_samples", "autotune_gaussian_process_noise",
                     "min_num_proc", "max_num_proc", "slots", "elastic_timeout", "reset_limit",
                     "cooldown_range", "timeline_filename", "timeline_mark_cycles",
                     "no_stall_check", "stall_check_warning_time_seconds",
                     "stall_check_shutdown_time_seconds", "deadlock_timeout_seconds", "mpi_threads_disable", "mpi_args",
                     "tcp_flag", "binding_args", "num_nccl_streams", "thread_affinity",
                     "gloo_timeout_seconds", "log_level", "log_with_timestamp",
                     "prefix_output_with_timestamp", "hosts", "hostfile",
                     "host_discovery_script", "use_gloo", "use_mpi", "use_jsrun"):
            setattr(self, name, None)


def _deprecated(old, new, value):
    warnings.warn("%s is deprecated, use %s instead" % (old, new), DeprecationWarning,
                  stacklevel=3)
    return value


def run(func, args=(), kwargs=None, num_proc=1, min_num_proc=None, max_num_proc=None,
        slots=None, reset_limit=None, cooldown_range=None, hosts=None, hostfile=None,
        host_discovery_script=None, start_timeout=None, ssh_port=None, ssh_identity_file=None,
        disable_cache=None, output_filename=None, verbose=None, use_gloo=None, use_mpi=None,
        mpi_args=None, network_interface=None, network_interfaces=None, executable=None,
        np=None, min_np=None, max_np=None):
    """Run ``func(*args, **kwargs)`` on ``num_proc`` Horovod workers; return their results.

    The function is shipped to the workers with cloudpickle through the launcher's
    authenticated KV store, so it and its return value must be picklable. The other arguments
    mean what the ``horovodrun`` flags of the same names mean; ``start_timeout`` is in seconds.
    ``np``, ``min_np``, ``max_np`` and a comma-separated ``network_interface`` are deprecated
    spellings (``DeprecationWarning``).

    Args:
        func: the function each worker runs; ``args`` and ``kwargs`` are its arguments.
        num_proc (int): the number of workers (``-np``).
        min_num_proc, max_num_proc (int): elastic mode's fewest and most workers (``--min-np``,
            ``--max-np``).
        slots (int): workers per host found by ``host_discovery_script`` (``--slots-per-host``).
        reset_limit (int): how many times an elastic job may be reset (``--reset-limit``).
        cooldown_range (tuple): seconds a failed host is excluded, least and most
            (``--blacklist-cooldown-range``).
        hosts (str): ``"host1:2,host2:4"`` (``-H``); hostfile (str): a file of ``host slots=N``
            lines (``--hostfile``).
        host_discovery_script (str): a script printing the available ``host:slots``, for
            elastic mode (``--host-discovery-script``).
        start_timeout (int): seconds to wait for every worker to start (``--start-timeout``).
        ssh_port (int), ssh_identity_file (str): how to reach remote hosts (``-p``, ``-i``).
        disable_cache (bool): do not cache the checks of the hosts (``--disable-cache``).
        output_filename (str): a folder for each worker's output (``--output-filename``).
        verbose (int): the launcher's log level (``--verbose``).
        use_gloo, use_mpi (bool): the controller to run with (``--gloo``, ``--mpi``).
        mpi_args (str): more arguments of ``mpirun`` (``--mpi-args``).
        network_interface, network_interfaces: the interfaces to use (``--network-interfaces``);
            a list, or a comma-separated string (deprecated).
        executable (str): the Python that runs ``func`` on the workers (default: this one).
        np, min_np, max_np: deprecated spellings of ``num_proc``, ``min_num_proc``,
            ``max_num_proc``.

    Returns:
        A list indexed by rank of the values ``func`` returned.

    Raises:
        ValueError: both ``hosts`` and ``hostfile``, or both ``use_gloo`` and ``use_mpi``, are
            given, or the job cannot be set up (e.g. a feature not available in this release).
        RuntimeError: a worker failed (the message names the first failed rank and its exit code).
    """
    from horovod.runner import launch

    if np is not None:
        num_proc = _deprecated("np", "num_proc", np)
    if min_np is not None:
        min_num_proc = _deprecated("min_np", "min_num_proc", min_np)
    if max_np is not None:
        max_num_proc = _deprecated("max_np", "max_num_proc", max_np)
    if network_interface is not None:
        names = [n for n in network_interface.split(",") if n]
        if len(names) > 1:
            _deprecated("a comma-separated network_interface", "network_interfaces", None)
        network_interfaces = list(network_interfaces or []) + names
    if hosts is not None and hostfile is not None:
        raise ValueError("give hosts or hostfile, not both")
    if use_gloo and use_mpi:
        raise ValueError("give use_gloo or use_mpi, not both")

    hargs = _HorovodArgs()
    hargs.num_proc = num_proc
    hargs.min_num_proc = min_num_proc
    hargs.max_num_proc = max_num_proc
    hargs.slots = slots
    hargs.reset_limit = reset_limit
    hargs.cooldown_range = cooldown_range
    hargs.hosts = hosts
    hargs.hostfile = hostfile
    hargs.host_discovery_script = host_discovery_script
    hargs.start_timeout = start_timeout
    hargs.ssh_port = ssh_port
    hargs.ssh_identity_file = ssh_identity_file
    hargs.disable_cache = disable_cache
    hargs.output_filename = output_filename
    hargs.verbose = verbose
    hargs.use_gloo = use_gloo
    hargs.use_mpi = use_mpi
    hargs.mpi_args = mpi_args
    hargs.nics = set(network_interfaces or []) or None
    hargs.executable = executable
    kwargs = kwargs or {}
    hargs.run_func = lambda: func(*args, **kwargs)
    return launch._run(hargs)
