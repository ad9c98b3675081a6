"""Output relay and process-tree termination, with real child processes."""

import io
import subprocess
import sys
import textwrap
import threading
import time
from unittest import mock

import psutil
import pytest

from horovod.runner.common.util import safe_shell_exec

# Writes bytes to stdout in separate, flushed writes with pauses in between, so that the relay
# sees them in separate reads.
WRITER = textwrap.dedent("""
    import os, sys, time
    for part in sys.argv[1:]:
        os.write(1, bytes.fromhex(part))
        time.sleep(0.1)
""")


def _relay(*parts, prefix="stdout", index=3, timestamp=False):
    proc = subprocess.Popen([sys.executable, "-c", WRITER] + [p.hex() for p in parts],
                            stdout=subprocess.PIPE)
    out = io.StringIO()
    safe_shell_exec.prefix_connection(proc.stdout, out, prefix, index, timestamp)
    assert proc.wait() == 0
    return out.getvalue()


def test_lines_are_prefixed():
    assert _relay(b"one\ntwo\n", b"thr", b"ee\n") == (
        "[3]<stdout>:one\n[3]<stdout>:two\n[3]<stdout>:three\n")


def test_carriage_return_ends_a_line():
    assert _relay(b"10%\r20%\r", b"done\n") == (
        "[3]<stdout>:10%\r[3]<stdout>:20%\r[3]<stdout>:done\n")


def test_split_multibyte_character_stays_whole():
    snowman = "\u2603".encode()  # 3 bytes in UTF-8
    assert _relay(b"a" + snowman[:1], snowman[1:2], snowman[2:] + b"b\n") == (
        "[3]<stdout>:a\u2603b\n")


def test_unterminated_last_line_is_flushed_at_eof():
    assert _relay(b"first\n", b"last without newline") == (
        "[3]<stdout>:first\n[3]<stdout>:last without newline")


def test_no_prefix_without_index():
    assert _relay(b"a\nb", index=None, timestamp=True) == "a\nb"


def test_timestamp_prefix():
    fixed = time.struct_time((2020, 1, 20, 12, 0, 1, 0, 20, 0))
    with mock.patch("horovod.runner.common.util.safe_shell_exec.time.localtime",
                    return_value=fixed):
        assert _relay(b"x\n", prefix="stderr", index=123, timestamp=True) == (
            "Mon Jan 20 12:00:01 2020[123]<stderr>:x\n")


def _run(code, **kwargs):
    out, err = io.StringIO(), io.StringIO()
    exit_code = safe_shell_exec.execute([sys.executable, "-c", code], stdout=out, stderr=err,
                                        **kwargs)
    return exit_code, out.getvalue(), err.getvalue()


def test_execute_relays_both_streams_and_exit_code():
    code, out, err = _run("import sys; print('o'); print('e', file=sys.stderr); sys.exit(3)",
                          index=0)
    assert (code, out, err) == (3, "[0]<stdout>:o\n", "[0]<stderr>:e\n")


def test_execute_shell_string_and_env():
    out = io.StringIO()
    code = safe_shell_exec.execute("echo $GREETING; exit 4", env={"GREETING": "hi"},
                                   stdout=out, stderr=io.StringIO(), index=1)
    assert code == 4 and out.getvalue() == "[1]<stdout>:hi\n"


def test_execute_raw_copies():
    raw_out, raw_err = io.StringIO(), io.StringIO()
    code, out, _ = _run("import sys; print('o'); print('e', file=sys.stderr)", index=2,
                        raw_stdout=raw_out, raw_stderr=raw_err)
    assert code == 0 and out == "[2]<stdout>:o\n"
    assert raw_out.getvalue() == "o\n" and raw_err.getvalue() == "e\n"


def test_death_by_signal_maps_to_128_plus_signal():
    code, _, _ = _run("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert code == 137


def test_missing_program_raises():
    with pytest.raises(OSError):
        safe_shell_exec.execute(["/nonexistent/program"], stdout=io.StringIO(),
                                stderr=io.StringIO())


# Starts a grandchild that would outlive its parent, prints both pids, then sleeps.
TREE = textwrap.dedent("""
    import os, subprocess, sys, time
    child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])
    print(os.getpid(), child.pid, flush=True)
    time.sleep(600)
""")


def _pids_from(out):
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        text = out.getvalue()
        if text.endswith("\n"):
            return [int(p) for p in text.split()]
        time.sleep(0.05)
    raise AssertionError("child did not report its pids")


def _gone(pid):
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_event_terminates_whole_tree():
    out = io.StringIO()
    event = threading.Event()
    result = []
    thread = threading.Thread(target=lambda: result.append(safe_shell_exec.execute(
        [sys.executable, "-c", TREE], stdout=out, stderr=io.StringIO(), events=[event])))
    thread.start()
    pids = _pids_from(out)
    assert not any(_gone(p) for p in pids)
    start = time.monotonic()
    event.set()
    thread.join(timeout=20)
    assert not thread.is_alive()
    assert time.monotonic() - start < safe_shell_exec.GRACEFUL_TERMINATION_TIME_S
    assert result == [128 + 15]
    assert all(_gone(p) for p in pids)


def test_leftover_children_are_stopped_after_normal_exit():
    code = ("import subprocess, sys\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
            "print(c.pid, flush=True)\n")
    out = io.StringIO()
    assert safe_shell_exec.execute([sys.executable, "-c", code], stdout=out,
                                   stderr=io.StringIO()) == 0
    assert _gone(int(out.getvalue()))


def test_sigterm_ignored_escalates_to_sigkill():
    code = ("import signal, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\n"
            "time.sleep(600)\n")
    out = io.StringIO()
    event = threading.Event()
    result = []
    with mock.patch("horovod.runner.common.util.safe_shell_exec.GRACEFUL_TERMINATION_TIME_S",
                    0.5):
        thread = threading.Thread(target=lambda: result.append(safe_shell_exec.execute(
            [sys.executable, "-c", code], stdout=out, stderr=io.StringIO(), events=[event])))
        thread.start()
        deadline = time.monotonic() + 20
        while "ready" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
        event.set()
        thread.join(timeout=20)
    assert result == [128 + 9]
