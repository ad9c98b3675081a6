"""Which hosts an elastic job may use, and which of them are blacklisted (runner.md §5.5)."""

import collections
import random
import subprocess
import threading
import time

from horovod.runner.elastic.worker import HostUpdateResult

DEFAULT_COOLDOWN_LOWER_LIMIT_SECONDS = 1
DEFAULT_COOLDOWN_UPPER_LIMIT_SECONDS = 3600


class HostDiscovery:
    """Finds the hosts available to the job."""

    def find_available_hosts_and_slots(self):
        """``{hostname: slots}`` of the hosts available now."""
        raise NotImplementedError()


class HostDiscoveryScript(HostDiscovery):
    """Runs ``discovery_script`` (an executable or a shell command line) and parses the unique
    non-empty lines it prints, ``host`` or ``host:slots``; ``slots`` is the default slot count.

    Raises ``RuntimeError`` naming the script and its exit status when it fails.
    """

    TIMEOUT_S = 60

    def __init__(self, discovery_script, slots):
        self._discovery_script = discovery_script
        self._default_slots = slots

    def _execute_discovery_script(self):
        try:
            result = subprocess.run(self._discovery_script, shell=True, capture_output=True,
                                    text=True, stdin=subprocess.DEVNULL, timeout=self.TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise RuntimeError("Failed to execute discovery script: %s (no answer within %d s)"
                               % (self._discovery_script, self.TIMEOUT_S)) from None
        if result.returncode != 0:
            raise RuntimeError("Failed to execute discovery script: %s. Exit code: %d%s"
                               % (self._discovery_script, result.returncode,
                                  (": " + result.stderr.strip()) if result.stderr.strip() else ""))
        return result.stdout

    def find_available_hosts_and_slots(self):
        host_slots = {}
        for line in self._execute_discovery_script().splitlines():
            line = line.strip()
            if not line:
                continue
            host, sep, slots = line.rpartition(":")
            if not sep:
                host, slots = line, self._default_slots
                if slots is None:
                    raise RuntimeError("discovery script %s printed host %r without :<slots> and "
                                       "--slots-per-host is not set"
                                       % (self._discovery_script, line))
            try:
                host_slots[host] = int(slots)
            except ValueError:
                raise RuntimeError("discovery script %s printed %r; expected <host> or "
                                   "<host>:<slots>" % (self._discovery_script, line)) from None
        return host_slots


class FixedHosts(HostDiscovery):
    """A fixed ``{host: slots}`` (``horovodrun -H`` in elastic mode); :meth:`set` changes it."""

    def __init__(self, host_slots):
        self.set(host_slots)

    def set(self, host_slots):
        self._host_slots = dict(host_slots)

    def find_available_hosts_and_slots(self):
        return dict(self._host_slots)


class HostState:
    """Blacklisting of one host: permanent without ``cooldown_range``, else for a cooldown of
    ``clamp(lo * 2**c + U(0, 1) * lo, lo, hi)`` seconds after the ``c``-th blacklisting."""

    def __init__(self, cooldown_range=None):
        self._event = threading.Event()
        self._blacklisted = False
        self._blacklist_count = 0
        self._cooldown_range = cooldown_range
        self._cooldown_until = None

    def get_event(self):
        """Set when the host is blacklisted: its workers are then stopped."""
        return self._event

    def set_event(self):
        self._event.set()

    def blacklist(self):
        self._blacklisted = True
        self._blacklist_count += 1
        if self._cooldown_range:
            lo, hi = self._cooldown_range
            delay = lo * (2 ** self._blacklist_count) + random.uniform(0, 1) * lo
            self._cooldown_until = time.monotonic() + max(lo, min(hi, delay))
        self._event.set()

    def whitelist(self):
        self._blacklisted = False
        self._cooldown_until = None
        self._event = threading.Event()

    def is_blacklisted(self):
        return self._blacklisted

    def is_resurrected(self):
        """True once a cooldown has passed (the host may be used again)."""
        return (self._blacklisted and self._cooldown_until is not None
                and time.monotonic() >= self._cooldown_until)


class DiscoveredHosts:
    """The usable hosts: ``host_slots`` ({host: slots}) and their ``host_assignment_order``."""

    def __init__(self, host_slots, host_assignment_order):
        self.host_slots = dict(host_slots)
        self.host_assignment_order = list(host_assignment_order)

    @property
    def available_hosts(self):
        return set(self.host_assignment_order)

    def get_slots(self, host):
        return self.host_slots.get(host, 0)

    def count_available_slots(self):
        return sum(self.get_slots(host) for host in self.host_assignment_order)

    def without(self, host):
        return DiscoveredHosts({h: s for h, s in self.host_slots.items() if h != host},
                               [h for h in self.host_assignment_order if h != host])


class HostManager:
    """Tracks the discovered hosts and the blacklist.

    Args:
        discovery: a :class:`HostDiscovery`.
        cooldown_range: ``(lo, hi)`` seconds with 1 <= lo <= hi <= 3600, or None for permanent
            blacklisting. Raises ``ValueError`` otherwise.
    """

    def __init__(self, discovery, cooldown_range=None):
        if cooldown_range is not None:
            lo, hi = cooldown_range
            if not (DEFAULT_COOLDOWN_LOWER_LIMIT_SECONDS <= lo <= hi
                    <= DEFAULT_COOLDOWN_UPPER_LIMIT_SECONDS):
                raise ValueError("the blacklist cooldown range must satisfy %d <= lower <= upper "
                                 "<= %d seconds, got %s"
                                 % (DEFAULT_COOLDOWN_LOWER_LIMIT_SECONDS,
                                    DEFAULT_COOLDOWN_UPPER_LIMIT_SECONDS, list(cooldown_range)))
        self._discovery = discovery
        self._cooldown_range = cooldown_range
        self._hosts_state = collections.defaultdict(lambda: HostState(cooldown_range))
        self._current_hosts = DiscoveredHosts({}, [])
        self._lock = threading.RLock()
        self.forgotten = []  # blacklisted hosts the last discovery run no longer listed

    @property
    def current_hosts(self):
        with self._lock:
            return self._current_hosts

    def update_available_hosts(self):
        """Run the discovery once; return the :class:`HostUpdateResult` against the last run.

        A host that disappeared or lost slots counts as removed; a new host, more slots, or a
        host whose cooldown expired counts as added. A blacklisted host that the discovery no
        longer lists was removed, not faulty (a Kubernetes pod deleted, whose processes die
        before its discovery entry goes): its blacklisting ends, and listed again it is a new
        host (:attr:`forgotten` lists those of this run). A host that stays listed stays
        blacklisted. Raises what the discovery raises.
        """
        found = self._discovery.find_available_hosts_and_slots()
        with self._lock:
            self.forgotten = []
            for host, state in self._hosts_state.items():
                if host not in found and state.is_blacklisted():
                    state.whitelist()
                    self.forgotten.append(host)
            previous = self._current_hosts
            usable = {}
            for host, slots in found.items():
                state = self._hosts_state[host]
                if state.is_resurrected():
                    state.whitelist()
                if not state.is_blacklisted():
                    usable[host] = slots
            order = self.order_available_hosts(list(usable), previous.host_assignment_order)
            self._current_hosts = DiscoveredHosts(usable, order)
            result = HostUpdateResult.no_update
            for host in previous.host_assignment_order:
                if usable.get(host, 0) < previous.get_slots(host):
                    result |= HostUpdateResult.removed
            for host, slots in usable.items():
                if slots > previous.get_slots(host):
                    result |= HostUpdateResult.added
            return result

    def blacklist(self, host):
        """Stop using ``host`` (permanently, or until its cooldown); its workers are stopped."""
        with self._lock:
            if not self._hosts_state[host].is_blacklisted():
                self._hosts_state[host].blacklist()
            self._current_hosts = self._current_hosts.without(host)

    def is_blacklisted(self, host):
        with self._lock:
            return self._hosts_state[host].is_blacklisted()

    def get_host_event(self, host):
        with self._lock:
            return self._hosts_state[host].get_event()

    @staticmethod
    def order_available_hosts(available_hosts, prev_host_assignment_order):
        """The previous order of the hosts still available, then the new ones (in the order
        ``available_hosts`` lists them: the discovery's, or sorted for a set), so that older
        hosts keep the lower ranks and rank 0 holds the latest committed state."""
        kept = [host for host in prev_host_assignment_order if host in available_hosts]
        new = available_hosts if not isinstance(available_hosts, (set, frozenset)) else sorted(
            available_hosts)
        return kept + [host for host in new if host not in kept]
