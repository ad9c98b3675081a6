"""The driver service of :func:`horovod.spark.run_elastic`.

Every Spark task attempt registers with a host hash of its own and then asks for work every
``ELASTIC_POLL_INTERVAL_S`` (those asks are its heartbeat). The elastic driver's workers are
started by handing a task the rank's plan at its next ask, and end when the task reports the rank
process's end. A task attempt is gone once its rank failed (the task raises and Spark runs it
again as a new host), when Spark starts the same task index again (its previous attempt was lost
with its executor), or when it has not asked for ``heartbeat_timeout`` seconds.
"""

import time

from horovod.runner.common.util import network
from horovod.spark.common import util
from horovod.spark.driver.driver_service import SparkDriverService


class _Attempt:
    def __init__(self, registration):
        self.registration = registration
        self.index = registration.index
        self.attempt = registration.attempt
        self.last_seen = time.monotonic()
        self.gone = None  # why this attempt can no longer run a rank
        self.plan = None  # the plan waiting for the task's next ask
        self.stop = False
        self.run = 0  # runs started
        self.outcomes = {}  # run -> ElasticRankDone


class SparkElasticDriverService(SparkDriverService):
    """Args: the service ``key``, ``nics``, the ``stdout``/``stderr`` streams (None: output stays
    in the executor logs), ``prefix_output_with_timestamp`` and ``heartbeat_timeout`` (seconds)."""

    def __init__(self, key, nics, stdout, stderr, prefix_output_with_timestamp, heartbeat_timeout):
        super().__init__(0, key, nics, stdout, stderr, prefix_output_with_timestamp)
        self._heartbeat_timeout = heartbeat_timeout
        self._attempts = {}  # host hash -> _Attempt, in registration order
        self._latest = {}  # task index -> host hash of its latest attempt
        self._end = None  # the answer every ask gets once the job is over
        self.rank_failures = []  # ElasticRankDone (or a lost attempt's stand-in), in order
        self.label = None  # host hash -> the rank to label its output with

    def _handle(self, req, client_address):
        if isinstance(req, util.RegisterTask):
            with self._lock:
                if self._end is not None:
                    return self._end
                previous = self._attempts.get(self._latest.get(req.index))
                if previous is not None and previous.gone is None:
                    # Spark runs a task again only after its previous attempt failed.
                    self._lose(previous, "Spark started task %d again (attempt %d): the previous attempt was "
                                         "lost (its executor or Python worker died)" % (req.index, req.attempt))
                self._attempts[req.host_hash] = _Attempt(req)
                self._latest[req.index] = req.host_hash
                self._lock.notify_all()
                return util.Plan(None)
        if isinstance(req, util.ElasticPoll):
            with self._lock:
                attempt = self._attempts.get(req.host)
                if attempt is None:
                    return util.Abort("unknown task")
                attempt.last_seen = time.monotonic()
                if self._end is not None:
                    return self._end
                if attempt.gone is not None:
                    return util.Abort(attempt.gone)
                if attempt.plan is not None:
                    plan, attempt.plan = attempt.plan, None
                    return plan
                if attempt.stop:
                    attempt.stop = False
                    return util.StopRank()
                return None
        if isinstance(req, util.ElasticRankDone):
            with self._lock:
                attempt = self._attempts.get(req.host)
                if attempt is not None:
                    attempt.outcomes[attempt.run] = req
                    if req.exit_code != 0:
                        if req.rank is None and self.label is not None:
                            rank = self.label(req.host)
                            req.rank = rank if isinstance(rank, int) else None
                        self.rank_failures.append((attempt.index, attempt.attempt, req))
                        if attempt.gone is None:
                            attempt.gone = "its rank failed"
                self._lock.notify_all()
            return network.AckResponse()
        return super()._handle(req, client_address)

    def _write(self, req):
        label = self.label
        if isinstance(req.rank, str) and label is not None:
            req.rank = label(req.rank)
        super()._write(req)

    def _lose(self, attempt, reason):
        attempt.gone = reason
        if attempt.run and attempt.run not in attempt.outcomes:
            self.rank_failures.append((attempt.index, attempt.attempt,
                                       util.ElasticRankDone(None, 1, None, None, None, reason)))
        self._lock.notify_all()

    # Driver-side API.

    def available_hosts(self):
        """Host hashes of the live task attempts, in task index order."""
        now = time.monotonic()
        with self._lock:
            for attempt in self._attempts.values():
                if attempt.gone is None and now - attempt.last_seen > self._heartbeat_timeout:
                    self._lose(attempt, "Spark task %d (attempt %d) was not heard from for %d s: its executor "
                                        "was lost?" % (attempt.index, attempt.attempt, self._heartbeat_timeout))
            live = [(a.index, a.attempt, host) for host, a in self._attempts.items() if a.gone is None]
        return [host for _, _, host in sorted(live)]

    def registered_count(self):
        return len(self.available_hosts())

    def registrations(self):
        """``{task index: RegisterTask}`` of the live attempts."""
        hosts = set(self.available_hosts())
        with self._lock:
            return {a.index: a.registration for h, a in self._attempts.items() if h in hosts}

    def start_rank(self, host, plan):
        """Hand ``plan`` to task ``host`` at its next ask; returns the run's number."""
        with self._lock:
            attempt = self._attempts[host]
            attempt.run += 1
            attempt.plan = plan
            attempt.stop = False
            return attempt.run

    def stop_rank(self, host):
        with self._lock:
            attempt = self._attempts[host]
            if attempt.plan is not None:  # never handed out
                attempt.plan = None
                attempt.outcomes[attempt.run] = util.ElasticRankDone(host, 1, None, None, None, "stopped")
            else:
                attempt.stop = True
            self._lock.notify_all()

    def outcome(self, host, run):
        """The exit code of run ``run`` of task ``host``, or None while it runs. A run of an
        attempt that is gone without reporting ended with exit code 1."""
        with self._lock:
            attempt = self._attempts[host]
            done = attempt.outcomes.get(run)
            if done is not None:
                return done.exit_code
            if attempt.gone is not None:
                return 1
            return None

    def results(self):
        """``[(rank, size, cloudpickled result)]`` of the ranks that returned a result."""
        with self._lock:
            return [(done.rank, done.size, done.result) for attempt in self._attempts.values()
                    for done in attempt.outcomes.values() if done.exit_code == 0 and done.result is not None]

    def end(self, reply):
        """Answer every later ask with ``reply`` (:class:`~horovod.spark.common.util.Finish` or
        :class:`~horovod.spark.common.util.Abort`)."""
        with self._lock:
            if self._end is None:
                self._end = reply
            self._lock.notify_all()

    def wait(self, predicate, timeout):
        with self._lock:
            return self._lock.wait_for(predicate, timeout)
