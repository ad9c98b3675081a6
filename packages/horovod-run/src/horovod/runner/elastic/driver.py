"""The elastic driver: discovers hosts, assigns slots, starts workers and decides resets
(runner.md §5.5)."""

import collections
import os
import sys
import threading
import time

from horovod.runner.common.util import hosts as hosts_util
from horovod.runner.common.util import timeout as timeout_util
from horovod.runner.elastic import constants
from horovod.runner.elastic.discovery import HostManager
from horovod.runner.elastic.registration import WorkerStateRegistry
from horovod.runner.elastic.worker import HostUpdateResult, WorkerNotificationClient
from horovod.runner.common.util import env_names

DISCOVER_HOSTS_FREQUENCY_SECS = 1.0
# Rank 0 is told again when the hosts still differ from the assignment this long after it was
# told: a notice that reaches it during a reset is dropped with the reset's queued notices.
RENOTIFY_SECS = 10.0
ELASTIC_TIMEOUT_SECS = 600


class Results:
    """What an elastic job ended with: ``error_message`` (None on success) and
    ``worker_results`` (``{"<host>[<local_rank>]": (exit_code, timestamp)}``)."""

    def __init__(self, error_message, worker_results):
        self.error_message = error_message
        self.worker_results = worker_results


class ResultsRecorder:
    def __init__(self):
        self._error_message = None
        self._worker_results = {}
        self._done = threading.Event()
        self._lock = threading.Lock()

    def expect(self, worker_names):
        """Forget the results of workers that are not in ``worker_names`` (a new round)."""
        with self._lock:
            self._worker_results = {name: result for name, result in self._worker_results.items()
                                    if name in worker_names}

    def set_error_message(self, error_message):
        with self._lock:
            if self._error_message is None:
                self._error_message = error_message

    def add_result(self, key, value):
        with self._lock:
            self._worker_results[key] = value

    def get_result(self, key):
        with self._lock:
            return self._worker_results.get(key)

    def finish(self):
        self._done.set()

    def get_results(self):
        self._done.wait()
        with self._lock:
            return Results(self._error_message, dict(self._worker_results))


class ElasticDriver:
    """Drives an elastic job.

    Args:
        rendezvous: the :class:`~horovod.runner.http.http_server.RendezvousServer` (started).
        discovery: a :class:`~horovod.runner.elastic.discovery.HostDiscovery`.
        min_num_proc, max_num_proc: the fewest workers to train with, and the most (None: as
            many as there are slots).
        timeout: seconds to wait for ``min_num_proc`` slots (default: env
            ``HOROVOD_ELASTIC_TIMEOUT`` or ``ELASTIC_TIMEOUT_SECS``).
        reset_limit: the most resets (None: unlimited).
        cooldown_range: ``(lo, hi)`` seconds of blacklist cooldown, or None (permanent).
        verbose: print what the driver does when >= 1.

    Standby workers: when the discovery adds slots to a running job, their workers are started
    at once, while the current workers go on training. A standby worker asks for its rank like
    any other (:meth:`record_ready`) and waits there; rank 0 is told that the hosts changed once
    every standby worker waits, so the reset round finds the new workers started and the time
    they take to start (a Python process importing its framework: seconds, a minute on a busy
    machine) does not stop the training. A standby worker whose slot is not in the next
    generation is answered "removed" and exits; one that exits non-zero before its round
    blacklists its host.

    A generation never includes a slot whose worker does not wait for its rank: a reset
    (:meth:`resume`) that assigns new slots (a round decided for another reason while standby
    workers still start, hosts both added and removed) starts their workers as standby workers
    and waits for them first, up to the elastic timeout. Otherwise the workers answered first
    would wait for the late ones in the engine's rendezvous, bounded only by the Gloo timeout
    (30 s), and every worker of the generation would fail when a start takes longer.
    """

    def __init__(self, rendezvous, discovery, min_num_proc, max_num_proc, timeout=None,
                 reset_limit=None, cooldown_range=None, verbose=0):
        self._rendezvous = rendezvous
        self._host_manager = HostManager(discovery, cooldown_range)
        self._min_num_proc = min_num_proc
        self._max_num_proc = max_num_proc
        self._timeout = timeout or int(os.environ.get(env_names.ELASTIC_TIMEOUT,
                                                      ELASTIC_TIMEOUT_SECS))
        self._verbose = verbose
        self._worker_registry = WorkerStateRegistry(self, self._host_manager, reset_limit,
                                                    verbose=verbose)
        self._results = ResultsRecorder()
        self._shutdown = threading.Event()
        self._wait_hosts_cond = threading.Condition()
        self._assignment_lock = threading.RLock()
        self._host_assignments = {}
        self._slot_infos = {}
        self._world_size = 0
        self._worker_clients = {}
        self._alive = set()
        self._create_worker_fn = None
        self._notified_generation = 0
        self._notified_at = 0.0
        self._notify_lock = threading.Lock()
        # Standby workers: (host, local_rank) -> the planned SlotInfo, and those that wait.
        self._standby = {}
        self._standby_waiting = set()
        self._standby_cond = threading.Condition(self._assignment_lock)
        self._discovery_error = None
        self._first_discovery = threading.Event()
        self._discovery_thread = threading.Thread(target=self._discover_hosts,
                                                  name="horovod-elastic-discovery", daemon=True)
        self._discovery_thread.start()

    # --- discovery ------------------------------------------------------------------------

    def _discover_hosts(self):
        first = True
        while not self._shutdown.is_set():
            with self._wait_hosts_cond:
                try:
                    update_res = self._host_manager.update_available_hosts()
                except Exception as e:
                    if first:
                        self._discovery_error = e
                        self.stop(str(e))
                        self._first_discovery.set()
                        raise
                    print("horovodrun elastic: host discovery failed (retrying): %s" % e,
                          file=sys.stderr, flush=True)
                    update_res = HostUpdateResult.no_update
                for host in self._host_manager.forgotten:
                    self._say("host %s is no longer listed: removed, not faulty; its blacklisting "
                              "ends" % host)
                if update_res != HostUpdateResult.no_update:
                    self._say("hosts changed (%s): %s" % (
                        update_res.name if update_res.name else int(update_res),
                        self._host_manager.current_hosts.host_slots))
                    self._wait_hosts_cond.notify_all()
            self._notify_workers_host_changes(self._host_manager.current_hosts)
            first = False
            self._first_discovery.set()
            self._shutdown.wait(DISCOVER_HOSTS_FREQUENCY_SECS)

    def _notify_workers_host_changes(self, current_hosts):
        """Tell the rank-0 worker when the hosts would be assigned differently (and enough
        slots exist): once per generation, and again every ``RENOTIFY_SECS`` while the
        generation lasts; when slots were only added, start their workers first (standby) and
        tell rank 0 once they wait."""
        with self._notify_lock:
            self._notify_host_changes_locked(current_hosts)

    def _notify_host_changes_locked(self, current_hosts):
        generation = self._worker_registry.generation
        if not self._host_assignments or self._worker_registry.deciding:
            return  # (a reset under way assigns the hosts anew)
        if (self._notified_generation == generation
                and time.monotonic() - self._notified_at < RENOTIFY_SECS):
            return
        if current_hosts.count_available_slots() < self._min_num_proc:
            return
        try:
            planned = self._plan(current_hosts)
        except (ValueError, RuntimeError):
            return
        with self._assignment_lock:
            current = {(s.hostname, s.local_rank) for s in self._slot_infos.values()}
        if {(s.hostname, s.local_rank) for s in planned} == current:
            return
        update_res = HostUpdateResult.no_update
        if any((s.hostname, s.local_rank) not in current for s in planned):
            update_res |= HostUpdateResult.added
        if any(slot not in {(s.hostname, s.local_rank) for s in planned} for slot in current):
            update_res |= HostUpdateResult.removed
        if update_res == HostUpdateResult.added and not self._standby_started(
                [s for s in planned if (s.hostname, s.local_rank) not in current]):
            return  # tried again when a standby worker waits, and at the next poll
        try:
            coordinator = self.get_coordinator_info()
            client = self.get_worker_client(coordinator) if coordinator else None
            if client is None:
                return  # rank 0 has not registered yet; tried again at the next poll
            client.notify_hosts_updated(int(time.time() * 1000), update_res)
            self._notified_generation = generation
            self._notified_at = time.monotonic()
            self._say("told rank 0 that the hosts changed")
        except Exception as e:
            self._say("could not notify rank 0 (retrying): %s" % e)

    # --- standby workers ---------------------------------------------------------------------

    def _standby_started(self, added):
        """Start the workers of the ``added`` slots that have none; return whether every one of
        them waits for its round."""
        if self._create_worker_fn is None or self._shutdown.is_set():
            return True
        started = []
        with self._assignment_lock:
            for slot in added:
                key = (slot.hostname, slot.local_rank)
                if key in self._alive:
                    continue
                self._alive.add(key)
                self._standby[key] = slot
                started.append(slot)
            waiting = all((s.hostname, s.local_rank) in self._standby_waiting for s in added)
        for slot in started:
            self._say("starting a standby worker on %s[%d]" % (slot.hostname, slot.local_rank))
            self._start_worker_thread(slot)
        return waiting

    def _wait_standby(self, host, slot):
        """Called for a standby worker asking for its rank: wait until the next generation is
        assigned; return whether the worker has a slot in it."""
        key = (host, slot)
        with self._standby_cond:
            if key not in self._standby:
                return False
            self._standby_waiting.add(key)
            self._standby_cond.notify_all()  # a reset may wait for it (_wait_for_workers_of)
            all_waiting = set(self._standby) <= self._standby_waiting
        if all_waiting:
            self._say("every standby worker waits: telling rank 0")
            self._notify_workers_host_changes(self._host_manager.current_hosts)
        with self._standby_cond:
            while key in self._standby and not self._shutdown.is_set():
                self._standby_cond.wait(1.0)
        return not self._shutdown.is_set() and self.has_rank_assignment(host, slot)

    def _release_standby(self):
        """A new generation is set up: answer every waiting standby worker."""
        with self._standby_cond:
            self._standby.clear()
            self._standby_waiting.clear()
            self._standby_cond.notify_all()

    # --- assignment and workers ------------------------------------------------------------

    def wait_for_available_slots(self, min_num_proc, min_hosts=1):
        """Block until ``min_num_proc`` slots on ``min_hosts`` hosts are available; return the
        current :class:`DiscoveredHosts`.

        Raises ``TimeoutException`` after the elastic timeout, naming the count waited for, and
        ``RuntimeError`` when the driver stopped meanwhile.
        """
        self._first_discovery.wait(self._timeout)
        deadline = time.monotonic() + self._timeout
        with self._wait_hosts_cond:
            while True:
                current = self._host_manager.current_hosts
                available = current.count_available_slots()
                hosts = len(current.available_hosts)
                if available >= min_num_proc and hosts >= min_hosts:
                    return current
                if self._shutdown.is_set():
                    raise RuntimeError(constants.SHUTDOWN_MESSAGE)
                left = deadline - time.monotonic()
                if left <= 0:
                    needs = "%d slots" % min_num_proc
                    if min_hosts > 1:
                        needs += (" on %d hosts (detecting the network interfaces needs 2 hosts "
                                  "unless --network-interface is given)" % min_hosts)
                    raise timeout_util.TimeoutException(
                        constants.MIN_SLOTS_TIMEOUT_MESSAGE.format(min_num_proc)
                        + " After %d s: %d slot(s) available on %d host(s), the job needs %s. "
                          "Check the hosts the discovery reports, or raise --elastic-timeout "
                          "(seconds)." % (self._timeout, available, hosts, needs))
                self._wait_hosts_cond.wait(min(1.0, max(left, 0.05)))

    def _plan(self, current_hosts):
        host_list = [hosts_util.HostInfo(host, current_hosts.get_slots(host))
                     for host in current_hosts.host_assignment_order]
        return hosts_util.get_host_assignments(host_list, self._min_num_proc,
                                               self._max_num_proc)

    def _update_host_assignments(self, current_hosts):
        """Assign the slots of ``current_hosts``; return the slots that need a new worker."""
        slots = self._plan(current_hosts)
        with self._assignment_lock:
            previous_hosts = set(self._host_assignments)
            new_hosts = {slot.hostname for slot in slots}
            if previous_hosts and not previous_hosts & new_hosts:
                raise RuntimeError("%s The hosts were %s, the next ones would be %s." % (
                    constants.NO_PREVIOUS_HOSTS_MESSAGE, ", ".join(sorted(previous_hosts)),
                    ", ".join(sorted(new_hosts))))
            assignments = collections.defaultdict(list)
            for slot in slots:
                assignments[slot.hostname].append(slot)
            self._host_assignments = dict(assignments)
            self._slot_infos = {(slot.hostname, slot.local_rank): slot for slot in slots}
            self._world_size = len(slots)
            pending = [slot for slot in slots
                       if (slot.hostname, slot.local_rank) not in self._alive]
        self._rendezvous.init(slots)
        self._results.expect({"%s[%d]" % (s.hostname, s.local_rank) for s in slots})
        self._worker_registry.reset(len(slots))
        # After the registry's reset: a standby worker is answered in the new generation.
        self._release_standby()
        self._say("generation %d: %s" % (
            self._worker_registry.generation,
            ", ".join("%s:%d" % (h, len(v)) for h, v in self._host_assignments.items())))
        return pending

    def start(self, num_proc, create_worker_fn):
        """Wait for ``num_proc`` slots, assign up to ``max_num_proc`` and start their workers;
        ``create_worker_fn(slot_info, events) -> (exit_code, timestamp)`` runs one worker."""
        self._create_worker_fn = create_worker_fn
        self._activate_workers(num_proc)

    def resume(self):
        """Assign the slots again (at least ``min_num_proc``); the workers of new slots are
        started first, and the new generation is assigned once they wait for their rank."""
        self._activate_workers(self._min_num_proc, resuming=True)

    def _activate_workers(self, min_num_proc, resuming=False):
        while True:
            current_hosts = self.wait_for_available_slots(min_num_proc)
            if not resuming or self._wait_for_workers_of(self._plan(current_hosts)):
                break
        pending = self._update_host_assignments(current_hosts)
        for slot in pending:
            with self._assignment_lock:
                self._alive.add((slot.hostname, slot.local_rank))
            self._start_worker_thread(slot)

    def _wait_for_workers_of(self, slots):
        """Before a reset assigns ``slots``: start standby workers for the new slots (those not
        in the current generation) and wait until each of them waits for its rank. Returns True
        then; False when the slots must be planned again because a host was blacklisted
        meanwhile: a standby worker exited non-zero, a worker of the current generation exited,
        or a new worker did not ask for its rank within the elastic timeout. Raises RuntimeError
        when the job stopped."""
        with self._assignment_lock:
            previous = set(self._slot_infos)
        old = [(s.hostname, s.local_rank) for s in slots if (s.hostname, s.local_rank) in previous]
        new = [slot for slot in slots if (slot.hostname, slot.local_rank) not in previous]
        if not new:
            return True
        deadline = time.monotonic() + self._timeout
        said = False
        while True:
            # (Re)starts the standby workers that have none: also one whose slot had a worker of
            # an earlier generation that was still leaving.
            if self._standby_started(new):
                return True
            with self._standby_cond:
                if self._shutdown.is_set():
                    raise RuntimeError(constants.SHUTDOWN_MESSAGE)
                if any(self._host_manager.is_blacklisted(s.hostname) for s in new):
                    return False  # a standby worker failed: _run_worker blacklisted its host
                gone = sorted({host for host, slot in old if (host, slot) not in self._alive})
                late = [(s.hostname, s.local_rank) for s in new
                        if (s.hostname, s.local_rank) not in self._standby_waiting]
                if gone or time.monotonic() >= deadline:
                    break
                if not said:
                    self._say("waiting for the new workers %s to ask for their rank"
                              % ", ".join("%s[%d]" % key for key in late))
                    said = True
                self._standby_cond.wait(min(1.0, max(deadline - time.monotonic(), 0.05)))
        if gone:
            for host in gone:
                self._say("blacklisting host %s: a worker there exited during the reset" % host)
                self._host_manager.blacklist(host)
        else:
            for host in sorted({host for host, _ in late}):
                self._say("blacklisting host %s: its new workers did not ask for their rank "
                          "within %d s" % (host, self._timeout))
                self._host_manager.blacklist(host)
        return False

    def _start_worker_thread(self, slot):
        threading.Thread(target=self._run_worker, args=(slot,), daemon=True,
                         name="horovod-elastic-%s-%d" % (slot.hostname, slot.local_rank)).start()

    def _run_worker(self, slot_info):
        key = (slot_info.hostname, slot_info.local_rank)
        events = [self._shutdown, self._host_manager.get_host_event(slot_info.hostname)]
        try:
            exit_code, timestamp = self._create_worker_fn(slot_info, events)
        except Exception as e:
            self._say("worker %s[%d] could not run: %s" % (key + (e,)))
            exit_code, timestamp = 1, time.time()
        with self._standby_cond:
            self._alive.discard(key)
            standby = self._standby.pop(key, None) is not None
            self._standby_waiting.discard(key)
            self._standby_cond.notify_all()
        if (standby and exit_code != 0 and not self._shutdown.is_set()
                and key[0] in self._host_manager.current_hosts.available_hosts):
            self._say("standby worker %s[%d] exited with %s before its round: blacklisting %s"
                      % (key + (exit_code, key[0])))
            self._host_manager.blacklist(key[0])
        self._handle_worker_exit(slot_info, exit_code, timestamp)

    def _handle_worker_exit(self, slot_info, exit_code, timestamp):
        host, slot = slot_info.hostname, slot_info.local_rank
        if not self.has_rank_assignment(host, slot):
            return  # its slot was removed: it was told to leave
        self._results.add_result("%s[%d]" % (host, slot), (exit_code, timestamp))
        if exit_code == 0:
            self._worker_registry.record_success(host, slot)
        else:
            self._worker_registry.record_failure(host, slot)

    def stop(self, error_message=None):
        """End the job (with ``error_message`` when it failed); workers are stopped."""
        if error_message:
            self._results.set_error_message(error_message)
        self._shutdown.set()
        with self._wait_hosts_cond:
            self._wait_hosts_cond.notify_all()
        with self._standby_cond:
            self._standby_cond.notify_all()
        self._worker_registry.wake()
        self._results.finish()

    def finished(self):
        return self._shutdown.is_set()

    def get_results(self):
        """Block until the job ended; return its :class:`Results`."""
        return self._results.get_results()

    def wait_for_workers(self, timeout_s=30):
        """Wait up to ``timeout_s`` seconds for every worker process to have exited."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._assignment_lock:
                if not self._alive:
                    return
            time.sleep(0.05)

    # --- the workers' requests -------------------------------------------------------------

    def register_worker_server(self, host, slot, addresses, secret_key):
        self._worker_clients[(host, slot)] = (addresses, secret_key)

    def get_worker_client(self, slot_info):
        entry = self._worker_clients.get((slot_info.hostname, slot_info.local_rank))
        if entry is None:
            return None
        addresses, key = entry
        return WorkerNotificationClient(addresses, key, self._verbose)

    def record_ready(self, host, slot):
        """Block until the round of ``host``'s worker ``slot`` is decided; return the
        generation it is answered in, or None (its slot was removed, or the job ended)."""
        if not self.has_rank_assignment(host, slot) and not self._wait_standby(host, slot):
            return None
        generation = self._worker_registry.record_ready(host, slot)
        if generation is None or not self.has_rank_assignment(host, slot):
            return None
        return generation

    def worker_result(self, host, slot):
        """``(exit_code, timestamp)`` of the exit of ``host``'s worker ``slot`` in the current
        round, or None."""
        return self._results.get_result("%s[%d]" % (host, slot))

    def assigned_slots(self):
        with self._assignment_lock:
            return set(self._slot_infos)

    def world_size(self):
        with self._assignment_lock:
            return self._world_size

    def local_size(self, host):
        with self._assignment_lock:
            return len(self._host_assignments.get(host, []))

    def get_slot_info(self, host, slot):
        if self._host_manager.is_blacklisted(host) and not self.has_rank_assignment(host, slot):
            return hosts_util.INVALID_SLOT_INFO
        with self._assignment_lock:
            return self._slot_infos.get((host, slot), hosts_util.INVALID_SLOT_INFO)

    def get_coordinator_info(self):
        with self._assignment_lock:
            for slot in self._slot_infos.values():
                if slot.rank == 0:
                    return slot
        return None

    def has_rank_assignment(self, host, slot):
        with self._assignment_lock:
            return (host, slot) in self._slot_infos

    @property
    def host_assignments(self):
        with self._assignment_lock:
            return dict(self._host_assignments)

    def _say(self, message):
        if self._verbose:
            print("horovodrun elastic: " + message, flush=True)
