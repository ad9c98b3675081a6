"""Stop workers whose launcher died without stopping them (e.g. ``kill -9 horovodrun``).

Workers run in their own sessions, so nothing else would stop them. The launcher starts one guard
process (``python -m horovod.runner.common.util.orphan_guard``) whose stdin is a pipe from the
launcher, and tells it ``+<pgid>`` when a worker's process group starts and ``-<pgid>`` once that
group is gone. When the pipe reaches EOF (the launcher exited, however it exited) the guard stops
every group still registered: SIGTERM, up to ``GRACE_S`` seconds, then SIGKILL.
"""

import os
import signal
import subprocess
import sys
import threading
import time

GRACE_S = 5.0
_POLL_INTERVAL_S = 0.05


class OrphanGuard:
    """Launcher side: starts the guard process and registers worker process groups with it."""

    def __init__(self):
        read_end, self._write_end = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "horovod.runner.common.util.orphan_guard"],
                stdin=read_end, start_new_session=True)
        finally:
            os.close(read_end)
        self._lock = threading.Lock()

    def _send(self, line):
        with self._lock:
            os.write(self._write_end, line.encode())

    def register(self, pgid):
        """Have the guard stop process group ``pgid`` if this process dies first."""
        self._send("+%d\n" % pgid)

    def unregister(self, pgid):
        """Tell the guard that process group ``pgid`` is gone."""
        self._send("-%d\n" % pgid)


_guard = None
_guard_lock = threading.Lock()


def get_guard():
    """The guard of this process, started on first use."""
    global _guard
    with _guard_lock:
        if _guard is None:
            _guard = OrphanGuard()
        return _guard


def _signal_groups(pgids, sig):
    alive = set()
    for pgid in pgids:
        try:
            os.killpg(pgid, sig)
            alive.add(pgid)
        except ProcessLookupError:
            pass
        except PermissionError:
            alive.add(pgid)
    return alive


def _stop_groups(pgids):
    alive = _signal_groups(pgids, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while alive and time.monotonic() < deadline:
        time.sleep(_POLL_INTERVAL_S)
        alive = _signal_groups(alive, 0)
    _signal_groups(alive, signal.SIGKILL)


def main():
    # Started in its own session, the guard does not receive the terminal's Ctrl-C; it ends at
    # EOF on stdin, that is when the launcher has exited.
    registered = set()
    for line in sys.stdin:
        line = line.strip()
        if line.startswith("+"):
            registered.add(int(line[1:]))
        elif line.startswith("-"):
            registered.discard(int(line[1:]))
    _stop_groups(registered)


if __name__ == "__main__":
    main()
