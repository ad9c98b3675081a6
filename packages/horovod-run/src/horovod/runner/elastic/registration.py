"""Rounds of an elastic job: which workers are ready for a new rendezvous, which exited.

The driver assigns slots (``(host, local_rank)``) in generations. A worker asks for its rank
(:meth:`WorkerStateRegistry.record_ready`) when it starts and every time it resets. A worker that
has not yet been answered in the current generation is answered at once. One that was (it is
resetting) records ``READY`` and waits; a worker process that exits records ``SUCCESS`` or
``FAILURE``. Once every slot of the generation has recorded a state, the round is decided:

* any ``SUCCESS``: the job is done; every ``FAILURE``: the job fails;
* otherwise the failed workers' hosts are blacklisted; if the resets reached ``reset_limit``, or
  every host of the round is blacklisted, the job fails (the reset limit is the reason given when
  both hold, as upstream's); else the driver computes the next
  generation's assignment (:meth:`ElasticDriver.resume`), starts the workers it lacks, and the
  waiting workers are answered with their new slots.
"""

import threading

from horovod.runner.util.exit_codes import describe_exit_code

READY = "READY"
SUCCESS = "SUCCESS"
FAILURE = "FAILURE"


class WorkerStateRegistry:
    """Args:
        driver: the :class:`~horovod.runner.elastic.driver.ElasticDriver`.
        host_manager: its :class:`~horovod.runner.elastic.discovery.HostManager`.
        reset_limit: the most resets allowed (None: unlimited).
        verbose: print each decision when true.
    """

    def __init__(self, driver, host_manager, reset_limit=None, verbose=False):
        self._driver = driver
        self._host_manager = host_manager
        self._reset_limit = reset_limit
        self._verbose = verbose
        self._reset_count = 0
        self._cond = threading.Condition()
        self._generation = 0
        self._size = 0
        self._states = {}
        self._answered = set()
        self._deciding = False

    # --- the driver's side ----------------------------------------------------------------

    def reset(self, size):
        """Start a new generation of ``size`` workers (the driver applied a new assignment)."""
        with self._cond:
            self._generation += 1
            self._size = size
            self._states = {}
            self._answered = set()
            self._cond.notify_all()

    def wake(self):
        """Wake every waiting worker (the driver stopped)."""
        with self._cond:
            self._cond.notify_all()

    @property
    def generation(self):
        with self._cond:
            return self._generation

    @property
    def deciding(self):
        """Whether a round is being decided (the driver may be waiting for new workers)."""
        with self._cond:
            return self._deciding

    @property
    def reset_count(self):
        return self._reset_count

    def size(self):
        with self._cond:
            return self._size

    def count(self, state):
        with self._cond:
            return sum(1 for s in self._states.values() if s == state)

    def get(self, state):
        with self._cond:
            return {slot for slot, s in self._states.items() if s == state}

    def get_recorded_slots(self):
        with self._cond:
            return set(self._states)

    # --- the workers' side ----------------------------------------------------------------

    def record_ready(self, host, slot):
        """Called for a worker asking for its rank; returns the generation it is answered in
        (its slot info is the driver's for that generation), or None when the job ended."""
        key = (host, slot)
        with self._cond:
            if self._driver.finished():
                return None
            if key not in self._answered and key not in self._states:
                self._answered.add(key)
                return self._generation
            generation = self._generation
            self._states[key] = READY
            decide = self._round_complete()
        if decide:
            self._decide()
        with self._cond:
            while self._generation == generation and not self._driver.finished():
                self._cond.wait(1.0)
            if self._driver.finished():
                return None
            self._answered.add(key)
            return self._generation

    def record_success(self, host, slot):
        self._record_exit(host, slot, SUCCESS)

    def record_failure(self, host, slot):
        self._record_exit(host, slot, FAILURE)

    def _record_exit(self, host, slot, state):
        with self._cond:
            if self._driver.finished():
                return
            self._states[(host, slot)] = state
            decide = self._round_complete()
        if decide:
            self._decide()

    def _round_complete(self):
        """Whether every slot of the generation recorded a state (call with the lock held);
        marks the decision as taken so that only one thread makes it."""
        if self._deciding or self._size == 0:
            return False
        assigned = self._driver.assigned_slots()
        if not assigned or not assigned <= set(self._states):
            return False
        self._deciding = True
        return True

    def _decide(self):
        try:
            self._decide_round()
        except Exception as e:
            self._driver.stop("%s (the elastic job stopped: the slots could not be assigned "
                              "again)" % e)
        finally:
            with self._cond:
                self._deciding = False
                self._cond.notify_all()

    def _decide_round(self):
        with self._cond:
            states = dict(self._states)
        assigned = self._driver.assigned_slots()
        states = {slot: state for slot, state in states.items() if slot in assigned}
        if any(state == SUCCESS for state in states.values()):
            self._say("a worker finished: the job is done")
            self._driver.stop()
            return
        failures = sorted(slot for slot, state in states.items() if state == FAILURE)
        if failures and len(failures) == len(states):
            self._driver.stop(self._failed_message(
                failures, "every worker failed (%s); the job cannot continue."
                % ", ".join("%s[%d]" % slot for slot in failures)))
            return
        for host in sorted({host for host, _ in failures}):
            self._say("blacklisting host %s after a worker failed there" % host)
            self._host_manager.blacklist(host)
        hosts = sorted({host for host, _ in states})
        all_blacklisted = all(self._host_manager.is_blacklisted(host) for host in hosts)
        # The reset limit comes first: it would end the job even with a host left (upstream
        # gives it as the reason whenever it is reached).
        if self._reset_limit is not None and self._reset_count >= self._reset_limit:
            self._driver.stop(self._reset_limit_message(failures, hosts, all_blacklisted))
            return
        if all_blacklisted:
            self._driver.stop(self._failed_message(
                failures, "every host of the job is blacklisted (%s); the job cannot continue."
                % ", ".join(hosts)))
            return
        self._reset_count += 1
        self._say("reset %d: assigning the slots again" % self._reset_count)
        self._driver.resume()

    def _exits(self, failures):
        """``[(timestamp, "<host>[<slot>]", rank, exit code)]`` of the failed workers in the order
        they exited (those without a recorded exit last)."""
        exits = []
        for host, slot in failures:
            code, timestamp = self._driver.worker_result(host, slot) or (1, float("inf"))
            rank = self._driver.get_slot_info(host, slot).rank
            exits.append((timestamp, "%s[%d]" % (host, slot), rank, describe_exit_code(code)))
        return sorted(exits)

    def _failed_message(self, failures, reason):
        """Upstream's message naming the first worker to exit non-zero, then ours: its host and
        rank, every failed worker's exit status and ``reason`` (why the job cannot go on)."""
        from horovod.runner.elastic import constants
        exits = self._exits(failures)
        _, name, rank, code = exits[0]
        return (constants.WORKER_FAILED_MESSAGE.format(name=name, code=code)
                + "Host: %s\nRank: %d\n" % (name.rpartition("[")[0], rank)
                + "Exit codes: %s\n" % ", ".join("%s (rank %d): %s" % (n, r, c)
                                                 for _, n, r, c in exits)
                + "Reason: " + reason)

    def _reset_limit_message(self, failures, hosts, all_blacklisted):
        """Upstream's reset-limit sentence, then why another reset was needed."""
        from horovod.runner.elastic import constants
        message = constants.RESET_LIMIT_EXCEEDED_MESSAGE.format(self._reset_limit)
        message += " The job was reset %d time%s; " % (
            self._reset_count, "" if self._reset_count == 1 else "s")
        if failures:
            message += "another reset was needed after %s." % ", ".join(
                "%s (rank %d) exited with status %s" % (name, rank, code)
                for _, name, rank, code in self._exits(failures))
            if all_blacklisted:
                message += " Every host of the job is blacklisted (%s)." % ", ".join(hosts)
        else:
            message += ("another reset was needed: every worker asked for a new rank (the hosts "
                        "changed, or a collective failed).")
        return message

    def _say(self, message):
        if self._verbose:
            print("horovodrun elastic: " + message, flush=True)
