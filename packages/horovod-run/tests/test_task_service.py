"""BasicTaskService / BasicTaskClient: a command run on a client's behalf, its streamed output,
exit code, abort and shutdown, with real processes and real TCP on the loopback interface."""

import io
import re
import sys
import textwrap
import threading
import time

import psutil
import pytest

from horovod.runner.common.service.task_service import (
    BasicTaskClient, BasicTaskService, CommandOutputNotCaptured, RunCommandRequest)
from horovod.runner.common.util import network, secret
from horovod.runner.common.util.timeout import Timeout, TimeoutException
from horovod_testing.processes import wait_gone

NAME = "test task service"
# Upper bound for anything that should finish; a broken service fails the test, never hangs it.
BOUND_S = 20.0

# Prints its pid and that of a child it starts, then sleeps: a command that has to be stopped.
SLEEPER = textwrap.dedent("""
    import os, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    print("pids %d %d" % (os.getpid(), child.pid), flush=True)
    time.sleep(120)
""")


def _loopback_nics():
    return {intf for intf, ips in network.local_ipv4_addresses().items() if "127.0.0.1" in ips}


@pytest.fixture
def task():
    """``task(index=0, command_env=None)`` -> ``(service, client)``; services are shut down."""
    services = []

    def make(index=0, command_env=None):
        key = secret.make_secret_key()
        service = BasicTaskService(NAME, index, key, _loopback_nics(), command_env=command_env)
        services.append(service)
        client = BasicTaskClient(NAME, service.addresses(), key, verbose=0, attempts=1)
        return service, client

    yield make
    for service in services:
        service.shutdown()


def _bounded(fn, *args, timeout=BOUND_S):
    """``fn(*args)`` run in a thread; fails the test when it takes longer than ``timeout``."""
    outcome = {}

    def run():
        try:
            outcome["result"] = fn(*args)
        except BaseException as e:
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "%s did not return within %s s" % (fn.__name__, timeout)
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("result")


class _Text(io.StringIO):
    """A text stream whose content a test can wait for."""

    def __init__(self):
        super().__init__()
        self._cond = threading.Condition()

    def write(self, text):
        with self._cond:
            n = super().write(text)
            self._cond.notify_all()
            return n

    def wait_for(self, pattern, timeout=BOUND_S):
        with self._cond:
            assert self._cond.wait_for(lambda: re.search(pattern, self.getvalue()), timeout), (
                "%r never appeared in %r" % (pattern, self.getvalue()))
            return re.search(pattern, self.getvalue())


def _python(script):
    return [sys.executable, "-c", script]


def _start_sleeper(client):
    """Run SLEEPER with its stdout streamed back; return (pids, stdout thread)."""
    out = _Text()
    stdout_thread, _ = client.stream_command_output(stdout=out)
    client.run_command(_python(SLEEPER), {}, capture_stdout=True)
    match = out.wait_for(r"pids (\d+) (\d+)")
    pids = [int(pid) for pid in match.groups()]
    assert all(psutil.pid_exists(pid) for pid in pids)
    return pids, stdout_thread


def test_stdout_and_stderr_are_streamed_with_the_task_index(task):
    service, client = task(index=3)
    out, err = io.StringIO(), io.StringIO()
    # Asked for before the command starts, as launchers do: the service waits for it.
    threads = client.stream_command_output(stdout=out, stderr=err)
    client.run_command(_python(
        "import sys\n"
        "print('out one', flush=True)\n"
        "print('err one', file=sys.stderr, flush=True)\n"
        "print('out two \\u2603')\n"), {}, capture_stdout=True, capture_stderr=True)
    assert _bounded(client.wait_for_command_exit_code, 0.1) == 0
    for thread in threads:
        thread.join(BOUND_S)
        assert not thread.is_alive() and thread.exception is None
    assert out.getvalue() == "[3]<stdout>:out one\n[3]<stdout>:out two \u2603\n"
    assert err.getvalue() == "[3]<stderr>:err one\n"


def test_timestamp_prefix(task):
    _, client = task()
    out = io.StringIO()
    stdout_thread, stderr_thread = client.stream_command_output(stdout=out)
    assert stderr_thread is None
    client.run_command("echo hi", {}, capture_stdout=True, prefix_output_with_timestamp=True)
    stdout_thread.join(BOUND_S)
    assert re.fullmatch(r"\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4}\[0\]<stdout>:hi\n",
                        out.getvalue()), out.getvalue()


@pytest.mark.parametrize("command,exit_code", [("true", 0), ("false", 1), ("exit 7", 7)])
def test_exit_code(task, command, exit_code):
    service, client = task()
    assert client.command_result() == (False, None)
    client.run_command(command, {})
    assert _bounded(client.wait_for_command_exit_code, 0.1) == exit_code
    assert client.command_result() == (True, exit_code)
    assert client.command_terminated()
    assert service.command_exit_code() == exit_code


def test_abort_stops_the_command_and_its_children(task):
    _, client = task()
    pids, stdout_thread = _start_sleeper(client)
    assert client.command_result() == (False, None)
    assert not client.command_terminated()
    client.abort_command()
    assert _bounded(client.wait_for_command_exit_code, 0.1) == 128 + 15  # SIGTERM
    assert all(wait_gone(pid, timeout_s=5) for pid in pids)
    stdout_thread.join(BOUND_S)
    assert not stdout_thread.is_alive() and stdout_thread.exception is None
    _bounded(client.wait_for_command_termination, 0.1)
    assert client.command_result() == (True, 128 + 15)


def test_abort_before_any_command_does_not_stop_a_later_one(task):
    _, client = task()
    client.abort_command()
    client.run_command("exit 5", {})
    assert _bounded(client.wait_for_command_exit_code, 0.1) == 5


def test_shutdown_stops_a_running_command_and_leaves_no_thread(task):
    before = set(threading.enumerate())
    service, client = task()
    pids, stdout_thread = _start_sleeper(client)
    _bounded(service.shutdown)
    assert all(wait_gone(pid, timeout_s=5) for pid in pids)
    assert service.command_exit_code() == 128 + 15
    stdout_thread.join(BOUND_S)
    assert not stdout_thread.is_alive()
    # The server's connection threads end right after their last write.
    deadline = time.monotonic() + 2
    while set(threading.enumerate()) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(threading.enumerate()) - before == set()
    with pytest.raises(ConnectionError):
        client.command_result()


def test_shutdown_lets_a_waiting_client_have_the_exit_code(task):
    service, client = task()
    waiter_result = []
    waiter = threading.Thread(
        target=lambda: waiter_result.append(client.wait_for_command_exit_code(0.1)), daemon=True)
    waiter.start()
    start = time.monotonic()
    client.run_command("sleep 1; exit 4", {})
    time.sleep(0.3)  # the waiter's request is being answered
    _bounded(service.shutdown)
    assert time.monotonic() - start >= 1.0
    waiter.join(BOUND_S)
    assert waiter_result == [4]


def test_a_second_command_is_refused(task):
    _, client = task()
    _start_sleeper(client)
    with pytest.raises(RuntimeError, match="already runs"):
        client.run_command("echo second", {})
    client.abort_command()
    assert _bounded(client.wait_for_command_exit_code, 0.1) == 128 + 15
    with pytest.raises(RuntimeError, match="already ran"):
        client.run_command("echo third", {})


def test_a_retried_run_request_starts_the_command_once(task):
    _, client = task()
    out = io.StringIO()
    stdout_thread, _ = client.stream_command_output(stdout=out)
    request = RunCommandRequest("echo once", {}, capture_stdout=True)
    client._send(request)
    client._send(request)  # as after a lost answer: acknowledged, not run again
    stdout_thread.join(BOUND_S)
    assert out.getvalue() == "[0]<stdout>:once\n"


def test_output_that_was_not_captured(task):
    service, client = task()
    out, err = io.StringIO(), io.StringIO()
    stdout_thread, stderr_thread = client.stream_command_output(stdout=out, stderr=err)
    client.run_command("echo out; echo err >&2", {}, capture_stderr=True)
    assert _bounded(client.wait_for_command_exit_code, 0.1) == 0
    stdout_thread.join(BOUND_S)
    stderr_thread.join(BOUND_S)
    assert isinstance(stdout_thread.exception, CommandOutputNotCaptured)
    assert out.getvalue() == ""
    assert stderr_thread.exception is None and err.getvalue() == "[0]<stderr>:err\n"
    with pytest.raises(CommandOutputNotCaptured):
        service.stream_output(None)


ENV_PRINTER = "import os; print([os.environ.get(n) for n in ('A', 'B', 'C', 'D')], 'PATH' in os.environ)"


def test_request_env_is_laid_over_command_env(task):
    _, client = task(command_env={"A": "base", "B": "base", "C": "base", "PATH": "/bin"})
    out = io.StringIO()
    stdout_thread, _ = client.stream_command_output(stdout=out)
    client.run_command(_python(ENV_PRINTER), {"B": "request", "C": None, "D": "new"},
                       capture_stdout=True)
    stdout_thread.join(BOUND_S)
    assert out.getvalue() == "[0]<stdout>:['base', 'request', None, 'new'] True\n"


def test_without_command_env_the_request_env_is_the_whole_environment(task):
    _, client = task()
    out = io.StringIO()
    stdout_thread, _ = client.stream_command_output(stdout=out)
    client.run_command(_python(ENV_PRINTER), {"A": "only"}, capture_stdout=True)
    stdout_thread.join(BOUND_S)
    assert out.getvalue() == "[0]<stdout>:['only', None, None, None] False\n"


def test_register_code_result(task):
    service, client = task()
    assert service.fn_result() is None
    client.register_code_result({"loss": [0.5, 0.25]})
    assert service.fn_result() == {"loss": [0.5, 0.25]}


def test_service_side_waits_for_the_command(task):
    service, client = task()
    assert service.check_for_command_start(0.2) is False
    with pytest.raises(TimeoutException, match="command to run"):
        service.wait_for_command_start(Timeout(0.2, "Timed out waiting for {activity}."))
    client.run_command("sleep 0.5; exit 2", {})
    assert service.check_for_command_start(BOUND_S) is True
    _bounded(service.wait_for_command_start)
    _bounded(service.wait_for_command_termination)
    assert service.command_exit_code() == 2


def test_initial_registration(task):
    service, client = task()
    with pytest.raises(TimeoutException):
        service.wait_for_initial_registration(Timeout(0.2, "Timed out waiting for {activity}."))
    client.notify_initial_registration_complete()
    _bounded(service.wait_for_initial_registration, Timeout(BOUND_S, "{activity}"))
