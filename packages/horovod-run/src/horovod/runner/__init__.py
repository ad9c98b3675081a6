"""horovod.runner: the ``horovodrun`` launcher."""


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
                     "stall_check_shutdown_time_seconds", "mpi_threads_disable", "mpi_args",
                     "tcp_flag", "binding_args", "num_nccl_streams", "thread_affinity",
                     "gloo_timeout_seconds", "log_level", "log_with_timestamp",
                     "prefix_output_with_timestamp", "hosts", "hostfile",
                     "host_discovery_script", "use_gloo", "use_mpi", "use_jsrun"):
            setattr(self, name, None)
