"""Helpers for tests that start real Ray clusters (``ray start --block`` child processes): one
token per test process, short folders for Ray's files, and stopping every process by PID.

* Ray 2.60 turns token authentication on; Ray reads ``RAY_AUTH_MODE``/``RAY_AUTH_TOKEN`` once, when
  it is imported, so :func:`token_env` must run before ``import ray`` and gives the same token to
  every caller in the process (the nodes and the driver must share it; ``~/.ray`` is never used).
* Ray's Unix socket paths below its temp dir must stay under 107 bytes: :func:`temp_dir_for`.
* :func:`stop_cluster` stops what ``ray stop`` would, by PID: everything but the GCS first, the GCS
  last (TERMed together, the GCS and the autoscaler's monitor hang until KILLed).
"""

import os
import pathlib
import secrets
import signal
import subprocess
import time

# The GCS checks every node each second and marks it dead after 5 failed checks (Ray's default
# period: 3 s), so a stopped node's actors are reported dead within seconds.
RAY_NODE_ENV = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "5"}
STOP_TIMEOUT_S = 15
# The longest Unix socket path Ray builds below its temp dir.
RAY_SOCKET_SUFFIX = len("/session_2026-11-25_19-19-31_123456_1234567/sockets/plasma_store")
SOCKET_PATH_MAX = 107
TOKEN_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")

_token = None


def token_env():
    """``{"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": <this process's token>}``, also set in
    ``os.environ`` (where ``RAY_ADDRESS`` is removed); the first call makes the token."""
    global _token
    if _token is None:
        _token = secrets.token_hex(32)
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": _token}
    os.environ.update(env)
    os.environ.pop("RAY_ADDRESS", None)
    return env


def temp_dir_for(repo, name, subdir_length=0):
    """``<repo>/build/<name>-<pid>``, or ``~/.cache/hvd-<name>-<pid>`` when that is too long for
    Ray's socket paths (with ``subdir_length`` more characters below it, for per-node folders).

    Raises ValueError when neither is short enough.
    """
    pid = os.getpid()
    candidates = (pathlib.Path(repo) / "build" / ("%s-%d" % (name, pid)),
                  pathlib.Path.home() / ".cache" / ("hvd-%s-%d" % (name, pid)))
    for path in candidates:
        if len(str(path)) + subdir_length + RAY_SOCKET_SUFFIX < SOCKET_PATH_MAX:
            return path
    raise ValueError("no folder for Ray's files is short enough for Unix socket paths (< %d bytes): %s"
                     % (SOCKET_PATH_MAX, ", ".join(map(str, candidates))))


def _alive(proc):
    try:
        return proc.is_running() and proc.status() != "zombie"
    except Exception:  # gone
        return False


def processes_of(popens, temp_dir):
    """Every live process of a cluster: the ``ray start`` processes (``popens``), their
    descendants, and any process whose command line names ``temp_dir`` (reparented daemons)."""
    import psutil
    found = {}
    for popen in popens:
        try:
            top = psutil.Process(popen.pid)
        except psutil.NoSuchProcess:
            continue
        found[top.pid] = top
        for child in top.children(recursive=True):
            found[child.pid] = child
    for proc in psutil.process_iter(["cmdline"]):
        if any(str(temp_dir) in part for part in (proc.info["cmdline"] or [])):
            found.setdefault(proc.pid, proc)
    found.pop(os.getpid(), None)
    return [p for p in found.values() if _alive(p)]


def stop_cluster(popens, temp_dir):
    """TERM everything but the GCS, then the GCS, then KILL what is left; return the processes
    that survived (empty on success)."""
    import psutil
    procs = processes_of(popens, temp_dir)

    def name(p):
        try:
            return p.name()
        except psutil.Error:
            return ""

    names = {p.pid: name(p) for p in procs}
    gcs = [p for p in procs if "gcs_server" in names[p.pid]]
    for wave in ([p for p in procs if p not in gcs], gcs):
        for p in wave:
            try:
                p.send_signal(signal.SIGTERM)
            except psutil.Error:
                pass
        psutil.wait_procs(wave, timeout=STOP_TIMEOUT_S)
    for p in processes_of(popens, temp_dir):
        try:
            p.kill()
        except psutil.Error:
            pass
    for popen in popens:
        try:
            popen.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
    time.sleep(0.5)
    # What ran when the stop began (is_running() compares creation times: a reused PID is not
    # taken for it), and anything naming the temp dir since.
    left = {p.pid: p for p in procs if _alive(p)}
    left.update((p.pid, p) for p in processes_of(popens, temp_dir))
    print("stopped %d Ray processes: %s" % (len(procs), ", ".join(sorted(names.values()))))
    return list(left.values())


def shutdown_cluster(popens, logs, temp_dir, saved_env):
    """The end of a test cluster: disconnect this process's Ray, stop the nodes
    (:func:`stop_cluster`), close their log files, put back the environment variables in
    ``saved_env`` (``{name: value or None}``) and remove ``temp_dir``. Returns the processes that
    survived (empty on success)."""
    import shutil

    import ray

    if ray.is_initialized():
        ray.shutdown()
    left = stop_cluster(popens, temp_dir)
    for log in logs:
        log.close()
    for name, value in saved_env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    shutil.rmtree(temp_dir, ignore_errors=True)
    return left
