"""The elastic driver's decisions and messages (runner.md §5.5), in one process: workers are
threads that ask for their rank, reset or exit as each test plans, without any process started.

The messages start with upstream Horovod's sentence, which job wrappers and tests match on.
"""

import threading
import time

import pytest

from horovod.runner.common.util.timeout import TimeoutException
from horovod.runner.elastic import constants
from horovod.runner.elastic import driver as driver_module
from horovod.runner.elastic.discovery import FixedHosts

UPSTREAM_FAILED = "Horovod detected that one or more processes exited with non-zero status"


class _Rendezvous:
    def init(self, slots):
        self.slots = list(slots)


@pytest.fixture(autouse=True)
def _fast_discovery(monkeypatch):
    monkeypatch.setattr(driver_module, "DISCOVER_HOSTS_FREQUENCY_SECS", 0.01)


def _run_job(host_slots, plan, min_num_proc=1, reset_limit=None):
    """Runs an elastic job of thread workers; ``plan[(host, slot)]`` lists what the worker does
    after its first rank, one entry per round: ``"reset"`` (asks for a new rank) or
    ``("fail", delay_s)`` (exits 1 after ``delay_s``); with the plan done it runs until stopped.
    Returns the driver's results."""
    driver = driver_module.ElasticDriver(_Rendezvous(), FixedHosts(host_slots), min_num_proc,
                                         None, timeout=10, reset_limit=reset_limit)

    def create_worker(slot_info, events):
        key = (slot_info.hostname, slot_info.local_rank)
        if driver.record_ready(*key) is None:
            return 0, time.time()
        for action in plan.get(key, []):
            if action == "reset":
                if driver.record_ready(*key) is None:
                    return 0, time.time()
            else:
                time.sleep(action[1])
                return 1, time.time()
        while not any(event.is_set() for event in events):
            time.sleep(0.01)
        return 143, time.time()

    try:
        driver.start(sum(host_slots.values()), create_worker)
        done = threading.Event()
        threading.Thread(target=lambda: (driver.get_results(), done.set()), daemon=True).start()
        assert done.wait(20), "the job did not end"
        return driver.get_results()
    finally:
        driver.stop()
        driver.wait_for_workers(10)


def test_every_worker_failed_gives_upstreams_message_then_the_workers():
    results = _run_job({"a": 1, "b": 1}, {("a", 0): [("fail", 0)], ("b", 0): [("fail", 0.2)]})
    message = results.error_message
    assert message.startswith(UPSTREAM_FAILED + ", thus causing the job to be terminated. The "
                              "first process to do so was:\nProcess name: a[0]\nExit code: 1\n"), \
        message
    assert "Host: a\nRank: 0\n" in message
    assert "a[0] (rank 0): 1, b[0] (rank 1): 1" in message
    assert message.endswith("Reason: every worker failed (a[0], b[0]); the job cannot "
                            "continue."), message


# b fails in the first round (b is blacklisted, one reset); in the second, a[0] fails and a[1]
# resets: a is blacklisted too, so every host of the job is.
TWO_ROUNDS = {("a", 0): ["reset", ("fail", 0)], ("a", 1): ["reset", "reset"],
              ("b", 0): [("fail", 0)]}


def test_every_host_blacklisted_gives_upstreams_message_then_the_hosts():
    results = _run_job({"a": 2, "b": 1}, TWO_ROUNDS)
    message = results.error_message
    assert message.startswith(UPSTREAM_FAILED), message
    assert "Process name: a[0]\nExit code: 1\nHost: a\nRank: 0\n" in message
    assert message.endswith("Reason: every host of the job is blacklisted (a); the job cannot "
                            "continue."), message


def test_reset_limit_is_the_reason_when_it_and_blacklisting_both_end_the_job():
    results = _run_job({"a": 2, "b": 1}, TWO_ROUNDS, reset_limit=1)
    message = results.error_message
    assert message.startswith(constants.RESET_LIMIT_EXCEEDED_MESSAGE.format(1)), message
    assert "reset 1 time; another reset was needed after a[0] (rank 0) exited with status 1" \
        in message
    assert message.endswith("Every host of the job is blacklisted (a).")


def test_reset_limit_without_failure():
    results = _run_job({"a": 1, "b": 1}, {("a", 0): ["reset"], ("b", 0): ["reset"]},
                       reset_limit=0)
    message = results.error_message
    assert message.startswith(
        "Job has been shutdown, as the number of elastic resets exceeded the --reset-limit of 0. "
        "The job was reset 0 times; another reset was needed: every worker asked for a new rank"), \
        message


def test_minimum_slots_timeout():
    driver = driver_module.ElasticDriver(_Rendezvous(), FixedHosts({"a": 1}), 2, None, timeout=1)
    try:
        with pytest.raises(TimeoutException) as raised:
            driver.wait_for_available_slots(2, min_hosts=2)
    finally:
        driver.stop()
    assert str(raised.value) == (
        "Timed out waiting for minimum number of slots to become available. Please check that "
        "you have enough resources to run at least 2 Horovod processes. After 1 s: 1 slot(s) "
        "available on 1 host(s), the job needs 2 slots on 2 hosts (detecting the network "
        "interfaces needs 2 hosts unless --network-interface is given). Check the hosts the "
        "discovery reports, or raise --elastic-timeout (seconds).")


def test_no_previous_host_left():
    discovery = FixedHosts({"a": 1})
    driver = driver_module.ElasticDriver(_Rendezvous(), discovery, 1, None, timeout=5)
    try:
        driver._update_host_assignments(driver.wait_for_available_slots(1))
        discovery.set({"b": 1})
        driver._host_manager.update_available_hosts()
        with pytest.raises(RuntimeError, match=r"^No hosts from previous set remaining, unable to "
                                               r"broadcast state\. The hosts were a, the next "
                                               r"ones would be b\.$"):
            driver._update_host_assignments(driver._host_manager.current_hosts)
    finally:
        driver.stop()


def _grow_during_reset(start_s, timeout):
    """Host a:1 runs; b:1 is listed, its worker takes ``start_s`` seconds (None: forever) to ask
    for its rank, and a's worker resets meanwhile. Returns ``(driver, times)``: ``times[key]``
    lists ``(event, monotonic time)``."""
    hosts = FixedHosts({"a": 1})
    driver = driver_module.ElasticDriver(_Rendezvous(), hosts, 1, None, timeout=timeout)
    times = {("a", 0): [], ("b", 0): []}
    listed = threading.Event()
    done = threading.Event()

    def create_worker(slot_info, events):
        key = (slot_info.hostname, slot_info.local_rank)
        log = times[key]
        if key == ("b", 0):
            deadline = time.monotonic() + (3600 if start_s is None else start_s)
            while time.monotonic() < deadline and not any(e.is_set() for e in events):
                time.sleep(0.01)
            if any(event.is_set() for event in events):
                return 143, time.time()
            log.append(("asked", time.monotonic()))
        log.append(("answered %s" % driver.record_ready(*key), time.monotonic()))
        if key == ("a", 0):
            listed.wait(10)
            time.sleep(0.3)  # the discovery has seen b and started its worker
            log.append(("reset", time.monotonic()))
            log.append(("answered %s" % driver.record_ready(*key), time.monotonic()))
            done.set()
        while not any(event.is_set() for event in events):
            time.sleep(0.01)
        return 143, time.time()

    driver.start(1, create_worker)
    hosts.set({"a": 1, "b": 1})
    listed.set()
    assert done.wait(timeout + 15), times
    return driver, times


def test_reset_waits_for_the_new_workers_to_ask_for_their_rank():
    """A round decided while a new slot's worker still starts: the generation is assigned once
    that worker asks for its rank, not before (the others would wait for it in the engine's
    rendezvous, whose 30 s Gloo timeout a slow start on a busy machine exceeds)."""
    driver, times = _grow_during_reset(start_s=1.5, timeout=30)
    try:
        assert [e for e, _ in times[("a", 0)]] == ["answered 1", "reset", "answered 2"], times
        b_asked = dict(times[("b", 0)]).get("asked")
        assert b_asked is not None and dict(times[("a", 0)])["answered 2"] >= b_asked, times
        assert set(driver.host_assignments) == {"a", "b"}
    finally:
        driver.stop()
        driver.wait_for_workers(10)


def test_new_worker_that_never_asks_blacklists_its_host_at_the_reset():
    driver, times = _grow_during_reset(start_s=None, timeout=1)
    try:
        assert [e for e, _ in times[("a", 0)]] == ["answered 1", "reset", "answered 2"], times
        assert driver._host_manager.is_blacklisted("b")
        assert set(driver.host_assignments) == {"a"}
    finally:
        driver.stop()
        driver.wait_for_workers(10)
