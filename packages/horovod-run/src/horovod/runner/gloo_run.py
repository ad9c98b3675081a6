"""Static launch with the launcher-rendezvous ("Gloo") controller, on this host and over ssh.

The driver starts a :class:`RendezvousServer`, assigns ranks to slots, and runs one worker per
rank: directly on this host, and through one ssh session per slot on a remote host (see
:mod:`horovod.runner.common.util.remote_exec`). A worker learns its place and the server from
``HOROVOD_*`` variables and the job secret from ``_HOROVOD_SECRET_KEY``, all set in its own
environment (never on any command line: a remote worker's environment travels over the ssh
session's standard input). When a worker fails, every other worker is stopped on every host and
the job fails naming the first rank that did, its host and its exit status.
"""

import os
import shlex
import signal
import sys
import threading
import time

from horovod.common.rendezvous import RendezvousClient
from horovod.runner.common.util import env as env_util
from horovod.runner.common.util import hosts, remote_exec, safe_shell_exec, secret
from horovod.runner.http.http_server import RendezvousServer
from horovod.runner.util import network, remote
from horovod.runner.util.exit_codes import describe_exit_code
from horovod.runner.common.util import env_names

JOB_FAILED_MESSAGE = (
    "Horovod detected that one or more processes exited with non-zero status, so the job was "
    "terminated. The first process to fail was:\nProcess name: {rank}\nExit code: {code}\n"
    "Host: {host}\n")
_START_POLL_S = 0.5


def create_slot_env_vars(slot_info):
    """The ``HOROVOD_*`` variables that place one worker (a dict of str)."""
    return {
        env_names.HOSTNAME: str(slot_info.hostname),
        env_names.RANK: str(slot_info.rank),
        env_names.SIZE: str(slot_info.size),
        env_names.LOCAL_RANK: str(slot_info.local_rank),
        env_names.LOCAL_SIZE: str(slot_info.local_size),
        env_names.CROSS_RANK: str(slot_info.cross_rank),
        env_names.CROSS_SIZE: str(slot_info.cross_size),
    }


def create_worker_env(env, slot_info, run_vars, **extra):
    """The environment of the worker in ``slot_info`` (a ``SlotInfo``): ``env`` (a dict), the
    slot's topology (:func:`create_slot_env_vars`), ``run_vars`` (the rendezvous and the
    interfaces: :func:`create_run_env_vars`), unbuffered Python output and ``extra``. Used by
    horovodrun, horovod.spark and horovod.ray's elastic executor."""
    worker_env = dict(env)
    worker_env.update(create_slot_env_vars(slot_info))
    worker_env.update(run_vars)
    worker_env["PYTHONUNBUFFERED"] = "1"
    worker_env.update(extra)
    return worker_env


def create_run_env_vars(server_ip, nics, port, elastic=False):
    """The variables shared by every worker of the job: rendezvous address and controller.

    ``nics`` is an ordered sequence of interface names; the first is Gloo's interface.
    """
    nics = list(nics)
    run_vars = {
        env_names.GLOO_RENDEZVOUS_ADDR: server_ip,
        env_names.GLOO_RENDEZVOUS_PORT: str(port),
        env_names.CONTROLLER: "gloo",
        env_names.CPU_OPERATIONS: "gloo",
        env_names.GLOO_IFACE: nics[0],
        env_names.NCCL_SOCKET_IFNAME: ",".join(nics),
    }
    if elastic:
        run_vars[env_names.ELASTIC] = "1"
    return run_vars


def _pad_rank(rank, size):
    """``rank`` zero-padded to the width of ``size - 1``."""
    return str(rank).zfill(len(str(size - 1)))


def _mkdir_p(path):
    os.makedirs(path, exist_ok=True)


def _say(message, stream=None):
    """Print a launcher message; a closed stdout/stderr must not stop the failure handling."""
    try:
        print(message, file=stream or sys.stdout, flush=True)
    except (OSError, ValueError):
        pass


def _command_line(command):
    return command if isinstance(command, str) else " ".join(shlex.quote(a) for a in command)


def register_shutdown_event():
    """Return an event set by SIGINT or SIGTERM, and a function restoring the old handlers.

    Outside the main thread signals cannot be caught; the event is then only set by the caller.
    """
    event = threading.Event()

    def handler(signum, frame):
        event.set()

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, handler)

    def restore():
        for signum, old in previous.items():
            signal.signal(signum, old)

    return event, restore


class _Job:
    """The workers of one static job and the first-failure bookkeeping between their threads."""

    def __init__(self, settings, env, run_vars, command, job_secret, remote_hosts=(),
                 report_start=None):
        self.settings = settings
        self.remote_hosts = set(remote_hosts)
        self.report_start = report_start
        self.job_secret = job_secret
        self.env = env
        self.run_vars = run_vars
        # One argument is taken as a shell command line ("cmd1 && cmd2"), as upstream does.
        if not isinstance(command, str) and len(command) == 1:
            command = command[0]
        self.command = command
        self.shutdown_event, self._restore_signals = register_shutdown_event()
        self.terminate_all_event = threading.Event()
        self._lock = threading.Lock()
        self.results = []  # (finish time, rank, exit code)
        self.start_failure = None  # message when remote workers did not start in time
        # step_launch(slot_info, command, env) -> (command, env, check): how a worker that is
        # not started over ssh runs (a Slurm step of its own: srun_run.ElasticSteps.wrap), and
        # check(exit code) -> the worker's exit code; None: as a child of this process.
        self.step_launch = None

    def worker_env(self, slot_info):
        return create_worker_env(self.env, slot_info, self.run_vars,
                                 **{secret.HOROVOD_SECRET_KEY: self.job_secret.hex()})

    def remote_launch(self, slot_info):
        """``(ssh argv, stdin line)`` that start ``slot_info``'s worker on its remote host.

        The worker's environment is the exportable part of the launcher's (``env.is_exportable``)
        plus the slot's variables and the job secret, sent over the session's standard input.
        """
        worker_env = {k: v for k, v in self.worker_env(slot_info).items()
                      if env_util.is_exportable(k)}
        worker_env[secret.HOROVOD_SECRET_KEY] = self.job_secret.hex()
        line = remote_exec.encode_request(self.command, worker_env, os.getcwd(), slot_info.rank,
                                          self.report_start)
        bootstrap = "exec %s -m horovod.runner.common.util.remote_exec" % shlex.quote(
            sys.executable)
        argv = remote.ssh_argv(slot_info.hostname, self.settings.ssh_port,
                               self.settings.ssh_identity_file) + [bootstrap]
        return argv, line

    def execute_slot(self, slot_info, events, index=None):
        """Run ``slot_info``'s worker (over ssh on a remote host) until it exits or one of
        ``events`` is set; return its exit code. ``index`` labels its output lines (default:
        its rank; a callable is asked for the label of each line)."""
        rank = slot_info.rank
        is_remote = slot_info.hostname in self.remote_hosts
        if self.settings.verbose:
            shown = dict(create_slot_env_vars(slot_info), **self.run_vars)
            _say("Launching rank %d%s: env %s %s"
                 % (rank, " on %s over ssh" % slot_info.hostname if is_remote else "",
                    " ".join("%s=%s" % (k, shlex.quote(v)) for k, v in shown.items()),
                    _command_line(self.command)))
        raw = (None, None)
        check = None
        try:
            raw = self._open_output_files(rank)
            if is_remote:
                command, stdin_line = self.remote_launch(slot_info)
                env = dict(os.environ)
            else:
                command, stdin_line, env = self.command, None, self.worker_env(slot_info)
                if self.step_launch is not None:
                    command, env, check = self.step_launch(slot_info, command, env)
            code = safe_shell_exec.execute(
                command, env=env, index=rank if index is None else index, events=events,
                prefix_output_with_timestamp=self.settings.prefix_output_with_timestamp,
                raw_stdout=raw[0], raw_stderr=raw[1], stdin_line=stdin_line)
            if check is not None:
                code = check(code)
        except Exception as e:
            _say("Process %d could not be started: %s" % (rank, e), sys.stderr)
            code = 1
        finally:
            for f in raw:
                if f is not None:
                    f.close()
        return code

    def run_slot(self, slot_info):
        rank = slot_info.rank
        is_remote = slot_info.hostname in self.remote_hosts
        code = self.execute_slot(slot_info, [self.shutdown_event, self.terminate_all_event])
        with self._lock:
            self.results.append((time.time(), rank, code, slot_info.hostname))
            if code == 0:
                return
            _say("Process %d exit with status code %d." % (rank, code))
            if is_remote and code == 255:
                _say("Process %d: ssh to %s failed (ssh exits with 255 when the connection or "
                     "the authentication fails, or the connection is lost)."
                     % (rank, slot_info.hostname), sys.stderr)
            if not self.shutdown_event.is_set() and not self.terminate_all_event.is_set():
                _say("Terminating remaining workers after failure of Process %d." % rank)
                self.terminate_all_event.set()

    def watch_remote_starts(self, slots, port, deadline_s):
        """Stop the job when a remote worker has not reported its start within ``deadline_s``.

        Each remote worker's bootstrap writes ``horovodrun_started/<rank>`` to the rendezvous
        server once it has started the worker.
        """
        pending = {slot.rank: slot.hostname for slot in slots
                   if slot.hostname in self.remote_hosts}
        if not pending:
            return
        client = RendezvousClient("127.0.0.1", port, secret=self.job_secret)
        deadline = time.monotonic() + deadline_s
        while pending and time.monotonic() < deadline:
            if self.shutdown_event.is_set() or self.terminate_all_event.is_set():
                return
            for rank in list(pending):
                try:
                    if client.try_get(remote_exec.STARTED_SCOPE, str(rank)) is not None:
                        del pending[rank]
                except (OSError, RuntimeError):
                    pass
            time.sleep(_START_POLL_S)
        with self._lock:
            finished = {rank for _, rank, _, _ in self.results}
        late = {rank: host for rank, host in pending.items() if rank not in finished}
        if not late or self.shutdown_event.is_set() or self.terminate_all_event.is_set():
            return
        by_host = {}
        for rank, host in sorted(late.items()):
            by_host.setdefault(host, []).append(str(rank))
        self.start_failure = (
            "%s did not start within the start timeout of %d seconds; check that ssh to %s "
            "works, that %s exists there with horovod-run installed, or raise --start-timeout"
            % ("; ".join("rank(s) %s on host %s" % (", ".join(r), h) for h, r in by_host.items()),
               deadline_s, "the host" if len(by_host) == 1 else "these hosts", sys.executable))
        _say("horovodrun: " + self.start_failure, sys.stderr)
        self.terminate_all_event.set()

    def _open_output_files(self, rank):
        directory = self.settings.output_filename
        if not directory:
            return None, None
        rank_dir = os.path.join(directory, "rank.%s" % _pad_rank(rank, self.settings.num_proc))
        _mkdir_p(rank_dir)
        stdout = open(os.path.join(rank_dir, "stdout"), "w", encoding="utf-8")
        try:
            return stdout, open(os.path.join(rank_dir, "stderr"), "w", encoding="utf-8")
        except OSError:
            stdout.close()
            raise

    def run(self, slots, port=None, start_timeout_s=None):
        threads = [threading.Thread(target=self.run_slot, args=(slot,),
                                    name="horovod-worker-%d" % slot.rank, daemon=True)
                   for slot in slots]
        if port is not None and start_timeout_s:
            threading.Thread(target=self.watch_remote_starts,
                             args=(slots, port, start_timeout_s),
                             name="horovod-start-watch", daemon=True).start()
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                # Joined in short steps so that the main thread keeps handling signals.
                while thread.is_alive():
                    thread.join(timeout=0.1)
        finally:
            self._restore_signals()


def gloo_run(settings, nics, env, server_ip, command):
    """Run ``command`` as ``settings.num_proc`` workers on the hosts and wait for all of them.

    Workers on a host that is not this one (:func:`network.filter_local_addresses`) are started
    over ssh (``settings.ssh_port``, ``settings.ssh_identity_file``); each must report its start
    within ``settings.start_timeout`` seconds.

    Args:
        settings: a :class:`~horovod.runner.common.util.settings.Settings` (``hosts``,
            ``num_proc``, ``key``, ``verbose``, ``output_filename``,
            ``prefix_output_with_timestamp``). A new secret is made when ``key`` is None.
        nics: interface names (Gloo uses the first).
        env: the base environment of the workers (a mapping).
        server_ip: address at which workers reach the rendezvous server.
        command: list of program arguments, or one string (or a one-item list) run by
            ``/bin/sh -c``.

    Raises:
        RuntimeError: a worker exited with a non-zero status (the message names the first
            rank to fail, its exit code and its host), a remote worker did not start in time
            (the host is named), or the launcher was interrupted by SIGINT/SIGTERM.
        ValueError: the hosts have fewer slots than ``num_proc``.
    """
    if settings.output_filename:
        _mkdir_p(settings.output_filename)
    slots = hosts.get_host_assignments(hosts.parse_hosts(settings.hosts), settings.num_proc,
                                       max_num_proc=settings.num_proc)
    rendezvous = RendezvousServer(secret=settings.key)
    port = rendezvous.start()
    try:
        rendezvous.init(slots)
        remote_hosts = network.filter_local_addresses(sorted({slot.hostname for slot in slots}))
        job = _Job(settings, dict(env), create_run_env_vars(server_ip, nics, port), command,
                   rendezvous.secret, remote_hosts=remote_hosts, report_start=(server_ip, port))
        start_timeout = settings.start_timeout
        start_timeout_s = getattr(start_timeout, "seconds", start_timeout) or 30
        job.run(slots, port=port, start_timeout_s=start_timeout_s)
    finally:
        rendezvous.stop()

    if job.start_failure:
        raise RuntimeError(job.start_failure)
    for _, rank, code, host in sorted(job.results):
        if code != 0:
            raise RuntimeError(JOB_FAILED_MESSAGE.format(rank=rank, code=describe_exit_code(code),
                                                         host=host))
    if job.shutdown_event.is_set():
        raise RuntimeError("horovodrun was interrupted by a signal; all workers were stopped")


def _get_min_start_hosts(settings):
    """Hosts an elastic job waits for before it starts: 2 to detect the common network
    interfaces, 1 when ``--network-interface`` names them."""
    return 2 if settings.elastic and not settings.nics else 1


def launch_elastic(settings, make_worker_fn, min_hosts=1, should_stop=None):
    """Run an elastic job with the launcher's :class:`~horovod.runner.elastic.driver.ElasticDriver`
    and authenticated rendezvous server, the workers started by the caller's function; used by
    :func:`gloo_run_elastic` and by ``horovod.spark.run_elastic``.

    Args:
        settings: an :class:`~horovod.runner.elastic.settings.ElasticSettings`.
        make_worker_fn: ``make_worker_fn(driver, current_hosts, rendezvous, port) ->
            create_worker``, called once the first ``settings.num_proc`` slots on ``min_hosts``
            hosts are available (``current_hosts``: the
            :class:`~horovod.runner.elastic.discovery.DiscoveredHosts`); ``create_worker(slot_info,
            events) -> (exit_code, timestamp)`` runs one worker until it exits or one of
            ``events`` (threading.Event) is set.
        min_hosts: hosts to wait for before the start.
        should_stop: ``should_stop() -> None or str``, polled every 0.1 s while the job runs; a
            message stops the job with that error.

    Raises:
        RuntimeError: the job failed: the driver's reason (reset limit, every worker or host
            failed, the discovery failed at start, ``should_stop``'s message) or the first worker
            that exited non-zero (``constants.WORKER_FAILED_MESSAGE``, upstream's, the process
            named ``<host>[<local_rank>]``).
        TimeoutException: fewer than ``settings.min_num_proc`` slots (``settings.num_proc`` to
            start) for ``settings.elastic_timeout`` seconds.
    """
    from horovod.runner.elastic import constants
    from horovod.runner.elastic.driver import ElasticDriver
    from horovod.runner.elastic.rendezvous import create_rendezvous_handler

    rendezvous = RendezvousServer(secret=settings.key)
    driver = ElasticDriver(rendezvous, settings.discovery, settings.min_num_proc,
                           settings.max_num_proc, timeout=settings.elastic_timeout,
                           reset_limit=settings.reset_limit,
                           cooldown_range=settings.cooldown_range, verbose=settings.verbose)
    port = rendezvous.start(create_rendezvous_handler(driver))
    try:
        current = driver.wait_for_available_slots(settings.num_proc, min_hosts=min_hosts)
        create_worker = make_worker_fn(driver, current, rendezvous, port)
        driver.start(settings.num_proc, create_worker)
        while not driver.finished():
            message = should_stop() if should_stop is not None else None
            if message:
                driver.stop(message)
                break
            time.sleep(0.1)
        results = driver.get_results()
    finally:
        driver.stop()
        driver.wait_for_workers()
        rendezvous.stop()

    if results.error_message:
        raise RuntimeError(results.error_message)
    failed = sorted((timestamp, name, code)
                    for name, (code, timestamp) in results.worker_results.items() if code != 0)
    if failed:
        _, name, code = failed[0]
        raise RuntimeError(constants.WORKER_FAILED_MESSAGE.format(
            name=name, code=describe_exit_code(code)) + "Host: %s\n" % name.rpartition("[")[0])


def gloo_run_elastic(settings, env, command, slurm_steps=None):
    """Run ``command`` as an elastic job (``settings``: an
    :class:`~horovod.runner.elastic.settings.ElasticSettings`) and wait for it to end.

    Workers are started on the hosts ``settings.discovery`` reports, up to
    ``settings.max_num_proc``; they find their ranks through the rendezvous server at every
    reset (``HOROVOD_ELASTIC=1``). Each output line is prefixed with the worker's rank at the
    time it was relayed. With ``slurm_steps`` (a :class:`~horovod.runner.srun_run.ElasticSteps`,
    inside a Slurm allocation) each worker is a srun step of its own instead of an ssh session,
    and no interface probe runs: each node picks its interface towards this host.

    Raises:
        RuntimeError: the job failed: the driver's reason (reset limit, every worker or host
            failed, the discovery script failed at start) or the first worker that exited
            non-zero.
        TimeoutException: fewer than ``settings.min_num_proc`` slots (``settings.num_proc`` to
            start) for ``settings.elastic_timeout`` seconds.
    """
    from horovod.runner.driver import driver_service

    if settings.output_filename:
        _mkdir_p(settings.output_filename)
    shutdown_event, restore_signals = register_shutdown_event()

    def make_worker(driver, current, rendezvous, port):
        host_names = current.host_assignment_order
        if slurm_steps is not None:
            run_vars = slurm_steps.run_vars(settings.nics, port)
        else:
            if settings.nics:
                nics = sorted(settings.nics)
            else:
                nics = driver_service.get_common_interfaces(settings, host_names)
            run_vars = create_run_env_vars(network.get_driver_ip(nics), nics, port, elastic=True)
        # A worker waits for its slot in a new round as long as the driver waits for slots.
        run_vars[env_names.ELASTIC_TIMEOUT] = str(settings.elastic_timeout)
        job = _Job(settings, dict(env), run_vars, command, rendezvous.secret)
        job.step_launch = slurm_steps.wrap if slurm_steps is not None else None
        remote_cache = {}

        def create_worker(slot_info, events):
            host = slot_info.hostname
            if host not in remote_cache:
                remote_cache[host] = slurm_steps is None and bool(network.filter_local_addresses([host]))
            if remote_cache[host]:
                job.remote_hosts.add(host)

            def label():
                # The worker's rank now (it changes at resets).
                info = driver.get_slot_info(host, slot_info.local_rank)
                return info.rank if info.rank >= 0 else slot_info.rank

            code = job.execute_slot(slot_info, events + [shutdown_event], index=label)
            return code, time.time()

        return create_worker

    def interrupted():
        if shutdown_event.is_set():
            return "horovodrun was interrupted by a signal; all workers were stopped"
        return None

    try:
        launch_elastic(settings, make_worker,
                       min_hosts=1 if slurm_steps is not None else _get_min_start_hosts(settings),
                       should_stop=interrupted)
    finally:
        restore_signals()
