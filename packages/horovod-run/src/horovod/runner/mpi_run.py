"""Static launch through the system's ``mpirun`` (Open MPI, Spectrum MPI, MPICH, Intel MPI).

mpirun starts the workers and gives each its rank, size and topology, so no rendezvous server
runs. horovodrun only translates its options into one ``mpirun`` command line, whose form is
fixed by the launcher spec (runner.md §5.4): placeholders joined by single spaces, empty ones
included. Which MPI is installed is read from ``mpirun --version``, because the flags differ:
MPICH and Intel MPI (Hydra) take ``-hosts``/``-ppn``/``-genv`` and forward the whole environment
themselves, Open MPI and Spectrum MPI take ``-H``/``-mca`` and forward only the variables named
with ``-x KEY`` (a name, never its value, so values stay off ``ps`` listings).
"""

import os
import shlex
import sys

from horovod.runner.common.util import env as env_util
from horovod.runner.common.util import hosts, safe_shell_exec, tiny_shell_exec

_OMPI_IMPL = "OpenMPI"
_SMPI_IMPL = "SpectrumMPI"
_MPICH_IMPL = "MPICH"
_IMPI_IMPL = "IntelMPI"
_UNKNOWN_IMPL = "Unknown"
_MISSING_IMPL = "Missing"

# Substrings of ``mpirun --version`` output, tried in this order.
_VERSION_MARKERS = [
    ("Open MPI", _OMPI_IMPL),
    ("OpenRTE", _OMPI_IMPL),
    ("IBM Spectrum MPI", _SMPI_IMPL),
    ("MPICH", _MPICH_IMPL),
    ("HYDRA", _MPICH_IMPL),
    ("Intel(R) MPI", _IMPI_IMPL),
]

# At this many hosts Open MPI's tree spawn over ssh is turned off and all daemons start at once.
_LARGE_CLUSTER_THRESHOLD = 64

# Open MPI: the ob1 point-to-point layer (shared memory and TCP), never the deprecated openib.
_OMPI_FLAGS = ["-mca pml ob1", "-mca btl ^openib"]
_SMPI_FLAGS = []
_SMPI_FLAGS_TCP = ["-tcp"]
# Horovod runs its own background thread per process: by default pin nothing, fill slots in order.
_NO_BINDING_ARGS = ["-bind-to none", "-map-by slot"]
_SOCKET_BINDING_ARGS = ["-bind-to socket", "-map-by socket", "-rank-by core"]

_MPI_NOT_FOUND_ERROR_MSG = (
    "horovodrun could not find a supported MPI: 'mpirun --version' is missing or names none of "
    "Open MPI, IBM Spectrum MPI, MPICH or Intel MPI. Install one of them (Debian: apt-get "
    "install openmpi-bin libopenmpi-dev, then reinstall horovod-core), start the job with your "
    "MPI's own launcher (mpirun -np N python train.py), or use the Gloo controller (--gloo).")

MPIRUN_FAILED_MESSAGE = "mpirun failed with exit code {code}"


def _get_mpi_implementation(env=None):
    """Name the MPI behind ``mpirun`` on PATH: one of the ``_*_IMPL`` constants.

    ``_MISSING_IMPL`` when ``mpirun --version`` cannot run or fails, ``_UNKNOWN_IMPL`` (with its
    output printed to stderr) when it names no known implementation.
    """
    result = tiny_shell_exec.execute("mpirun --version", env=env)
    if result is None or result[1] != 0:
        return _MISSING_IMPL
    output = result[0]
    for marker, impl in _VERSION_MARKERS:
        if marker in output:
            return impl
    print("horovodrun: unknown MPI implementation in the output of 'mpirun --version':\n%s"
          % output, file=sys.stderr, flush=True)
    return _UNKNOWN_IMPL


def _get_mpi_implementation_flags(tcp_flag, env=None):
    """Return ``(flags, binding_args, impl)`` for the installed MPI (fresh lists).

    ``(None, None, None)`` when no supported MPI is installed.
    """
    impl = _get_mpi_implementation(env=env)
    if impl == _OMPI_IMPL:
        return list(_OMPI_FLAGS), list(_NO_BINDING_ARGS), impl
    if impl == _SMPI_IMPL:
        return list(_SMPI_FLAGS_TCP if tcp_flag else _SMPI_FLAGS), list(_SOCKET_BINDING_ARGS), impl
    if impl == _MPICH_IMPL:
        return [], list(_NO_BINDING_ARGS), impl
    if impl == _IMPI_IMPL:
        return [], [], impl
    return None, None, None


def mpi_available(env=None):
    """True if ``mpirun`` on PATH belongs to a supported MPI."""
    return _get_mpi_implementation(env) not in (_UNKNOWN_IMPL, _MISSING_IMPL)


def is_open_mpi(env=None):
    return _get_mpi_implementation(env) == _OMPI_IMPL


def is_spectrum_mpi(env=None):
    return _get_mpi_implementation(env) == _SMPI_IMPL


def is_mpich(env=None):
    return _get_mpi_implementation(env) == _MPICH_IMPL


def is_intel_mpi(env=None):
    return _get_mpi_implementation(env) == _IMPI_IMPL


def _ssh_args(settings, hydra):
    options = []
    if settings.ssh_port:
        options.append("-p %s" % settings.ssh_port)
    if settings.ssh_identity_file:
        options.append("-i %s" % settings.ssh_identity_file)
    if not options:
        return ""
    if hydra:
        return '-bootstrap=ssh -bootstrap-exec-args "%s"' % " ".join(options)
    return '-mca plm_rsh_args "%s"' % " ".join(options)


def _hosts_and_ppn(host_string, host_names, host_to_slots, hydra):
    """The ``-H``/``-hosts`` argument and the ``ppn`` placeholder (``' '`` unless Hydra)."""
    if not hydra:
        return "-H %s" % host_string, " "
    ppn = " "
    if host_names:
        slots = {host_to_slots[name] for name in host_names}
        if len(slots) > 1:
            raise Exception("Hydra's -ppn takes one number of processes per host, but the hosts "
                            "have different slots (%s); give MPICH/Intel MPI a machine file "
                            "through --mpi-args=\"-machinefile <file>\" instead" % host_string)
        ppn = " -ppn %d " % slots.pop()
    return "-hosts %s" % ",".join(host_names), ppn


def _interface_args(nics, hydra, impl):
    """``(tcp_if, nccl_if)``: MPI's own TCP interfaces and NCCL's socket interfaces."""
    if not nics:
        return "", ""
    nics = sorted(nics) if isinstance(nics, (set, frozenset)) else list(nics)
    joined = ",".join(nics)
    if not hydra:
        tcp_if = "-mca btl_tcp_if_include %s" % joined
    elif impl == _IMPI_IMPL:
        if len(nics) > 1:
            raise Exception("Intel MPI's -iface takes one network interface, got %s" % joined)
        tcp_if = "-iface %s" % nics[0]
    else:
        tcp_if = ""
    return tcp_if, "-%s NCCL_SOCKET_IFNAME=%s" % ("genv" if hydra else "x", joined)


def build_mpirun_command(settings, nics, env, command, impl_flags, impl_binding_args, impl):
    """The ``mpirun`` command line (a ``/bin/sh -c`` string) for ``command`` (list of args)."""
    hydra = impl in (_IMPI_IMPL, _MPICH_IMPL)
    host_string = settings.hosts or "localhost:%d" % settings.num_proc
    host_names, host_to_slots = hosts.parse_hosts_and_slots(host_string)
    hosts_arg, ppn = _hosts_and_ppn(host_string, host_names, host_to_slots, hydra)

    flags = list(impl_flags)
    if not hydra:
        if len(host_names) >= _LARGE_CLUSTER_THRESHOLD:
            flags.append("-mca plm_rsh_no_tree_spawn true")
            flags.append("-mca plm_rsh_num_concurrent %d" % len(host_names))
        if settings.prefix_output_with_timestamp:
            flags.append("--timestamp-output")
        # Open MPI refuses more processes than the slots -H gives unless told to oversubscribe.
        if settings.num_proc > sum(host_to_slots.values()):
            flags.append("--oversubscribe")

    if settings.binding_args and not hydra:
        binding = settings.binding_args
    else:
        binding = " ".join(impl_binding_args)
    tcp_if, nccl_if = _interface_args(nics, hydra, impl)
    output = ""
    if settings.output_filename:
        output = "%s %s" % ("-outfile-pattern" if hydra else "--output-filename",
                            settings.output_filename)
    env_args = "" if hydra else " ".join(
        "-x %s" % shlex.quote(key) for key in sorted(env) if env_util.is_exportable(key))
    if isinstance(command, str):
        command = [command]
    parts = [
        "mpirun",
        "-l" if hydra else "--allow-run-as-root --tag-output",
        "-np %d%s%s" % (settings.num_proc, ppn, hosts_arg),
        binding,
        " ".join(flags),
        _ssh_args(settings, hydra),
        tcp_if,
        nccl_if,
        output,
        env_args,
        settings.extra_mpi_args or "",
        " ".join(shlex.quote(arg) for arg in command),
    ]
    return " ".join(parts)


def mpi_run(settings, nics, env, command, stdout=None, stderr=None):
    """Run ``command`` on ``settings.num_proc`` processes started by ``mpirun``.

    Args:
        settings: a :class:`~horovod.runner.common.util.settings.Settings` (``num_proc``,
            ``hosts``, ``tcp_flag``, ``binding_args``, ``extra_mpi_args``, ``ssh_port``,
            ``ssh_identity_file``, ``output_filename``, ``prefix_output_with_timestamp``,
            ``run_func_mode``, ``key``, ``verbose``).
        nics: network interface names for MPI's TCP transport and NCCL, or None.
        env: dict, the workers' environment: every exportable key is forwarded by name.
            ``PATH`` and ``PYTHONPATH`` of this process are added to mpirun's own environment
            when absent. None means a copy of ``os.environ``.
        command: list of program arguments.
        stdout, stderr: text streams for mpirun's output in function mode (default: this
            process's).

    In command mode (``settings.run_func_mode`` false) this process is replaced by mpirun
    (``os.execve``), so horovodrun's exit status is mpirun's. In function mode mpirun runs as
    a child. Local ranks inherit mpirun's environment, so a variable that must not be named on
    the command line (the job secret, ``env.IGNORE_REGEXES``) still reaches them through
    ``env``.

    Raises:
        Exception: ``env`` is not a dict, no supported MPI is installed, or the hosts cannot
            be expressed for Hydra (unequal slots; several interfaces for Intel MPI).
        RuntimeError: function mode only, mpirun exited non-zero (a rank failed).
    """
    if env is None:
        env = dict(os.environ)
    if not isinstance(env, dict):
        raise Exception("env argument must be a dict, not %s: %s" % (type(env), env))

    impl_flags, impl_binding_args, impl = _get_mpi_implementation_flags(settings.tcp_flag,
                                                                        env=env)
    if impl_flags is None:
        raise Exception(_MPI_NOT_FOUND_ERROR_MSG)
    mpirun_command = build_mpirun_command(settings, nics, env, command, impl_flags,
                                          impl_binding_args, impl)
    if settings.verbose >= 2:
        print(mpirun_command, flush=True)

    run_env = dict(env)
    for key in ("PATH", "PYTHONPATH"):
        if key not in run_env and key in os.environ:
            run_env[key] = os.environ[key]

    if settings.run_func_mode:
        exit_code = safe_shell_exec.execute(mpirun_command, env=run_env, stdout=stdout,
                                            stderr=stderr)
        if exit_code != 0:
            raise RuntimeError(MPIRUN_FAILED_MESSAGE.format(code=exit_code))
    else:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve("/bin/sh", ["/bin/sh", "-c", mpirun_command], run_env)
