"""The Spark-task side of :func:`horovod.spark.run`.

Each Spark task registers with the driver service (its index, its host hash and Spark attempt),
waits for its rank's plan, starts the rank as a process of its own
(:mod:`horovod.spark.task.gloo_exec_fn`), forwards its output when asked, heartbeats, and kills it
when the driver aborts the job. The rank's result goes back through Spark's ``collect``.
"""

import collections
import os
import subprocess
import sys
import threading
import time

from horovod.common.rendezvous import SECRET_ENV
from horovod.runner.common.util import network
from horovod.runner.gloo_run import describe_exit_code
from horovod.spark.common import util

POLL_INTERVAL_S = 0.1
HEARTBEAT_INTERVAL_S = 1.0
GPUS_ENV = "HOROVOD_SPARK_TASK_GPUS"


def get_available_devices():
    """The GPU addresses Spark gave this task (``[]`` if none), in a rank's process or a task."""
    if GPUS_ENV in os.environ:
        return [g for g in os.environ[GPUS_ENV].split(",") if g]
    return _task_gpus()


def _task_gpus():
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return []
    gpu = context.resources().get("gpu")
    return list(gpu.addresses) if gpu is not None else []


class _Forwarder:
    """Copies one output stream of the rank process to the driver (line batches) or to this
    task's own stream (the executor log)."""

    def __init__(self, pipe, client, rank, name, forward, local_stream):
        self._pipe = pipe
        self._client = client
        self._rank = rank
        self._name = name
        self._forward = forward
        self._local = local_stream
        self.tail = collections.deque(maxlen=20)
        self.thread = threading.Thread(target=self._copy, name="horovod.spark %s" % name, daemon=True)
        self.thread.start()

    def _copy(self):
        decoder_buffer = b""
        while True:
            chunk = os.read(self._pipe.fileno(), 65536)
            if not chunk:
                break
            self.tail.extend(chunk.decode("utf-8", "replace").splitlines(keepends=True))
            if not self._forward:
                self._local.write(chunk.decode("utf-8", "replace"))
                self._local.flush()
                continue
            decoder_buffer += chunk
            # Send whole lines (a trailing fragment waits for its end, or for EOF).
            cut = max(decoder_buffer.rfind(b"\n"), decoder_buffer.rfind(b"\r"))
            if cut >= 0:
                self._send(decoder_buffer[:cut + 1])
                decoder_buffer = decoder_buffer[cut + 1:]
        if decoder_buffer and self._forward:
            self._send(decoder_buffer)

    def _send(self, data):
        try:
            self._client.send(util.Output(self._rank, self._name, data.decode("utf-8", "replace")))
        except Exception as e:  # the driver is gone; keep the text in the executor log
            self._local.write("horovod.spark: could not forward output (%s): %s"
                              % (e, data.decode("utf-8", "replace")))


def task_exec(index, driver_addresses, key, settings):
    """Run rank of Spark task ``index`` to its end; returns ``[(rank, cloudpickled result)]``.

    A failed rank is reported to the driver (which raises it) and gives ``[]``, as does a rank
    stopped because the driver aborted the job. Raises ``RuntimeError`` when the driver aborts the
    job before the rank started.
    """
    from pyspark import TaskContext

    context = TaskContext.get()
    attempt = context.attemptNumber() if context is not None else 0
    client = util.DriverClient(driver_addresses, key, verbose=settings["verbose"])
    nics = settings["nics"]
    reply = client.send(util.RegisterTask(index, attempt, util.host_hash(), sorted(client.addresses()),
                                          sorted(network.local_ipv4_addresses(nics)), _task_gpus()))
    while True:
        if isinstance(reply, util.Abort):
            raise RuntimeError("horovod.spark: the driver stopped the job: %s" % reply.reason)
        if isinstance(reply, util.Plan) and reply.plan is not None:
            plan = reply.plan
            break
        time.sleep(POLL_INTERVAL_S)
        reply = client.send(util.PollTask(index))

    env = dict(os.environ)
    env.update(plan.env)
    env[SECRET_ENV] = util.unseal(key, plan.sealed_secret).hex()
    env["HOROVOD_SPARK_WORK_DIR"] = os.getcwd()
    env["HOROVOD_SPARK_TASK_PID"] = str(os.getpid())
    env[GPUS_ENV] = ",".join(_task_gpus())
    executable = settings["executable"] or sys.executable
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen([executable, "-m", "horovod.spark.task.gloo_exec_fn", str(write_end)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env, pass_fds=(write_end,))
    finally:
        os.close(write_end)
    result = []
    reader = threading.Thread(target=lambda: result.append(_read_all(read_end)), daemon=True)
    reader.start()
    forwarders = [_Forwarder(proc.stdout, client, plan.rank, "stdout", plan.stdout, sys.stdout),
                  _Forwarder(proc.stderr, client, plan.rank, "stderr", plan.stderr, sys.stderr)]
    proc.stdin.write(plan.payload)
    proc.stdin.close()

    next_beat = time.monotonic() + HEARTBEAT_INTERVAL_S
    while proc.poll() is None:
        time.sleep(POLL_INTERVAL_S)
        if time.monotonic() >= next_beat:
            next_beat = time.monotonic() + HEARTBEAT_INTERVAL_S
            try:
                beat = client.send(util.PollTask(index))
            except ConnectionError:
                beat = util.Abort("the driver service cannot be reached")
            if isinstance(beat, util.Abort):
                # The driver stops the job and raises its cause; ending normally keeps Spark from
                # running this task again.
                proc.kill()
                proc.wait()
                sys.stderr.write("horovod.spark: rank %d was stopped: %s\n" % (plan.rank, beat.reason))
                return []
    for forwarder in forwarders:
        forwarder.thread.join()
    reader.join()
    body = result[0] if result else b""
    code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    if code == 0 and body[:1] == b"O":
        client.send(util.RankDone(index, plan.rank, 0, None))
        return [(plan.rank, body[1:])]
    if body[:1] == b"E":
        error = body[1:].decode("utf-8", "replace")
    else:
        error = ("the rank's process ended (exit code %s) without reporting a result; the end of its stderr:\n%s"
                 % (describe_exit_code(code), "".join(forwarders[1].tail)))
    # The driver raises the failure; the task ends normally so that Spark does not run it again.
    client.send(util.RankDone(index, plan.rank, code, error))
    sys.stderr.write("horovod.spark: rank %d failed (exit code %d):\n%s" % (plan.rank, code, error))
    return []


def _read_all(fd):
    chunks = []
    with os.fdopen(fd, "rb") as f:
        while True:
            chunk = f.read(65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
