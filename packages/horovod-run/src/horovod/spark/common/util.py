"""What the driver of :func:`horovod.spark.run` and its Spark tasks share: the host hash, the
messages of the driver service, its client, and the sealing of the rendezvous secret.
"""

import hashlib
import hmac
import os

from horovod.runner.common.util import host_hash as _host_hash
from horovod.runner.common.util import network

DRIVER_SERVICE_NAME = "horovod.spark driver service"


def host_hash(salt=None):
    """The runner's host hash, salted with ``CONTAINER_ID`` when set (YARN containers, or Spark
    workers told apart that way, count as hosts of their own) and with ``salt``."""
    parts = [p for p in (os.environ.get("CONTAINER_ID"), salt) if p is not None]
    return _host_hash.host_hash("-".join(str(p) for p in parts) if parts else None)


def _keystream(key: bytes, nonce: bytes, length: int) -> bytes:
    blocks = []
    for counter in range((length + 31) // 32):
        blocks.append(hmac.new(key, b"horovod.spark seal" + nonce + counter.to_bytes(4, "big"),
                               hashlib.sha256).digest())
    return b"".join(blocks)[:length]


def seal(key: bytes, data: bytes) -> bytes:
    """``data`` encrypted under ``key`` (a fresh 16-byte nonce, then ``data`` XOR an HMAC-SHA256
    keystream). Integrity comes from the authenticated wire that carries it."""
    nonce = os.urandom(16)
    return nonce + bytes(a ^ b for a, b in zip(data, _keystream(key, nonce, len(data)), strict=True))


def unseal(key: bytes, sealed: bytes) -> bytes:
    nonce, data = sealed[:16], sealed[16:]
    return bytes(a ^ b for a, b in zip(data, _keystream(key, nonce, len(data)), strict=True))


# Requests of the driver service (task -> driver) and its answers.

class RegisterTask:
    def __init__(self, index, attempt, host_hash, driver_interfaces, task_interfaces, gpus):
        self.index = index
        self.task_interfaces = task_interfaces
        self.attempt = attempt
        self.host_hash = host_hash
        self.driver_interfaces = driver_interfaces
        self.gpus = gpus


class PollTask:
    """Heartbeat of task ``index``; answered with :class:`Plan` once all tasks registered
    (``plan`` None before), or :class:`Abort`."""

    def __init__(self, index):
        self.index = index


class Plan:
    def __init__(self, plan):
        self.plan = plan


class TaskPlan:
    def __init__(self, rank, env, sealed_secret, payload, stdout, stderr):
        self.rank = rank
        self.env = env
        self.sealed_secret = sealed_secret
        self.payload = payload
        self.stdout = stdout
        self.stderr = stderr


class Abort:
    def __init__(self, reason):
        self.reason = reason


class Output:
    def __init__(self, rank, stream, text):
        self.rank = rank
        self.stream = stream
        self.text = text


class RankDone:
    def __init__(self, index, rank, exit_code, error):
        self.index = index
        self.rank = rank
        self.exit_code = exit_code
        self.error = error


# The elastic job's requests and answers (horovod.spark.run_elastic).

class ElasticPoll:
    """Task ``host`` (its host hash) asks for work; the asks are its heartbeat. Answered with a
    :class:`TaskPlan` (start a rank), :class:`StopRank`, :class:`Finish`, :class:`Abort` or
    ``None`` (nothing new)."""

    def __init__(self, host):
        self.host = host


class StopRank:
    """Kill the running rank (its host was blacklisted, or the job stops)."""


class Finish:
    """The job is over: the task ends."""


class ElasticRankDone:
    """The rank process of task ``host`` ended: its exit code, the rank and size it ended with,
    its cloudpickled result (None without one) and its error text."""

    def __init__(self, host, exit_code, rank, size, result, error):
        self.host = host
        self.exit_code = exit_code
        self.rank = rank
        self.size = size
        self.result = result
        self.error = error


# The MPI controller's requests (horovod.spark.run(use_mpi=True)).

class MpiPlan:
    """The plan of every task under MPI: run the commands the driver hands out (mpirun's
    ``orted`` daemons, on each host's first task) until the job ends."""


class RunCommand:
    """mpirun's rsh agent asks for ``command`` (a shell command line) to run on host ``host``
    (a host hash) with ``env`` added to the task's environment; answered with its id."""

    def __init__(self, host, command, env):
        self.host = host
        self.command = command
        self.env = env


class CommandStatus:
    """The exit code of command ``command_id``, or None while it runs."""

    def __init__(self, command_id):
        self.command_id = command_id


class PollCommand:
    """Task ``index`` asks for a command to run (its heartbeat under MPI); answered with a
    :class:`TaskCommand`, None, :class:`Finish` or :class:`Abort`."""

    def __init__(self, index):
        self.index = index


class TaskCommand:
    def __init__(self, command_id, command, env):
        self.command_id = command_id
        self.command = command
        self.env = env


class CommandDone:
    def __init__(self, command_id, exit_code):
        self.command_id = command_id
        self.exit_code = exit_code


class GetPayload:
    """A rank process under MPI asks for the cloudpickled ``(fn, args, kwargs)``."""


class RankResult:
    """A rank process under MPI reports its cloudpickled result (None when it failed) and its
    traceback (None when it did not)."""

    def __init__(self, rank, result, error):
        self.rank = rank
        self.result = result
        self.error = error


class DriverClient(network.BasicClient):
    """A Spark task's client of the driver service."""

    def __init__(self, driver_addresses, key, verbose=0):
        super().__init__(DRIVER_SERVICE_NAME, driver_addresses, key, verbose=verbose, probe_timeout=10)

    def send(self, request):
        return self._send(request)


# The Estimators' data preparation (spec/spark.md §8 names it util.prepare_data).
from horovod.spark.common.data import _training_cache, prepare_data  # noqa: E402,F401
