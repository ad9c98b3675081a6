"""Run one worker command, relay its output line by line, and stop its whole process tree.

Each command runs in its own session (so its process group id is its pid). Stopping it means
SIGTERM to the group, up to ``GRACEFUL_TERMINATION_TIME_S`` seconds for the group to empty, then
SIGKILL to whatever is left. The same clean-up runs when the command exits by itself, so that no
child it left behind keeps running (or keeps the output pipes open). Should this process die
without cleaning up, :mod:`orphan_guard` stops the groups it left running.
"""

import codecs
import os
import re
import signal
import subprocess
import sys
import threading
import time

from horovod.runner.common.util import orphan_guard

GRACEFUL_TERMINATION_TIME_S = 5
_POLL_INTERVAL_S = 0.05
_READ_SIZE = 1000
_RELAY_JOIN_TIMEOUT_S = 2.0
_LINE_END = re.compile(r"[\r\n]")
# Serialises writes of whole lines from the relay threads of all workers.
_write_lock = threading.Lock()


def prefix_connection(src_connection, dst_stream, prefix, index, prefix_output_with_timestamp,
                      raw_stream=None):
    """Copy text from ``src_connection`` to ``dst_stream`` until EOF, prefixing every line.

    Args:
        src_connection: anything with ``fileno()`` (a pipe, a ``multiprocessing`` connection);
            read with ``os.read`` in chunks of up to 1000 bytes and decoded as UTF-8
            incrementally, so a character split between reads stays whole (undecodable bytes
            become U+FFFD).
        dst_stream: text stream, flushed after every line.
        prefix: ``"stdout"`` or ``"stderr"``; with ``index`` it makes ``[<index>]<<prefix>>:``.
            When either is None lines are copied unchanged (and without a timestamp).
        index: the worker's rank, or a callable returning the rank for each line.
        prefix_output_with_timestamp: put ``time.asctime()`` of the local time before the prefix.
        raw_stream: optional text stream that receives the unprefixed output.

    A line ends after ``\\n`` or ``\\r`` (the separator stays with it); an unterminated last
    fragment is written at EOF.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    fd = src_connection.fileno()
    pending = ""
    # A destination that fails (a closed pipe, say) is dropped, but the source is still drained
    # to EOF: a worker blocked on a full pipe would otherwise never exit.
    destinations = [(dst_stream, True)]
    if raw_stream is not None:
        destinations.insert(0, (raw_stream, False))

    # The rank prefix is the same for every line (unless ``index`` is a callable, asked per
    # line: an elastic worker's rank changes); only the timestamp has to be made per line.
    labelled = prefix is not None and index is not None
    head = "[%s]<%s>:" % (index, prefix) if labelled and not callable(index) else None

    def emit(line):
        prefixed = line
        if labelled:
            prefixed = (head or "[%s]<%s>:" % (index(), prefix)) + line
            if prefix_output_with_timestamp:
                prefixed = time.asctime(time.localtime(time.time())) + prefixed
        with _write_lock:
            for dst in list(destinations):
                stream, with_prefix = dst
                try:
                    stream.write(prefixed if with_prefix else line)
                    stream.flush()
                except (OSError, ValueError):
                    destinations.remove(dst)

    while True:
        chunk = os.read(fd, _READ_SIZE)
        pending += decoder.decode(chunk, final=not chunk)
        start = 0
        for match in _LINE_END.finditer(pending):
            emit(pending[start:match.end()])
            start = match.end()
        pending = pending[start:]
        if not chunk:
            break
    if pending:
        emit(pending)


def _group_exists(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        # A member changed its credentials (setuid); it still exists.
        return True


def _signal_group(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def terminate_process_group(proc):
    """Stop ``proc`` (started with ``start_new_session=True``) and everything in its group.

    Sends SIGTERM, waits up to ``GRACEFUL_TERMINATION_TIME_S`` seconds for the group to empty,
    then sends SIGKILL. Returns once the leader has been reaped.
    """
    pgid = proc.pid
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + GRACEFUL_TERMINATION_TIME_S
    # The leader is reaped by poll(); until then it would count as a member of the group.
    while time.monotonic() < deadline:
        if proc.poll() is not None and not _group_exists(pgid):
            return
        time.sleep(_POLL_INTERVAL_S)
    _signal_group(pgid, signal.SIGKILL)
    proc.wait()


def _exit_code(returncode):
    """Map Popen's returncode to a shell-style exit code (death by signal s gives 128 + s)."""
    return 128 - returncode if returncode < 0 else returncode


def execute(command, env=None, stdout=None, stderr=None, index=None, events=None,
            prefix_output_with_timestamp=False, raw_stdout=None, raw_stderr=None,
            stdin_line=None) -> int:
    """Run ``command`` to completion and return its exit code.

    Args:
        command: a list of program arguments, or a string run by ``/bin/sh -c``.
        env: the child's complete environment (None inherits this process's).
        stdout, stderr: text streams the output is relayed to (default: ``sys.stdout`` and
            ``sys.stderr`` at call time), prefixed as in :func:`prefix_connection`.
        index: the worker's rank, used in the prefix (None: no prefix).
        events: ``threading.Event`` objects (None entries are ignored); when one is set, the
            command's process group is stopped (SIGTERM, then SIGKILL after
            ``GRACEFUL_TERMINATION_TIME_S`` seconds).
        prefix_output_with_timestamp: see :func:`prefix_connection`.
        raw_stdout, raw_stderr: optional text streams receiving the unprefixed output.
        stdin_line: bytes written to the command's standard input, which then stays open until
            the command has exited (ssh carries both to a remote command, whose end of file
            then tells that the launcher is gone); None gives it ``/dev/null``.

    Returns:
        The exit code; a command killed by signal ``s`` gives ``128 + s``.

    Raises:
        OSError: the command could not be started (e.g. the program does not exist).
    """
    stdout = sys.stdout if stdout is None else stdout
    stderr = sys.stderr if stderr is None else stderr
    events = [event for event in events or [] if event is not None]
    proc = subprocess.Popen(command, shell=isinstance(command, str), env=env,
                            stdin=subprocess.DEVNULL if stdin_line is None else subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    guard = orphan_guard.get_guard()
    guard.register(proc.pid)
    if stdin_line is not None:
        try:
            proc.stdin.write(stdin_line)
            proc.stdin.flush()
        except OSError:
            pass  # the command exited at once; its status tells why
    relays = [
        threading.Thread(target=prefix_connection, daemon=True,
                         args=(proc.stdout, stdout, "stdout", index, prefix_output_with_timestamp,
                               raw_stdout)),
        threading.Thread(target=prefix_connection, daemon=True,
                         args=(proc.stderr, stderr, "stderr", index, prefix_output_with_timestamp,
                               raw_stderr)),
    ]
    for relay in relays:
        relay.start()
    try:
        while proc.poll() is None:
            if any(event.is_set() for event in events):
                break
            try:
                proc.wait(timeout=_POLL_INTERVAL_S)
            except subprocess.TimeoutExpired:
                pass
    finally:
        # Also after a normal exit: whatever the command left in its group is stopped too.
        terminate_process_group(proc)
        guard.unregister(proc.pid)
        if proc.stdin is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass
        # A process that left the group (its own setsid) may still hold a pipe: do not wait for
        # it forever, and leave the pipe to its relay thread in that case.
        for relay, pipe in zip(relays, (proc.stdout, proc.stderr), strict=True):
            relay.join(timeout=_RELAY_JOIN_TIMEOUT_S)
            if not relay.is_alive():
                pipe.close()
    return _exit_code(proc.returncode)
