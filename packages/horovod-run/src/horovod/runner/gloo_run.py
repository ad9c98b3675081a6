"""Static launch with the launcher-rendezvous ("Gloo") controller on the local host.

The driver starts a :class:`RendezvousServer`, assigns ranks to slots, and runs one worker per
rank. A worker learns its place and the server from ``HOROVOD_*`` variables and the job secret
from ``_HOROVOD_SECRET_KEY``, all set in its own environment (never on its command line). When a
worker fails, every other worker is stopped and the job fails naming the first rank that did.
"""

import os
import shlex
import signal
import sys
import threading
import time

from horovod.runner.common.util import hosts, safe_shell_exec, secret
from horovod.runner.http.http_server import RendezvousServer

JOB_FAILED_MESSAGE = (
    "Horovod detected that one or more processes exited with non-zero status, so the job was "
    "terminated. The first process to fail was:\nProcess name: {rank}\nExit code: {code}\n")


def create_slot_env_vars(slot_info):
    """The ``HOROVOD_*`` variables that place one worker (a dict of str)."""
    return {
        "HOROVOD_HOSTNAME": str(slot_info.hostname),
        "HOROVOD_RANK": str(slot_info.rank),
        "HOROVOD_SIZE": str(slot_info.size),
        "HOROVOD_LOCAL_RANK": str(slot_info.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot_info.local_size),
        "HOROVOD_CROSS_RANK": str(slot_info.cross_rank),
        "HOROVOD_CROSS_SIZE": str(slot_info.cross_size),
    }


def create_run_env_vars(server_ip, nics, port, elastic=False):
    """The variables shared by every worker of the job: rendezvous address and controller.

    ``nics`` is an ordered sequence of interface names; the first is Gloo's interface.
    """
    nics = list(nics)
    run_vars = {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": server_ip,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": nics[0],
        "NCCL_SOCKET_IFNAME": ",".join(nics),
    }
    if elastic:
        run_vars["HOROVOD_ELASTIC"] = "1"
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

    def __init__(self, settings, env, run_vars, command, job_secret):
        self.settings = settings
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

    def worker_env(self, slot_info):
        worker_env = dict(self.env)
        worker_env.update(create_slot_env_vars(slot_info))
        worker_env.update(self.run_vars)
        worker_env["PYTHONUNBUFFERED"] = "1"
        worker_env[secret.HOROVOD_SECRET_KEY] = self.job_secret.hex()
        return worker_env

    def run_slot(self, slot_info):
        rank = slot_info.rank
        if self.settings.verbose:
            shown = dict(create_slot_env_vars(slot_info), **self.run_vars)
            _say("Launching rank %d: env %s %s"
                 % (rank, " ".join("%s=%s" % (k, shlex.quote(v)) for k, v in shown.items()),
                    _command_line(self.command)))
        raw = (None, None)
        try:
            raw = self._open_output_files(rank)
            code = safe_shell_exec.execute(
                self.command, env=self.worker_env(slot_info), index=rank,
                events=[self.shutdown_event, self.terminate_all_event],
                prefix_output_with_timestamp=self.settings.prefix_output_with_timestamp,
                raw_stdout=raw[0], raw_stderr=raw[1])
        except Exception as e:
            _say("Process %d could not be started: %s" % (rank, e), sys.stderr)
            code = 1
        finally:
            for f in raw:
                if f is not None:
                    f.close()
        with self._lock:
            self.results.append((time.time(), rank, code))
            if code == 0:
                return
            _say("Process %d exit with status code %d." % (rank, code))
            if not self.shutdown_event.is_set() and not self.terminate_all_event.is_set():
                _say("Terminating remaining workers after failure of Process %d." % rank)
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

    def run(self, slots):
        threads = [threading.Thread(target=self.run_slot, args=(slot,),
                                    name="horovod-worker-%d" % slot.rank, daemon=True)
                   for slot in slots]
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
    """Run ``command`` as ``settings.num_proc`` local workers and wait for all of them.

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
            rank to fail and its exit code), or the launcher was interrupted by SIGINT/SIGTERM.
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
        job = _Job(settings, dict(env), create_run_env_vars(server_ip, nics, port), command,
                   rendezvous.secret)
        job.run(slots)
    finally:
        rendezvous.stop()

    for _, rank, code in sorted(job.results):
        if code != 0:
            raise RuntimeError(JOB_FAILED_MESSAGE.format(rank=rank, code=code))
    if job.shutdown_event.is_set():
        raise RuntimeError("horovodrun was interrupted by a signal; all workers were stopped")
