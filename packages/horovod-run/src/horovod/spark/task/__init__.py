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

import cloudpickle

from horovod.common.rendezvous import SECRET_ENV
from horovod.runner.common.util import network
from horovod.runner.gloo_run import describe_exit_code
from horovod.spark.common import util
from horovod.runner.common.util import env_names

POLL_INTERVAL_S = 0.1
HEARTBEAT_INTERVAL_S = 1.0
# An elastic task asks the driver for work this often (the asks are its heartbeat).
ELASTIC_POLL_INTERVAL_S = 0.25
GPUS_ENV = env_names.SPARK_TASK_GPUS


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


class _RankProcess:
    """One rank as a process of its own (:mod:`horovod.spark.task.gloo_exec_fn`): its
    environment is this task's plus ``plan.env``, the unsealed secret and the task's facts; its
    output is forwarded to the driver (labelled ``label``) or to this task's streams."""

    def __init__(self, client, key, plan, settings, label):
        env = dict(os.environ)
        env.update(plan.env)
        env[SECRET_ENV] = util.unseal(key, plan.sealed_secret).hex()
        env[env_names.SPARK_WORK_DIR] = os.getcwd()
        env[env_names.SPARK_TASK_PID] = str(os.getpid())
        env[GPUS_ENV] = ",".join(_task_gpus())
        executable = settings["executable"] or sys.executable
        read_end, write_end = os.pipe()
        try:
            self.proc = subprocess.Popen([executable, "-m", "horovod.spark.task.gloo_exec_fn", str(write_end)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         env=env, pass_fds=(write_end,))
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        self._result = []
        self._reader = threading.Thread(target=lambda: self._result.append(_read_all(read_end)), daemon=True)
        self._reader.start()
        self._forwarders = [_Forwarder(self.proc.stdout, client, label, "stdout", plan.stdout, sys.stdout),
                            _Forwarder(self.proc.stderr, client, label, "stderr", plan.stderr, sys.stderr)]
        self.proc.stdin.write(plan.payload)
        self.proc.stdin.close()

    def poll(self):
        return self.proc.poll()

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def finish(self):
        """Wait for the end; return ``(exit code, body, error text)``: body is ``(rank, size,
        cloudpickled result)`` with the rank and size the process ended with (None without a
        result), error the traceback or the end of stderr."""
        self.proc.wait()
        for forwarder in self._forwarders:
            forwarder.thread.join()
        self._reader.join()
        body = self._result[0] if self._result else b""
        code = self.proc.returncode if self.proc.returncode >= 0 else 128 - self.proc.returncode
        if code == 0 and body[:1] == b"O":
            place, _, result = body[1:].partition(b"\n")
            rank, size = (int(v) for v in place.split())
            return 0, (rank, size, result), None
        if code == 0 and body[:1] == b"X":  # sys.exit(0): no result (an elastic worker removed)
            return 0, None, None
        if body[:1] == b"E":
            error = body[1:].decode("utf-8", "replace")
        else:
            error = ("the rank's process ended (exit code %s) without reporting a result; the end of its "
                     "stderr:\n%s" % (describe_exit_code(code), "".join(self._forwarders[1].tail)))
        return code if code != 0 else 1, None, error


def _register(index, driver_addresses, key, settings, host_hash):
    from pyspark import TaskContext

    context = TaskContext.get()
    attempt = context.attemptNumber() if context is not None else 0
    client = util.DriverClient(driver_addresses, key, verbose=settings["verbose"])
    nics = settings["nics"]
    host = host_hash(attempt)
    reply = client.send(util.RegisterTask(index, attempt, host, sorted(client.addresses()),
                                          sorted(network.local_ipv4_addresses(nics)), _task_gpus()))
    return client, attempt, host, reply


def task_exec(index, driver_addresses, key, settings):
    """Run rank of Spark task ``index`` to its end; returns ``[(rank, cloudpickled result)]``.

    A failed rank is reported to the driver (which raises it) and gives ``[]``, as does a rank
    stopped because the driver aborted the job. Raises ``RuntimeError`` when the driver aborts the
    job before the rank started.
    """
    client, _, _, reply = _register(index, driver_addresses, key, settings, lambda attempt: util.host_hash())
    while True:
        if isinstance(reply, util.Abort):
            raise RuntimeError("horovod.spark: the driver stopped the job: %s" % reply.reason)
        if isinstance(reply, util.Plan) and reply.plan is not None:
            plan = reply.plan
            break
        time.sleep(POLL_INTERVAL_S)
        reply = client.send(util.PollTask(index))

    if isinstance(plan, util.MpiPlan):
        return _serve_mpi(index, client, key)
    rank = _RankProcess(client, key, plan, settings, plan.rank)
    next_beat = time.monotonic() + HEARTBEAT_INTERVAL_S
    while rank.poll() is None:
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
                rank.kill()
                sys.stderr.write("horovod.spark: rank %d was stopped: %s\n" % (plan.rank, beat.reason))
                return []
    code, body, error = rank.finish()
    if code == 0:
        client.send(util.RankDone(index, plan.rank, 0, None))
        # No body: fn called sys.exit(0), which counts as returning None.
        return [(plan.rank, cloudpickle.dumps(None) if body is None else body[2])]
    # The driver raises the failure; the task ends normally so that Spark does not run it again.
    client.send(util.RankDone(index, plan.rank, code, error))
    sys.stderr.write("horovod.spark: rank %d failed (exit code %d):\n%s" % (plan.rank, code, error))
    return []


def _serve_mpi(index, client, key):
    """Run the commands (mpirun's daemons) the driver hands this task until the job ends;
    returns ``[]`` (the ranks send their results to the driver)."""
    running = {}
    try:
        while True:
            try:
                reply = client.send(util.PollCommand(index))
            except ConnectionError:
                reply = util.Abort("the driver service cannot be reached")
            if isinstance(reply, (util.Abort, util.Finish)):
                return []
            if isinstance(reply, util.TaskCommand):
                env = dict(os.environ)
                env.update(reply.env)
                env[SECRET_ENV] = key.hex()
                env[env_names.SPARK_WORK_DIR] = os.getcwd()
                running[reply.command_id] = subprocess.Popen(["/bin/sh", "-c", reply.command], env=env,
                                                             stdin=subprocess.DEVNULL)
            for command_id, proc in list(running.items()):
                if proc.poll() is not None:
                    del running[command_id]
                    client.send(util.CommandDone(command_id, proc.returncode))
            time.sleep(POLL_INTERVAL_S)
    finally:
        for proc in running.values():
            proc.kill()
            proc.wait()


def elastic_task_exec(index, driver_addresses, key, settings):
    """The Spark task ``index`` of :func:`horovod.spark.run_elastic`: a one-slot host of the
    elastic job, whose host hash is salted with the index, the attempt and the time (a retry is
    a new host). It runs the ranks the driver asks for, one at a time, and reports each run's end
    with the result; it returns ``[]`` when the driver ends the job.

    Raises ``RuntimeError`` when its rank failed (exit code not 0), so that Spark runs the task
    again (``spark.task.maxFailures``) and the job gets a new host.
    """
    def host_hash(attempt):
        return util.host_hash(salt="%d-%d-%.6f" % (index, attempt, time.time()))

    client, attempt, host, reply = _register(index, driver_addresses, key, settings, host_hash)
    rank = None
    while True:
        if isinstance(reply, (util.Abort, util.Finish)):
            if rank is not None:
                rank.kill()
                client.send(util.ElasticRankDone(host, 137, None, None, None, "stopped by the driver"))
            return []
        if isinstance(reply, util.TaskPlan):
            rank = _RankProcess(client, key, reply, settings, host)
        elif isinstance(reply, util.StopRank) and rank is not None:
            rank.kill()
        if rank is not None and rank.poll() is not None:
            code, body, error = rank.finish()
            rank = None
            client.send(util.ElasticRankDone(host, code, *(body or (None, None, None)), error))
            if code != 0:
                raise RuntimeError("horovod.spark: the rank of Spark task %d (attempt %d) failed with exit code "
                                   "%s; Spark runs the task again as a new host of the elastic job:\n%s"
                                   % (index, attempt, describe_exit_code(code), error))
        time.sleep(ELASTIC_POLL_INTERVAL_S)
        try:
            reply = client.send(util.ElasticPoll(host))
        except ConnectionError:
            reply = util.Abort("the driver service cannot be reached")


def _read_all(fd):
    chunks = []
    with os.fdopen(fd, "rb") as f:
        while True:
            chunk = f.read(65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
