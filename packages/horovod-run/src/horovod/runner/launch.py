"""``horovodrun``: command-line parsing, controller choice and the static launch flow."""

import argparse
import hashlib
import importlib.metadata
import logging
import os
import subprocess
import sys
import time
import warnings

import yaml

from horovod.runner import flight_recorder
from horovod.runner import gloo_run as gloo_launcher
from horovod.runner import js_run as js_launcher
from horovod.runner import mpi_run as mpi_launcher
from horovod.runner import srun_run as srun_launcher
from horovod.runner.common.util import config_parser, hosts, secret, timeout
from horovod.runner.common.util import settings as hvd_settings
from horovod.runner.http.http_client import put_data_into_kvstore, read_data_from_kvstore
from horovod.runner.driver import driver_service
from horovod.runner.http.http_server import KVStoreServer
from horovod.runner.js_run import is_jsrun_installed
from horovod.runner.util import cache, lsf, network, remote, slurm, threads
from horovod.runner.common.util import env_names

DEFAULT_START_TIMEOUT_S = 30
CACHE_FOLDER = os.path.join(os.path.expanduser("~"), ".horovod")
CACHE_STALENESS_THRESHOLD_MINUTES = 60
SSH_ATTEMPTS = 5
SSH_CONNECT_TIMEOUT_S = 10
DEFAULT_ELASTIC_TIMEOUT_S = 600

START_TIMEOUT_MESSAGE = (
    "Timed out waiting for {activity}. Check that the hosts can reach each other, or raise the "
    "limit with --start-timeout (seconds) when starting many hosts.")


def _horovod_version():
    try:
        import horovod
        version = getattr(horovod, "__version__", None)
    except ImportError:
        version = None
    return version or importlib.metadata.version("horovod-run")


def gloo_built(verbose=False):
    """True unless the installed Horovod core says it was built without Gloo.

    The launcher-rendezvous launch itself is pure Python; without an importable core (for
    example a launcher-only install) it still runs commands, so the answer is then True.
    """
    try:
        from horovod.common import util
        return bool(util.gloo_built(verbose=verbose))
    except ImportError:
        return True


def mpi_built(verbose=False):
    """True if the installed Horovod core was built with MPI (False without a core)."""
    try:
        from horovod.common import util
        return bool(util.mpi_built(verbose=verbose))
    except ImportError:
        return False


class _VersionAction(argparse.Action):
    """``--version``: print ``horovod.__version__``, looked up only when asked for."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(_horovod_version())
        parser.exit()


def _record_override(namespace, dest):
    overrides = getattr(namespace, "override_args", None)
    if overrides is None:
        overrides = set()
        namespace.override_args = overrides
    overrides.add(dest)


class _OverrideAction(argparse.Action):
    """Stores the value and records that ``dest`` was given on the command line."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        _record_override(namespace, self.dest)


class _OverrideConstAction(argparse.Action):
    """A flag storing ``const`` and recording that ``dest`` was given on the command line."""

    def __init__(self, option_strings, dest, const, default=None, help=None):
        super().__init__(option_strings, dest=dest, nargs=0, const=const, default=default,
                         help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, self.const)
        _record_override(namespace, self.dest)


class _DeprecatedLogHideAction(_OverrideConstAction):
    def __call__(self, parser, namespace, values, option_string=None):
        replacement = "--log-without-timestamp" if self.const is False else "--log-with-timestamp"
        warnings.warn("%s is deprecated, use %s instead" % (option_string, replacement),
                      DeprecationWarning, stacklevel=2)
        super().__call__(parser, namespace, values, option_string)


class _NicsAction(argparse.Action):
    """Unions comma-separated interface names into the set ``nics``."""

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string == "--network-interface" and "," in values:
            warnings.warn("passing a comma-separated list to --network-interface is deprecated, "
                          "use --network-interfaces instead", DeprecationWarning, stacklevel=2)
        nics = getattr(namespace, self.dest, None) or set()
        nics.update(name for name in values.split(",") if name)
        setattr(namespace, self.dest, nics)


def _add_bool_pair(parser, name, dest, help, hide_positive=False, hide_negative=False):
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--" + name, dest=dest, action=_OverrideConstAction, const=True,
                       help=argparse.SUPPRESS if hide_positive else help)
    group.add_argument("--no-" + name, dest=dest, action=_OverrideConstAction, const=False,
                       help=argparse.SUPPRESS if hide_negative else "disable: " + help)


def _make_parser():
    """The ``horovodrun`` argument parser (all flags of the spec, upstream's dests)."""
    parser = argparse.ArgumentParser(description="Horovod Runner")
    parser.add_argument("-v", "--version", action=_VersionAction,
                        help="Print the Horovod version and exit.")
    parser.add_argument("-np", "--num-proc", dest="num_proc", type=int,
                        help="Number of worker processes to start.")
    parser.add_argument("-cb", "--check-build", dest="check_build", action="store_true",
                        help="Print which frameworks, controllers and tensor operations this "
                             "Horovod was built with, and exit.")
    parser.add_argument("--disable-cache", action="store_true",
                        help="Do not cache the results of ssh and network interface checks.")
    parser.add_argument("--start-timeout", type=int,
                        help="Seconds allowed for start-up checks (default: "
                             "HOROVOD_START_TIMEOUT or %d)." % DEFAULT_START_TIMEOUT_S)
    parser.add_argument("--network-interfaces", dest="nics", action=_NicsAction,
                        help="Comma-separated network interfaces to use, e.g. eth0,eth1.")
    parser.add_argument("--network-interface", dest="nics", action=_NicsAction,
                        help="A network interface to use (repeatable).")
    parser.add_argument("--output-filename",
                        help="Directory to which each rank's raw stdout and stderr are written "
                             "(<dir>/rank.<r>/stdout and stderr).")
    parser.add_argument("--verbose", action="store_true", help="Print what the launcher does.")
    parser.add_argument("--config-file",
                        help="YAML file with tuning parameters; command-line flags win.")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="Command to run.")

    group = parser.add_argument_group("SSH arguments")
    group.add_argument("-p", "--ssh-port", type=int, help="SSH port of all the hosts.")
    group.add_argument("-i", "--ssh-identity-file", help="SSH identity (private key) file.")

    group = parser.add_argument_group("tuneable parameter arguments")
    group.add_argument("--fusion-threshold-mb", action=_OverrideAction, type=int,
                       help="Fusion buffer size in MiB (HOROVOD_FUSION_THRESHOLD).")
    group.add_argument("--cycle-time-ms", action=_OverrideAction, type=float,
                       help="Background cycle time in milliseconds (HOROVOD_CYCLE_TIME).")
    group.add_argument("--cache-capacity", action=_OverrideAction, type=int,
                       help="Response cache capacity in entries (HOROVOD_CACHE_CAPACITY).")
    _add_bool_pair(group, "hierarchical-allreduce", "hierarchical_allreduce",
                   "hierarchical allreduce")
    _add_bool_pair(group, "hierarchical-allgather", "hierarchical_allgather",
                   "hierarchical allgather")
    _add_bool_pair(group, "torus-allreduce", "torus_allreduce", "torus allreduce")

    group = parser.add_argument_group("autotune arguments")
    _add_bool_pair(group, "autotune", "autotune", "autotuning of the tuneable parameters",
                   hide_negative=True)
    group.add_argument("--autotune-log-file", action=_OverrideAction,
                       help="CSV file of the autotuner's samples.")
    group.add_argument("--autotune-warmup-samples", action=_OverrideAction, type=int,
                       help="Samples discarded at the start of autotuning.")
    group.add_argument("--autotune-steps-per-sample", action=_OverrideAction, type=int,
                       help="Steps per autotuning sample.")
    group.add_argument("--autotune-bayes-opt-max-samples", action=_OverrideAction, type=int,
                       help="Maximum samples of the Bayesian optimisation.")
    group.add_argument("--autotune-gaussian-process-noise", action=_OverrideAction, type=float,
                       help="Noise of the Gaussian process, in [0, 1].")

    group = parser.add_argument_group("elastic arguments")
    group.add_argument("--min-np", "--min-num-proc", dest="min_num_proc", type=int,
                       help="Minimum number of processes (turns on elastic mode).")
    group.add_argument("--max-np", "--max-num-proc", dest="max_num_proc", type=int,
                       help="Maximum number of processes in elastic mode.")
    group.add_argument("--slots-per-host", dest="slots", type=int,
                       help="Slots of a discovered host given without :<slots>.")
    group.add_argument("--elastic-timeout", type=int,
                       help="Seconds to wait for the minimum number of slots (default: "
                            "HOROVOD_ELASTIC_TIMEOUT or %d)." % DEFAULT_ELASTIC_TIMEOUT_S)
    group.add_argument("--reset-limit", type=int, help="Maximum number of elastic resets.")
    group.add_argument("--blacklist-cooldown-range", dest="cooldown_range", type=int, nargs=2,
                       help="Lower and upper bound (seconds) of a blacklisted host's cooldown.")

    group = parser.add_argument_group("timeline arguments")
    group.add_argument("--timeline-filename", action=_OverrideAction,
                       help="Write a timeline of the job to this file (HOROVOD_TIMELINE).")
    _add_bool_pair(group, "timeline-mark-cycles", "timeline_mark_cycles",
                   "marking cycles in the timeline", hide_negative=True)

    group = parser.add_argument_group("stall check arguments")
    stall_check = group.add_mutually_exclusive_group()
    stall_check.add_argument("--no-stall-check", dest="no_stall_check",
                             action=_OverrideConstAction, const=True,
                             help="Disable the stall check.")
    stall_check.add_argument("--stall-check", dest="no_stall_check", action=_OverrideConstAction,
                             const=False, help=argparse.SUPPRESS)
    group.add_argument("--stall-check-warning-time-seconds", action=_OverrideAction, type=int,
                       help="Seconds before a stalled tensor is reported.")
    group.add_argument("--stall-check-shutdown-time-seconds", action=_OverrideAction, type=int,
                       help="Seconds before a stall shuts the job down.")
    group.add_argument("--deadlock-timeout-seconds", action=_OverrideAction, type=float,
                       help="Seconds every rank may wait on operations that cannot complete before they "
                            "fail with a deadlock error (HOROVOD_DEADLOCK_TIMEOUT_SECONDS; 0 never).")

    group = parser.add_argument_group("library arguments")
    _add_bool_pair(group, "mpi-threads-disable", "mpi_threads_disable",
                   "disabling MPI threading", hide_negative=True)
    group.add_argument("--mpi-args", help="Extra arguments for mpirun (use --mpi-args=\"...\").")
    group.add_argument("--tcp", dest="tcp_flag", action="store_true",
                       help="Use TCP only (NCCL_IB_DISABLE=1).")
    group.add_argument("--binding-args", help="Process binding arguments for mpirun.")
    group.add_argument("--num-nccl-streams", action=_OverrideAction, type=int,
                       help="NCCL streams per device (HOROVOD_NUM_NCCL_STREAMS).")
    group.add_argument("--thread-affinity", action=_OverrideAction, type=int,
                       help="CPU core of the background thread, for hosts with one rank "
                            "(HOROVOD_THREAD_AFFINITY; with several ranks per host, set that variable "
                            "to a comma-separated list with one core per local rank).")
    group.add_argument("--gloo-timeout-seconds", action=_OverrideAction, type=int,
                       help="Gloo rendezvous and operation timeout in seconds.")

    group = parser.add_argument_group("logging arguments")
    group.add_argument("--log-level", action=_OverrideAction, choices=config_parser.LOG_LEVELS,
                       help="Horovod log level (HOROVOD_LOG_LEVEL).")
    timestamps = group.add_mutually_exclusive_group()
    timestamps.add_argument("--log-with-timestamp", dest="log_with_timestamp",
                            action=_OverrideConstAction, const=True, help=argparse.SUPPRESS)
    timestamps.add_argument("--log-without-timestamp", dest="log_with_timestamp",
                            action=_OverrideConstAction, const=False,
                            help="Hide the timestamp in Horovod's log lines.")
    timestamps.add_argument("-prefix-timestamp", "--prefix-output-with-timestamp",
                            dest="prefix_output_with_timestamp", action="store_true",
                            help="Prefix every forwarded output line with the local time.")
    timestamps.add_argument("--log-hide-timestamp", dest="log_with_timestamp",
                            action=_DeprecatedLogHideAction, const=False,
                            help=argparse.SUPPRESS)
    timestamps.add_argument("--no-log-hide-timestamp", dest="log_with_timestamp",
                            action=_DeprecatedLogHideAction, const=True,
                            help=argparse.SUPPRESS)

    group = parser.add_argument_group("host arguments")
    host_options = group.add_mutually_exclusive_group()
    host_options.add_argument("-H", "--hosts", help="Hosts and slots, e.g. host1:2,host2:4.")
    host_options.add_argument("-hostfile", "--hostfile",
                              help="File of '<host> slots=<n>' lines.")
    host_options.add_argument("--host-discovery-script", action=_OverrideAction,
                              help="Executable printing the available hosts (elastic mode).")

    group = parser.add_argument_group("controller arguments")
    controllers = group.add_mutually_exclusive_group()
    controllers.add_argument("--gloo", dest="use_gloo", action="store_true",
                             help="Use the launcher-rendezvous (Gloo) controller.")
    controllers.add_argument("--mpi", dest="use_mpi", action="store_true",
                             help="Use mpirun.")
    controllers.add_argument("--jsrun", dest="use_jsrun", action="store_true",
                             help="Use jsrun (LSF).")
    return parser


def parse_args(argv=None):
    """Parse ``horovodrun`` arguments (``sys.argv[1:]`` when ``argv`` is None).

    Applies ``--config-file`` (explicit flags win), validates, sets ``run_func`` and
    ``executable`` to None and handles ``--check-build`` (prints and exits 0). Exits with
    status 2 and a usage message for bad arguments.
    """
    parser = _make_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "override_args"):
        args.override_args = set()

    if args.config_file:
        try:
            with open(args.config_file) as f:
                config = yaml.load(f, Loader=yaml.FullLoader) or {}
            config_parser.set_args_from_config(args, config, args.override_args)
        except (OSError, yaml.YAMLError, ValueError) as e:
            parser.error("cannot use config file %s: %s" % (args.config_file, e))
    try:
        config_parser.validate_config_args(args)
    except ValueError as e:
        parser.error(str(e))

    args.run_func = None
    args.executable = None

    if args.check_build:
        check_build(args.verbose)
    if args.num_proc is None and not lsf.LSFUtils.using_lsf() and not slurm.in_allocation():
        parser.error("argument -np/--num-proc is required")
    if args.num_proc is not None and args.num_proc < 1:
        parser.error("argument -np/--num-proc must be at least 1, got %d" % args.num_proc)
    if not args.command:
        parser.error("no command to run was given")
    return args


def check_build(verbose):
    """Print the build summary of the installed Horovod and exit with status 0.

    Exits with status 1 and a message when the core (``horovod.common.util`` and the compiled
    engine it asks) cannot be imported.
    """
    def mark(available):
        return "X" if available else " "

    frameworks = [("TensorFlow", "tensorflow"), ("PyTorch", "torch"), ("MXNet", "mxnet")]
    try:
        from horovod.common import util
        lines = ["Horovod v%s:" % _horovod_version(), "", "Available Frameworks:"]
        lines += ["    [%s] %s" % (mark(util.extension_available(ext, verbose=verbose)), name)
                  for name, ext in frameworks]
        lines += ["", "Available Controllers:",
                  "    [%s] MPI" % mark(util.mpi_built(verbose=verbose)),
                  "    [%s] Gloo" % mark(util.gloo_built(verbose=verbose)),
                  "", "Available Tensor Operations:",
                  "    [%s] NCCL" % mark(util.nccl_built(verbose=verbose)),
                  "    [%s] DDL" % mark(util.ddl_built(verbose=verbose)),
                  "    [%s] CCL" % mark(util.ccl_built(verbose=verbose)),
                  "    [%s] MPI" % mark(util.mpi_built(verbose=verbose)),
                  "    [%s] Gloo" % mark(util.gloo_built(verbose=verbose))]
    except ImportError as e:
        sys.exit("horovodrun --check-build needs a built horovod-core, which cannot be imported: "
                 "%s" % e)
    if verbose:
        print("")
    print("\n".join(lines))
    sys.exit(0)


@cache.use_cache()
def _check_all_hosts_ssh_successful(host_addresses, ssh_port=None, ssh_identity_file=None):
    """True if ``ssh <host> true`` succeeds for every host, else None (never cached).

    Hosts are tried in parallel, each up to ``SSH_ATTEMPTS`` times with ssh's connection
    timeout ``SSH_CONNECT_TIMEOUT_S`` seconds (a refused key is not retried). For each host that
    fails, a line naming it and ssh's output is printed.
    """
    def check(address):
        output = ""
        for attempt in range(SSH_ATTEMPTS):
            argv = remote.ssh_argv(address, ssh_port, ssh_identity_file,
                                   SSH_CONNECT_TIMEOUT_S) + ["true"]
            try:
                result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                                        text=True, timeout=3 * SSH_CONNECT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                output = "ssh did not finish within %d seconds" % (3 * SSH_CONNECT_TIMEOUT_S)
                continue
            except OSError as e:
                return False, "cannot run ssh: %s" % e
            if result.returncode == 0:
                return True, ""
            output = (result.stdout + result.stderr).strip()
            if "Permission denied" in output:
                break
            time.sleep(min(1.0 + attempt, 3.0))
        return False, output

    results = threads.execute_function_multithreaded(
        check, [(address,) for address in host_addresses])
    _last_ssh_failures[:] = []
    for index, address in enumerate(host_addresses):
        ok, output = results[index]
        if not ok:
            _last_ssh_failures.append(address)
            print("ssh not successful for host %s:\n%s" % (address, output), flush=True)
    return None if _last_ssh_failures else True


# The hosts the last ssh check could not reach (named in the launcher's error).
_last_ssh_failures = []


def _is_elastic(args):
    return args.host_discovery_script is not None or args.min_num_proc is not None


def _run(args):
    """Run the job described by ``args`` (a parsed Namespace or ``_HorovodArgs``).

    Returns None in command mode, and the list of the function's results by rank when
    ``args.run_func`` is set. Raises ``RuntimeError`` when the job fails and ``ValueError``
    for an unusable setup.
    """
    # An empty collection of interfaces restricts nothing, as None does.
    args.nics = set(args.nics) if getattr(args, "nics", None) else None
    in_lsf_job = lsf.LSFUtils.using_lsf()
    in_slurm_job = not in_lsf_job and slurm.in_allocation()
    args.slurm_allocation = None
    if not args.hosts and not args.host_discovery_script:
        if args.hostfile:
            args.hosts = _hosts_of_hostfile(args.hostfile, args.hostfile)
        elif in_lsf_job:
            args.hosts = lsf.LSFUtils.get_hosts_argument()
        elif in_slurm_job:
            args.slurm_allocation = _slurm_hosts(args)
        elif os.environ.get(OPERATOR_HOSTFILE_VAR):
            # Open MPI's default hostfile, as the Kubeflow MPI Operator sets it in its launchers.
            hostfile = os.environ[OPERATOR_HOSTFILE_VAR]
            args.hosts = _hosts_of_hostfile(hostfile, "%s (named by %s)" % (hostfile, OPERATOR_HOSTFILE_VAR))
            if args.verbose:
                print("Hosts from the hostfile %s, named by %s: %s" % (hostfile, OPERATOR_HOSTFILE_VAR, args.hosts),
                      flush=True)
        else:
            args.hosts = "localhost:%d" % args.num_proc
    if args.num_proc is None and (in_lsf_job or in_slurm_job) and args.hosts:
        args.num_proc = sum(hosts.parse_hosts_and_slots(args.hosts)[1].values())
    if _is_elastic(args):
        return _run_elastic(args)
    return _run_static(args)


# Open MPI's default hostfile; the Kubeflow MPI Operator points it at /etc/mpi/hostfile.
OPERATOR_HOSTFILE_VAR = "OMPI_MCA_orte_default_hostfile"


def _hosts_of_hostfile(path, described):
    """``"host:n,..."`` of hostfile ``path``; ``described`` names it in messages.

    Raises:
        ValueError: the file cannot be read or parsed, or one of its host names does not
            resolve from this host (the names are used as written, never shortened: between
            Kubernetes pods only the full ``<pod>.<service>.<namespace>.svc`` names resolve).
    """
    try:
        host_list = hosts.parse_host_files(path)
    except OSError as e:
        raise ValueError("cannot read the hostfile %s: %s" % (described, e)) from None
    except ValueError as e:
        raise ValueError("the hostfile %s: %s" % (described, e)) from None
    if not host_list:
        raise ValueError("the hostfile %s lists no host" % described)
    names, _ = hosts.parse_hosts_and_slots(host_list)
    unresolved = [name for name in names if network.resolve_host_address(name) is None]
    if unresolved:
        raise ValueError("host name%s %s of the hostfile %s do%s not resolve from this host; check "
                         "the names (they are used as written), or that the workers they name are "
                         "running" % ("s" if len(unresolved) > 1 else "", ", ".join(unresolved), described,
                                      "" if len(unresolved) > 1 else "es"))
    return host_list


def _slurm_hosts(args):
    """Sets ``args.hosts`` to the Slurm allocation's nodes and slots; returns the
    :class:`~horovod.runner.util.slurm.Allocation`. Raises ``ValueError`` when ``-np`` asks for
    more slots than were allocated."""
    allocation = slurm.allocation()
    if args.verbose:
        print("Hosts from the Slurm allocation: %s" % allocation.describe(), flush=True)
    if args.num_proc is not None and args.num_proc > allocation.total_slots:
        raise ValueError("-np %d is more than the allocation holds: %s; ask salloc/sbatch for more "
                         "tasks (--ntasks, --ntasks-per-node), lower -np, or give the hosts with -H"
                         % (args.num_proc, allocation.describe()))
    args.hosts = allocation.hosts_argument()
    return allocation


def _run_elastic(args):
    """Run an elastic job: hosts from ``--host-discovery-script`` (or ``-H``, which must name
    at least 2 hosts), workers restarted and re-ranked as hosts come and go (runner.md §5.5)."""
    from horovod.runner.elastic import discovery as elastic_discovery
    from horovod.runner.elastic.settings import ElasticSettings

    if args.use_mpi or args.use_jsrun:
        raise ValueError("elastic mode (--min-np, --max-np, --host-discovery-script) needs the "
                         "Gloo controller; drop --mpi/--jsrun")
    if not gloo_built(verbose=bool(args.verbose)):
        raise ValueError(GLOO_NOT_BUILT)
    if args.host_discovery_script:
        discovery = elastic_discovery.HostDiscoveryScript(args.host_discovery_script, args.slots)
    elif args.slurm_allocation is not None:
        # The allocation's nodes that are still up, each started by srun steps of its own.
        discovery = slurm.AllocationDiscovery(args.slurm_allocation)
    elif args.hosts:
        _, available_host_slots = hosts.parse_hosts_and_slots(args.hosts)
        if len(available_host_slots) < 2:
            raise ValueError("Cannot run in fault tolerance mode with fewer than 2 hosts: -H "
                             "gives %s; list more hosts, or give --host-discovery-script"
                             % args.hosts)
        discovery = elastic_discovery.FixedHosts(available_host_slots)
    else:
        raise ValueError("elastic mode needs --host-discovery-script or -H/--hosts")
    min_num_proc = args.min_num_proc if args.min_num_proc is not None else args.num_proc
    max_num_proc = args.max_num_proc
    if min_num_proc > args.num_proc or (max_num_proc is not None and max_num_proc < args.num_proc):
        raise ValueError("elastic mode needs --min-np (%s) <= -np (%d) <= --max-np (%s)"
                         % (min_num_proc, args.num_proc, max_num_proc))
    if args.cooldown_range is not None:
        lo, hi = args.cooldown_range
        if not 1 <= lo <= hi <= 3600:
            raise ValueError("--blacklist-cooldown-range needs 1 <= lower <= upper <= 3600 "
                             "seconds, got %s" % list(args.cooldown_range))
    start_timeout = args.start_timeout
    if start_timeout is None:
        start_timeout = int(os.environ.get(env_names.START_TIMEOUT, DEFAULT_START_TIMEOUT_S))
    elastic_timeout = args.elastic_timeout
    if elastic_timeout is None:
        elastic_timeout = int(os.environ.get(env_names.ELASTIC_TIMEOUT,
                                             DEFAULT_ELASTIC_TIMEOUT_S))
    settings = ElasticSettings(
        discovery=discovery, min_num_proc=min_num_proc, max_num_proc=max_num_proc,
        elastic_timeout=elastic_timeout, reset_limit=args.reset_limit,
        cooldown_range=args.cooldown_range, num_proc=args.num_proc,
        verbose=2 if args.verbose else 0, ssh_port=args.ssh_port,
        ssh_identity_file=args.ssh_identity_file, key=secret.make_secret_key(),
        start_timeout=timeout.Timeout(start_timeout, message=START_TIMEOUT_MESSAGE),
        output_filename=args.output_filename, run_func_mode=args.run_func is not None,
        nics=args.nics, prefix_output_with_timestamp=args.prefix_output_with_timestamp)
    env = os.environ.copy()
    config_parser.set_env_from_args(env, args)
    if args.slurm_allocation is not None:
        remote_nodes = network.filter_local_addresses(args.slurm_allocation.nodes)
        slurm_steps = srun_launcher.ElasticSteps(
            _address_towards(args.nics, remote_nodes, resolve=slurm.node_address))
    else:
        slurm_steps = None
    if args.run_func is None:
        gloo_launcher.gloo_run_elastic(settings, env, args.command, slurm_steps=slurm_steps)
        return None
    kv_store = KVStoreServer(secret=settings.key)
    port = kv_store.start_server()
    try:
        put_data_into_kvstore("127.0.0.1", port, "runfunc", "func", args.run_func)
        # Workers reach the store at the launcher's address on the job's interface, which only
        # the launch knows: run_task reads it from HOROVOD_GLOO_RENDEZVOUS_ADDR when "-" is given.
        command = [args.executable or sys.executable, "-m", "horovod.runner.run_task", "-",
                   str(port)]
        gloo_launcher.gloo_run_elastic(settings, env, command, slurm_steps=slurm_steps)
        return [read_data_from_kvstore("127.0.0.1", port, "runfunc_result", str(rank))
                for rank in range(min_num_proc)]
    finally:
        kv_store.shutdown_server()


def _run_static(args):
    """Check the hosts and interfaces, then launch the job (see :func:`_run`)."""
    start_timeout = args.start_timeout
    if start_timeout is None:
        start_timeout = int(os.environ.get(env_names.START_TIMEOUT, DEFAULT_START_TIMEOUT_S))
    settings = hvd_settings.Settings(
        verbose=2 if args.verbose else 0,
        ssh_port=args.ssh_port,
        ssh_identity_file=args.ssh_identity_file,
        extra_mpi_args=args.mpi_args,
        tcp_flag=args.tcp_flag,
        binding_args=args.binding_args,
        key=secret.make_secret_key(),
        start_timeout=timeout.Timeout(start_timeout, message=START_TIMEOUT_MESSAGE),
        num_proc=args.num_proc,
        hosts=args.hosts,
        output_filename=args.output_filename,
        run_func_mode=args.run_func is not None,
        nics=args.nics,
        prefix_output_with_timestamp=args.prefix_output_with_timestamp)

    all_host_names, _ = hosts.parse_hosts_and_slots(args.hosts)
    if settings.verbose >= 2:
        print("Filtering local host names.", flush=True)
    remote_host_names = network.filter_local_addresses(all_host_names)
    if settings.verbose >= 2:
        print("Remote host found: " + " ".join(remote_host_names), flush=True)

    fn_cache = None
    if not args.disable_cache:
        params = "".join(str(p) for p in (settings.num_proc, settings.hosts, settings.ssh_port,
                                          settings.ssh_identity_file,
                                          sorted(settings.nics or [])))
        fn_cache = cache.Cache(CACHE_FOLDER, CACHE_STALENESS_THRESHOLD_MINUTES,
                               hashlib.md5(params.encode(), usedforsecurity=False).hexdigest())
    # jsrun starts the ranks without ssh; MPI launchers inside an LSF job choose their network
    # themselves, so the interface probe is skipped there, as upstream does.
    mpi_in_lsf_job = lsf.LSFUtils.using_lsf() and not is_gloo_used(args.use_gloo, args.use_mpi,
                                                                   args.use_jsrun)
    # srun (or mpirun, which uses srun inside an allocation) starts the ranks there: no ssh.
    slurm_allocation = getattr(args, "slurm_allocation", None)
    if remote_host_names and not _started_by_jsrun(args) and slurm_allocation is None:
        if settings.verbose >= 2:
            print("Checking ssh on all remote hosts.", flush=True)
        if not _check_all_hosts_ssh_successful(remote_host_names, args.ssh_port,
                                               args.ssh_identity_file, fn_cache=fn_cache):
            failed = _last_ssh_failures or remote_host_names
            raise RuntimeError("could not connect to some hosts via ssh: could not connect to %s "
                               "via ssh (see above); check that 'ssh %s%s true' works without a "
                               "password from this host"
                               % (", ".join(failed), "-p %s " % args.ssh_port if args.ssh_port
                                  else "", failed[0]))
        if settings.verbose >= 2:
            print("SSH was successful into all the remote hosts.", flush=True)

    if slurm_allocation is not None:
        nics = args.nics
        driver_ip = _address_towards(nics, remote_host_names, resolve=slurm.node_address)
        if settings.verbose >= 2:
            print("This host's address towards the allocated nodes: %s" % driver_ip, flush=True)
    elif mpi_in_lsf_job:
        nics = args.nics
        # Only function mode needs this host's address: its workers fetch the function from it.
        driver_ip = (_address_towards(nics, remote_host_names) if args.run_func is not None
                     else None)
    else:
        nics, driver_ip = _common_interfaces_and_driver_ip(settings, all_host_names,
                                                           remote_host_names, fn_cache)
    if args.run_func is None:
        _launch_job(args, settings, nics, driver_ip, args.command)
        return None
    return _run_function(args, settings, nics, driver_ip)


def _common_interfaces_and_driver_ip(settings, all_host_names, remote_host_names, fn_cache):
    nics = driver_service.get_common_interfaces(settings, all_host_names, remote_host_names,
                                                fn_cache)
    try:
        driver_ip = network.get_driver_ip(nics)
    except RuntimeError:
        if fn_cache is None or not remote_host_names:
            raise
        # The cached interfaces no longer fit this host (its network changed): probe again.
        nics = driver_service.get_common_interfaces(settings, all_host_names,
                                                    remote_host_names, None)
        driver_ip = network.get_driver_ip(nics)
    return nics, driver_ip


def _run_function(args, settings, nics, driver_ip):
    """Ship ``args.run_func`` to the workers through a KV store; return results by rank."""
    kv_store = KVStoreServer(secret=settings.key)
    port = kv_store.start_server()
    try:
        put_data_into_kvstore(driver_ip, port, "runfunc", "func", args.run_func)
        command = [args.executable or sys.executable, "-m", "horovod.runner.run_task",
                   driver_ip, str(port)]
        _launch_job(args, settings, nics, driver_ip, command)
        return [read_data_from_kvstore(driver_ip, port, "runfunc_result", str(rank))
                for rank in range(args.num_proc)]
    finally:
        kv_store.shutdown_server()


def _launch_job(args, settings, nics, driver_ip, command):
    env = os.environ.copy()
    config_parser.set_env_from_args(env, args)
    all_host_names, _ = hosts.parse_hosts_and_slots(settings.hosts)
    slurm_allocation = getattr(args, "slurm_allocation", None)
    if slurm_allocation is not None:
        # Inside a Slurm allocation the Gloo ranks start as one srun step instead of over ssh.
        def gloo_run():
            srun_launcher.srun_run(settings, nics, env, driver_ip, command, slurm_allocation)
        # Ranks on the nodes write their flight recorder files there (no ssh to gather them).
        gathered_from = []
    else:
        def gloo_run():
            gloo_launcher.gloo_run(settings, nics, env, driver_ip, command)
        gathered_from = network.filter_local_addresses(all_host_names)
    # When the job fails, the ranks' flight recorder files are gathered and a diagnosis printed.
    with flight_recorder.recorded_job(env, settings, gathered_from):
        run_controller(args.use_gloo, gloo_run, args.use_mpi,
                       lambda: mpi_launcher.mpi_run(settings, nics, _mpi_worker_env(env, settings),
                                                    command),
                       args.use_jsrun,
                       lambda: js_launcher.js_run(settings, nics, _mpi_worker_env(env, settings),
                                                  command),
                       settings.verbose)


def _mpi_worker_env(env, settings):
    """``env`` for workers started by mpirun: the MPI controller and MPI CPU operations.

    Both replace inherited values: an mpirun job has no rendezvous server, which the Gloo
    controller and Gloo CPU operations need. In function mode the job secret of the KV store is
    added; mpirun never names it on its command line.

    Under Open MPI, PYTHONUNBUFFERED is dropped: mpirun --tag-output tags every write, and
    unbuffered Python writes a print's text and its newline separately, so each line would
    arrive in two tagged pieces. Nothing is lost, since Open MPI gives local ranks a terminal
    as stdout, which Python line-buffers.
    """
    env = dict(env)
    env[env_names.CONTROLLER] = "mpi"
    env[env_names.CPU_OPERATIONS] = "mpi"
    if "PYTHONUNBUFFERED" in env and mpi_launcher.is_open_mpi(env):
        del env["PYTHONUNBUFFERED"]
    if settings.run_func_mode and settings.key is not None:
        env[secret.HOROVOD_SECRET_KEY] = settings.key.hex()
    else:
        env.pop(secret.HOROVOD_SECRET_KEY, None)
    return env


def _started_by_jsrun(args):
    """True when :func:`run_controller` will hand the job to jsrun."""
    return _controller(args.use_gloo, args.use_mpi, args.use_jsrun) == "jsrun"


def _address_towards(nics, remote_host_names, resolve=network.resolve_host_address):
    """This host's IPv4 address for the workers to reach (function mode without the probe): the
    first address on ``nics`` when given, else the source address of the route to the first
    remote host (its address from ``resolve(name)``), else loopback when every host is this one."""
    if nics:
        return network.get_driver_ip(sorted(nics))
    if not remote_host_names:
        return network.LOOPBACK_ADDRESS
    target = resolve(remote_host_names[0])
    if target is None:
        raise RuntimeError("cannot resolve host %s; give this host's interface with "
                           "--network-interfaces" % remote_host_names[0])
    return network.source_address_towards(target)


GLOO_NOT_BUILT = ("Gloo support has not been built.  If this is not expected, ensure CMake is "
                  "installed and reinstall Horovod with HOROVOD_WITH_GLOO=1 to debug the build "
                  "error.")
MPI_NOT_BUILT = ("MPI support has not been built.  If this is not expected, ensure MPI is "
                 "installed (Debian: openmpi-bin and libopenmpi-dev) and reinstall horovod-core "
                 "with HOROVOD_WITH_MPI=1 to debug the build error; or launch with --gloo, which "
                 "needs no MPI.")
NO_LSF_JOB = ("Horovod did not detect an LSF job.  The jsrun launcher can only be used in that "
              "environment. Please, pick a different launcher for other environments.")
NOTHING_BUILT = ("Neither MPI nor Gloo support has been built. Try reinstalling Horovod ensuring "
                 "that either MPI is installed (MPI) or CMake is installed (Gloo).")


def is_gloo_used(use_gloo=None, use_mpi=None, use_jsrun=None):
    """True when :func:`run_controller` would pick the Gloo launcher for these flags."""
    return bool(use_gloo or (not use_mpi and not use_jsrun and not mpi_built()))


def _controller(use_gloo, use_mpi, use_jsrun, verbose=False):
    """``"gloo"``, ``"mpi"`` or ``"jsrun"``: the launcher the flags and the build choose. An
    explicit flag needs its support built; without a flag MPI is preferred when built (jsrun
    inside an LSF job with jsrun on PATH), else Gloo. Raises ``ValueError`` naming what is
    missing."""
    if use_gloo:
        if not gloo_built(verbose=verbose):
            raise ValueError(GLOO_NOT_BUILT)
        return "gloo"
    if use_mpi or use_jsrun:
        if not mpi_built(verbose=verbose):
            raise ValueError(MPI_NOT_BUILT)
        if use_jsrun and not lsf.LSFUtils.using_lsf():
            raise ValueError(NO_LSF_JOB)
        return "jsrun" if use_jsrun else "mpi"
    if mpi_built(verbose=verbose):
        return "jsrun" if lsf.LSFUtils.using_lsf() and is_jsrun_installed() else "mpi"
    if gloo_built(verbose=verbose):
        return "gloo"
    raise ValueError(NOTHING_BUILT)


def run_controller(use_gloo, gloo_run, use_mpi, mpi_run, use_jsrun, js_run, verbosity):
    """Call ``gloo_run``, ``mpi_run`` or ``js_run`` (no arguments), the one :func:`_controller`
    chooses for the flags and the build. Raises ``ValueError`` naming what is missing."""
    verbose = verbosity is not None and verbosity >= 2
    launchers = {"gloo": gloo_run, "mpi": mpi_run, "jsrun": js_run}
    launchers[_controller(use_gloo, use_mpi, use_jsrun, verbose)]()


def run_commandline():
    """Entry point of the ``horovodrun`` console script.

    Exits 0 when every worker exited 0, 1 with a message on stderr when the job failed or
    could not be started, and 130 when interrupted before the workers were started.
    """
    args = parse_args()
    if args.log_level:
        logging.addLevelName(logging.NOTSET, "TRACE")
        logging.basicConfig(level=logging.getLevelName(args.log_level))
    try:
        _run(args)
    except (RuntimeError, ValueError, OSError, timeout.TimeoutException) as e:
        print("horovodrun: error: %s" % e, file=sys.stderr, flush=True)
        sys.exit(1)
    except KeyboardInterrupt:
        print("horovodrun: interrupted", file=sys.stderr, flush=True)
        sys.exit(130)


if __name__ == "__main__":
    run_commandline()
