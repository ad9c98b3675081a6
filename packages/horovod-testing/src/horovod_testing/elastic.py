"""Elastic ``horovodrun`` jobs for the framework packages' end-to-end tests.

:class:`ElasticJob` starts ``python -m horovod.runner.launch ...`` and collects its output lines
as they come; :func:`discovery_script` writes a host discovery script whose answer the test
changes while the job runs. Training scripts print ``STEP {json}`` and ``FINAL {json}`` lines
carrying at least ``rank`` and ``size``; the launcher prefixes each line with ``[rank]<stdout>:``.

Both host names the tests use, ``localhost`` and ``127.0.0.1``, are this machine: the launcher
starts their workers without ssh, and the engine treats them as two hosts.
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

__all__ = ["ElasticJob", "discovery_script", "check_prefixes", "check_finals"]


class ElasticJob:
    """A ``horovodrun`` process (launched as ``python -m horovod.runner.launch *args``) whose
    output lines are collected by a thread. Use it as a context manager: leaving the block stops
    the launcher (SIGTERM, then SIGKILL) if it is still running, and the launcher stops its
    workers."""

    def __init__(self, args, env=None, timeout=120, command=None):
        """``command``, when given, is the whole command line to run instead of
        ``python -m horovod.runner.launch *args`` (``args`` are then unused): horovodrun run
        elsewhere, e.g. in a container."""
        self.timeout = timeout
        self.lines = []
        self._lock = threading.Lock()
        self.started = time.monotonic()
        argv = command if command is not None else [sys.executable, "-m", "horovod.runner.launch", *args]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=dict(os.environ if env is None else env))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()

    def _read(self):
        for line in self.proc.stdout:
            with self._lock:
                self.lines.append(line.rstrip("\n"))

    def snapshot(self):
        with self._lock:
            return list(self.lines)

    def tail(self, n=120):
        return "\n".join(self.snapshot()[-n:])

    def records(self, kind):
        """``[(prefix rank, json)]`` of the worker lines ``kind {json}`` (``STEP``, ``FINAL``)."""
        found = []
        for line in self.snapshot():
            match = re.match(r"\[(\d+)\]<stdout>:%s (\{.*\})$" % kind, line)
            if match:
                found.append((int(match.group(1)), json.loads(match.group(2))))
        return found

    def steps(self):
        return [record for _, record in self.records("STEP")]

    def sizes(self):
        """The world sizes of rank 0's STEP lines in order, consecutive repeats folded. Rank 0
        trains at every size, and its lines come through one relay, so their order is the order
        they were written in (other ranks' lines reach the launcher through other hosts' relays
        and may come late)."""
        sizes = []
        for record in self.steps():
            if record["rank"] != 0:
                continue
            if not sizes or sizes[-1] != record["size"]:
                sizes.append(record["size"])
        return sizes

    def wait_for(self, predicate, what, timeout=60):
        """Waits until ``predicate()`` holds; raises AssertionError (with the output's tail) when
        it does not within ``timeout`` seconds or the job ended without it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            if self.proc.poll() is not None:
                self._reader.join(timeout=5)
                if predicate():
                    return
                raise AssertionError("the job ended (status %s) before %s:\n%s"
                                     % (self.proc.returncode, what, self.tail()))
            time.sleep(0.05)
        raise AssertionError("waited %ss for %s:\n%s" % (timeout, what, self.tail()))

    def finish(self):
        """Waits for the launcher to exit; returns ``(status, whole output)``."""
        left = self.timeout - (time.monotonic() - self.started)
        try:
            code = self.proc.wait(timeout=max(left, 1))
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("the job did not end within %ss:\n%s"
                                 % (self.timeout, self.tail())) from None
        self._reader.join(timeout=10)
        return code, "\n".join(self.snapshot())

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=10)


def discovery_script(folder):
    """Writes ``folder/discover.sh``, which prints the hosts last given to ``set_hosts``.

    Returns ``(script path, set_hosts)``; ``set_hosts(['localhost:1', ...])`` replaces the
    answer atomically."""
    hosts_file = os.path.join(folder, "hosts.txt")
    script = os.path.join(folder, "discover.sh")
    with open(script, "w") as f:
        f.write("#!/bin/sh\ncat '%s'\n" % hosts_file)
    os.chmod(script, 0o755)

    def set_hosts(hosts):
        tmp = hosts_file + ".tmp"
        with open(tmp, "w") as f:
            f.write("".join(h + "\n" for h in hosts))
        os.replace(tmp, hosts_file)

    return script, set_hosts


def check_prefixes(job):
    """Every STEP and FINAL line was printed with the rank its worker had then."""
    for kind in ("STEP", "FINAL"):
        for prefix_rank, record in job.records(kind):
            assert prefix_rank == record["rank"], (kind, prefix_rank, record)


def check_finals(job, key="weights"):
    """One FINAL line per rank of the last world, all with the same ``key`` value; returns it."""
    finals = [record for _, record in job.records("FINAL")]
    assert finals, "no FINAL line:\n" + job.tail()
    sizes = {record["size"] for record in finals}
    assert len(sizes) == 1, finals
    size = sizes.pop()
    assert sorted(record["rank"] for record in finals) == list(range(size)), finals
    values = [record[key] for record in finals]
    assert all(v == values[0] for v in values), "%s differ between ranks: %s" % (key, values)
    return values[0]
