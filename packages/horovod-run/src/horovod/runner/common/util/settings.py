"""Launcher settings shared by the launch modes (picklable)."""


class BaseSettings:
    """Settings of one job.

    Args:
        num_proc: number of worker processes.
        verbose: 0 quiet, 1 some, 2 the launcher's step-by-step lines.
        ssh_port, ssh_identity_file: ssh options for remote hosts.
        extra_mpi_args, tcp_flag, binding_args: mpirun options.
        key: the job secret (bytes).
        start_timeout: a :class:`~horovod.runner.common.util.timeout.Timeout` for start-up.
        output_filename: directory for per-rank output files, or None.
        run_func_mode: True when running a Python function rather than a command.
        nics: set of network interface names to use, or None.
        elastic: True for elastic jobs.
        prefix_output_with_timestamp: prefix every forwarded output line with the local time.
    """

    def __init__(self, num_proc=None, verbose=0, ssh_port=None, ssh_identity_file=None,
                 extra_mpi_args=None, tcp_flag=None, binding_args=None, key=None,
                 start_timeout=None, output_filename=None, run_func_mode=None, nics=None,
                 elastic=False, prefix_output_with_timestamp=False):
        self.num_proc = num_proc
        self.verbose = verbose
        self.ssh_port = ssh_port
        self.ssh_identity_file = ssh_identity_file
        self.extra_mpi_args = extra_mpi_args
        self.tcp_flag = tcp_flag
        self.binding_args = binding_args
        self.key = key
        self.start_timeout = start_timeout
        self.output_filename = output_filename
        self.run_func_mode = run_func_mode
        self.nics = nics
        self.elastic = elastic
        self.prefix_output_with_timestamp = prefix_output_with_timestamp


class Settings(BaseSettings):
    """Settings of a static job; ``hosts`` is the ``host:slots,...`` string."""

    def __init__(self, hosts=None, **kwargs):
        super().__init__(elastic=False, **kwargs)
        self.hosts = hosts
