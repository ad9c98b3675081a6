"""Start one worker on a remote host, on behalf of ``horovodrun``: ``python -m`` this module.

``horovodrun`` runs ``ssh <host> 'cd <cwd> ; exec <python> -m
horovod.runner.common.util.remote_exec'`` and writes one line to the ssh session's standard
input: the base64 of a JSON object with

* ``command``: a list of arguments, or one string run by ``/bin/sh -c``;
* ``env``: the variables the worker gets on top of the remote login environment (the launcher's
  exportable variables, the slot's ``HOROVOD_*`` variables and the job secret, which therefore
  never appears on any command line);
* ``cwd``: the launcher's working directory;
* ``rank`` and, optionally, ``report_start``: ``[address, port]`` of the launcher's rendezvous
  server, to which this process reports that the worker started (the launcher's start timeout).

The standard input then stays open for the life of the job. Its end of file means the launcher
(or its ssh client) is gone: the worker's whole process group is then stopped (SIGTERM, then
SIGKILL after ``safe_shell_exec.GRACEFUL_TERMINATION_TIME_S`` seconds). The same happens on
SIGTERM, SIGHUP or SIGINT. The worker's output goes straight to this process's stdout and stderr,
which ssh carries back to the launcher.
The exit status is the worker's (``128 + s`` when signal ``s`` killed it).
"""

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import threading

from horovod.runner.common.util import safe_shell_exec

_POLL_S = 0.05
STARTED_SCOPE = "horovodrun_started"
# Variables of the remote login session that describe that session; the launcher's own values
# (from its session, on its host) would be wrong here.
KEEP_REMOTE = ("SSH_CONNECTION", "SSH_CLIENT", "SSH_TTY", "SSH_AUTH_SOCK", "HOSTNAME", "_")


def encode_request(command, env, cwd, rank, report_start=None):
    """The line ``horovodrun`` writes to the ssh session (bytes, newline included)."""
    request = {"command": command, "env": env, "cwd": cwd, "rank": rank,
               "report_start": list(report_start) if report_start else None}
    return base64.b64encode(json.dumps(request).encode("utf-8")) + b"\n"


def _report_start(request, env):
    """Tell the launcher's rendezvous server that this rank's worker started."""
    from horovod.common.rendezvous import RendezvousClient
    address, port = request["report_start"]
    secret = bytes.fromhex(env["_HOROVOD_SECRET_KEY"])
    value = json.dumps({"host": socket.gethostname(), "pid": os.getpid()}).encode()
    RendezvousClient(address, int(port), secret=secret).set(
        STARTED_SCOPE, str(request["rank"]), value)


def main():
    line = sys.stdin.buffer.readline()
    if not line:
        sys.exit(0)  # the launcher went away before sending anything
    request = json.loads(base64.b64decode(line))
    env = dict(os.environ)
    kept = {name: env[name] for name in KEEP_REMOTE if name in env}
    env.update(request["env"])
    env.update(kept)
    try:
        os.chdir(request["cwd"])
    except OSError as e:
        print("horovodrun: warning: host %s has no directory %s (%s); the worker runs in %s"
              % (socket.gethostname(), request["cwd"], e.strerror, os.getcwd()),
              file=sys.stderr, flush=True)

    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, on_signal)

    def watch_stdin():
        # Anything after the request line is ignored; end of file means the launcher is gone.
        while sys.stdin.buffer.read1(4096):
            pass
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()

    if request.get("report_start"):
        try:
            _report_start(request, env)
        except Exception as e:
            print("horovodrun: host %s cannot reach the launcher's rendezvous server at %s:%s: %s"
                  % (socket.gethostname(), request["report_start"][0],
                     request["report_start"][1], e), file=sys.stderr, flush=True)
            sys.exit(1)

    command = request["command"]
    try:
        proc = subprocess.Popen(command, shell=isinstance(command, str), env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as e:
        print("horovodrun: host %s cannot start %s: %s" % (socket.gethostname(), command, e),
              file=sys.stderr, flush=True)
        sys.exit(127)
    while proc.poll() is None and not stop.is_set():
        try:
            proc.wait(timeout=_POLL_S)
        except subprocess.TimeoutExpired:
            pass
    # Also after a normal exit: whatever the worker left in its group is stopped.
    safe_shell_exec.terminate_process_group(proc)
    code = proc.returncode
    sys.stdout.flush()
    os._exit(128 - code if code < 0 else code)


if __name__ == "__main__":
    main()
