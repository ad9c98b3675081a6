"""Static launch through ``jsrun``, IBM's Job Step Manager launcher, inside an LSF job.

jsrun starts the ranks of an MPI job (IBM Spectrum MPI) on the hosts of the LSF allocation
(``horovod.runner.util.lsf``) and serves each a PMIx server, so that ``MPI_Init`` knows its rank and
size: Horovod runs with the MPI controller and no rendezvous server. horovodrun places the ranks
with an Explicit Resource File (ERF, jsrun's ``--erf_input``) that gives each rank a host and an
equal share of that host's hardware threads, written in jsrun's format::

    overlapping_rs: allow
    cpu_index_using: logical

    rank: 0: { hostname: host1; cpu: {0-3} ; gpu: * ; mem: * }
    rank: 1: { hostname: host1; cpu: {4-7} ; gpu: * ; mem: * }

Every rank may use all GPUs and all memory of its host (``*``); Horovod picks a rank's GPU by its
local rank. ``cpu_index_using: logical`` numbers the hardware threads as hwloc's logical indices,
so a rank's CPUs stay contiguous whatever the SMT level. ``--binding-args`` replaces the ERF with
jsrun's own resource-set options.
"""

import os
import shlex
import shutil
import sys
import tempfile

from horovod.runner.common.util import hosts, safe_shell_exec
from horovod.runner.mpi_run import _MPI_NOT_FOUND_ERROR_MSG, _get_mpi_implementation_flags
from horovod.runner.util import lsf

JSRUN_NOT_FOUND_MESSAGE = (
    "horovodrun could not find the jsrun command. jsrun (IBM Job Step Manager) exists on "
    "LSF clusters that run it, such as Summit and Sierra; elsewhere launch with --mpi or --gloo.")
JSRUN_FAILED_MESSAGE = "jsrun failed with exit code {code}"
_RANKFILE_PREFIX = "horovod-jsrun-"


def is_jsrun_installed():
    """True if a ``jsrun`` executable is on PATH."""
    return shutil.which("jsrun") is not None


def _ranks_per_host(settings, slots_per_host):
    """``[(host, ranks), ...]``: ``settings.num_proc`` ranks filling the hosts in order."""
    host_names, host_to_slots = hosts.parse_hosts_and_slots(settings.hosts)
    placed = []
    remaining = settings.num_proc
    for host in host_names:
        if remaining == 0:
            break
        slots = host_to_slots[host]
        if slots > slots_per_host:
            raise ValueError("host %s is given %d slots, more than the %d ranks per host of this "
                             "LSF allocation (one per GPU, or per core without GPUs)"
                             % (host, slots, slots_per_host))
        ranks = min(slots, remaining)
        placed.append((host, ranks))
        remaining -= ranks
    if remaining:
        raise ValueError("the hosts %s have fewer slots than the %d processes asked for"
                         % (settings.hosts, settings.num_proc))
    return placed


def generate_jsrun_rankfile(settings, path=None):
    """Write the ERF that places ``settings.num_proc`` ranks on ``settings.hosts``; return its path.

    Ranks fill the hosts in the order given, each host up to its slots. On each host the
    ``cores x threads`` hardware threads of the allocation (``LSFUtils.get_num_cores()`` and
    ``get_num_threads()``) are split evenly between ``LSFUtils.get_slots_per_host()`` ranks,
    rank after rank from logical CPU 0.

    Args:
        settings: a :class:`~horovod.runner.common.util.settings.Settings` with ``num_proc``
            (int) and ``hosts`` (``"host1:4,host2:4"``).
        path: the file to write (replaced if it exists). None: a new file
            ``horovod-jsrun-*.erf`` in the temporary directory (``TMPDIR``, which LSF makes per job
            and removes when the job ends); the caller may delete it once jsrun has started.

    Raises:
        ValueError: a host has more slots than the allocation has ranks per host, the hosts have
            fewer slots than ``num_proc``, or a host has fewer hardware threads than ranks.
        RuntimeError: the allocation cannot be read (see ``LSFUtils``).
    """
    slots_per_host = lsf.LSFUtils.get_slots_per_host()
    threads = lsf.LSFUtils.get_num_cores() * lsf.LSFUtils.get_num_threads()
    cpus_per_rank = threads // slots_per_host
    if cpus_per_rank < 1:
        raise ValueError("an LSF compute host has %d hardware threads, too few for %d ranks"
                         % (threads, slots_per_host))
    placed = _ranks_per_host(settings, slots_per_host)

    lines = ["overlapping_rs: allow", "cpu_index_using: logical"]
    rank = 0
    for host, ranks in placed:
        lines.append("")
        for local_rank in range(ranks):
            first = local_rank * cpus_per_rank
            lines.append("rank: %d: { hostname: %s; cpu: {%d-%d} ; gpu: * ; mem: * }"
                         % (rank, host, first, first + cpus_per_rank - 1))
            rank += 1
    if path is None:
        with tempfile.NamedTemporaryFile("w", prefix=_RANKFILE_PREFIX, suffix=".erf",
                                         delete=False) as f:
            path = f.name
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def build_jsrun_command(settings, command, impl_flags, binding_args):
    """The ``jsrun`` command line (a ``/bin/sh -c`` string): placeholders joined by single spaces,
    empty ones included (runner.md §5.6)."""
    smpiargs = " ".join(list(impl_flags) + ([settings.extra_mpi_args]
                                             if settings.extra_mpi_args else []))
    output = ""
    if settings.output_filename:
        output = "--stdio_stderr %s --stdio_stdout %s" % (settings.output_filename,
                                                         settings.output_filename)
    if isinstance(command, str):
        command = [command]
    return " ".join([
        "jsrun",
        binding_args,
        output,
        "--smpiargs %s" % shlex.quote(smpiargs) if smpiargs else "",
        " ".join(shlex.quote(arg) for arg in command),
    ])


def js_run(settings, nics, env, command, stdout=None, stderr=None):
    """Run ``command`` on ``settings.num_proc`` ranks started by ``jsrun``.

    Args:
        settings: a :class:`~horovod.runner.common.util.settings.Settings` (``num_proc``,
            ``hosts``, ``tcp_flag``, ``binding_args``, ``extra_mpi_args``, ``output_filename``,
            ``run_func_mode``, ``verbose``). Without ``binding_args`` the ranks are placed by an
            ERF from :func:`generate_jsrun_rankfile`.
        nics: network interface names for NCCL (``NCCL_SOCKET_IFNAME`` unless ``env`` sets it),
            or None.
        env: dict, the environment of jsrun, which passes it on to every rank. None means a
            copy of ``os.environ``.
        command: list of program arguments.
        stdout, stderr: text streams for jsrun's output in function mode (default: this
            process's).

    In command mode (``settings.run_func_mode`` false) this process is replaced by jsrun
    (``os.execve``), so horovodrun's exit status is jsrun's. In function mode jsrun runs as a
    child.

    Raises:
        Exception: ``env`` is not a dict, no supported MPI is installed, or jsrun is not on PATH.
        ValueError, RuntimeError: from :func:`generate_jsrun_rankfile`.
        RuntimeError: function mode only, jsrun exited non-zero (a rank failed).
    """
    if env is None:
        env = dict(os.environ)
    if not isinstance(env, dict):
        raise Exception("env argument must be a dict, not %s: %s" % (type(env), env))
    # Only the flags are used: the MPI's own binding arguments are mpirun's, not jsrun's.
    impl_flags = _get_mpi_implementation_flags(settings.tcp_flag, env=env)[0]
    if impl_flags is None:
        raise Exception(_MPI_NOT_FOUND_ERROR_MSG)
    if not is_jsrun_installed():
        raise Exception(JSRUN_NOT_FOUND_MESSAGE)

    if nics and "NCCL_SOCKET_IFNAME" not in env:
        ordered = sorted(nics) if isinstance(nics, (set, frozenset)) else list(nics)
        env = dict(env, NCCL_SOCKET_IFNAME=",".join(ordered))
    rankfile = None
    if settings.binding_args:
        binding_args = settings.binding_args
    else:
        rankfile = generate_jsrun_rankfile(settings)
        binding_args = "--erf_input %s" % shlex.quote(rankfile)
        if settings.verbose >= 2:
            with open(rankfile) as f:
                print(f.read(), end="", flush=True)
    jsrun_command = build_jsrun_command(settings, command, impl_flags, binding_args)
    if settings.verbose >= 2:
        print(jsrun_command, flush=True)

    if settings.run_func_mode:
        try:
            exit_code = safe_shell_exec.execute(jsrun_command, env=env, stdout=stdout,
                                                stderr=stderr)
        finally:
            # Only a file of ours: a test may stand in another path for the generator.
            if rankfile is not None and os.path.basename(rankfile).startswith(_RANKFILE_PREFIX):
                os.remove(rankfile)
        if exit_code != 0:
            raise RuntimeError(JSRUN_FAILED_MESSAGE.format(code=exit_code))
    else:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve("/bin/sh", ["/bin/sh", "-c", jsrun_command], env)
