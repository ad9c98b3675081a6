"""The service the driver of :func:`horovod.spark.run` runs for its Spark tasks (and, extended,
for those of the MPI and elastic modes: :mod:`horovod.spark.mpi_run`,
:mod:`horovod.spark.driver.elastic_service`)."""

import threading
import time

from horovod.runner.common.util import network
from horovod.spark.common import util

# A task not heard from for this long (it heartbeats every second) counts as lost.
HEARTBEAT_TIMEOUT_S = 30.0


class SparkDriverService(network.BasicService):
    """Registers the Spark tasks of one :func:`run`, hands out their plans, relays their output
    and collects their failures."""

    def __init__(self, num_proc, key, nics, stdout, stderr, prefix_output_with_timestamp):
        super().__init__(util.DRIVER_SERVICE_NAME, key, nics)
        self.num_proc = num_proc
        self._lock = threading.Condition()
        self._registered = {}  # index -> RegisterTask
        self._last_seen = {}
        self._plans = None  # index -> TaskPlan
        self._rank_of_index = {}
        self._done = set()
        self.failures = []  # (kind, index, rank, exit_code, text), in arrival order
        self.abort_reason = None
        self._streams = {"stdout": stdout, "stderr": stderr}
        self._timestamp = prefix_output_with_timestamp

    def _handle(self, req, client_address):
        if isinstance(req, util.RegisterTask):
            return self._register(req)
        if isinstance(req, util.PollTask):
            with self._lock:
                self._last_seen[req.index] = time.monotonic()
                if self.abort_reason is not None:
                    return util.Abort(self.abort_reason)
                return util.Plan(self._plans[req.index] if self._plans is not None else None)
        if isinstance(req, util.Output):
            self._write(req)
            return network.AckResponse()
        if isinstance(req, util.RankDone):
            with self._lock:
                self._done.add(req.rank)
                if req.exit_code != 0:
                    self.failures.append(("rank", req.index, req.rank, req.exit_code, req.error))
                    if self.abort_reason is None:
                        self.abort_reason = "rank %d failed" % req.rank
                self._lock.notify_all()
            return network.AckResponse()
        return super()._handle(req, client_address)

    def _register(self, req):
        with self._lock:
            self._last_seen[req.index] = time.monotonic()
            if any(f[1] == req.index for f in self.failures):
                return util.Abort("Spark task %d has failed already" % req.index)
            if req.attempt > 0 or (req.index in self._registered and self._plans is not None):
                rank = self._rank_of_index.get(req.index)
                self.failures.append(("lost", req.index, rank, None,
                                      "Spark task %d%s failed and Spark started it again (attempt %d); its "
                                      "executor was lost or its Python worker died. horovod.spark.run does not "
                                      "use Spark task retries." % (req.index, "" if rank is None else
                                                                   " (rank %d)" % rank, req.attempt)))
                self._lock.notify_all()
                return util.Abort("Spark task %d was retried" % req.index)
            if self.abort_reason is not None:
                return util.Abort(self.abort_reason)
            self._registered[req.index] = req
            self._lock.notify_all()
            return util.Plan(None)

    def _write(self, req):
        stream = self._streams.get(req.stream)
        if stream is None:
            return
        prefix = "[%d]<%s>:" % (req.rank, req.stream)
        lines = req.text.splitlines(keepends=True)
        out = []
        for line in lines:
            stamp = time.asctime(time.localtime(time.time())) if self._timestamp else ""
            out.append(stamp + prefix + line)
        with self._lock:
            stream.write("".join(out))
            stream.flush()

    # Driver-side API.

    def registered_count(self):
        with self._lock:
            return len(self._registered)

    def wait(self, predicate, timeout):
        with self._lock:
            return self._lock.wait_for(predicate, timeout)

    def registrations(self):
        with self._lock:
            return dict(self._registered)

    def set_plans(self, plans, rank_of_index):
        with self._lock:
            self._rank_of_index = dict(rank_of_index)
            self._plans = plans
            now = time.monotonic()
            for index in plans:
                self._last_seen[index] = now

    def all_done(self):
        with self._lock:
            return len(self._done) == self.num_proc

    def silent_tasks(self, timeout):
        now = time.monotonic()
        with self._lock:
            return [i for i, t in self._last_seen.items()
                    if now - t > timeout and self._rank_of_index.get(i) not in self._done]

    def rank_of_index(self, index):
        return self._rank_of_index.get(index)

    def abort(self, reason):
        with self._lock:
            if self.abort_reason is None:
                self.abort_reason = reason
            self._lock.notify_all()
