"""Deadlock detection (HOROVOD_DEADLOCK_TIMEOUT_SECONDS, docs/engine.md): when every rank of a
process set waits on operations the others never submit, every waiting call raises
HorovodInternalError naming what each rank waits on, soon after the timeout, and the ranks go on
with correct collectives; a rank that is slow but correct (busy, not waiting) never trips it. One
user name submitted as different collectives is a mismatch, reported without waiting for the
timeout."""

import socket
import time

import numpy as np
import pytest

from horovod_testing import run_ranks

TIMEOUT_S = 2.0
ENV = {"HOROVOD_DEADLOCK_TIMEOUT_SECONDS": str(TIMEOUT_S)}


def _allreduce(ops, name, value, set_id):
    x = np.array(value, np.float64)
    ops.wait(ops.allreduce_async([x], [x], [name], 1, process_set_id=set_id))  # Sum
    return x


def _diverge(scenario, on_subset, warm_up_steps):
    """Runs `scenario` on the set (global, or ranks {0, 1} of the job), then correct allreduces on
    that set and on the global set. Returns (error message or None, seconds until it came, the
    correct results)."""
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics
    from horovod.common.exceptions import HorovodInternalError
    from horovod.common.process_sets import ProcessSet
    basics = HorovodBasics()
    subset = ProcessSet([0, 1])
    basics.init(process_sets=[subset] if on_subset else None)
    rank = basics.rank()
    member = not on_subset or rank in (0, 1)
    set_id = subset.process_set_id if on_subset else 0
    set_rank = rank  # set {0, 1} holds global ranks 0 and 1 at set ranks 0 and 1

    message, elapsed = None, None
    if member:
        for step in range(warm_up_steps):  # afterwards the tensors are in the response cache
            _allreduce(ops, "allreduce.a", [step], set_id)
            _allreduce(ops, "allreduce.b", [step], set_id)
        start = time.monotonic()
        try:
            if scenario == "operation":
                x = np.full(3, rank, np.float32)
                if set_rank == 0:
                    ops.wait(ops.allreduce_async([x], [x], ["allreduce.m"], 1, process_set_id=set_id))
                else:
                    ops.wait(ops.allgather_async([x], ["allgather.m"], process_set_id=set_id))
            else:  # one rank runs a tensor the others skip
                if set_rank == 0:
                    _allreduce(ops, "allreduce.a", [1.0], set_id)
                _allreduce(ops, "allreduce.b", [1.0], set_id)
        except HorovodInternalError as e:
            message, elapsed = str(e), time.monotonic() - start
    # The process goes on: a correct collective on the set, then on the global set.
    results = []
    if member:
        results.append(_allreduce(ops, "allreduce.after", [rank, 10.0 * rank], set_id).tolist())
    results.append(_allreduce(ops, "allreduce.global", [rank + 1.0], 0).tolist())
    basics.shutdown()
    return message, elapsed, results


def _expected_results(np_, on_subset, rank):
    members = [0, 1] if on_subset else list(range(np_))
    results = []
    if rank in members:
        results.append(np.sum([[r, 10.0 * r] for r in members], axis=0).tolist())
    results.append([float(np.sum([r + 1.0 for r in range(np_)]))])
    return results


@pytest.mark.parametrize("np_,on_subset", [(2, False), (3, False), (3, True)], ids=["np2", "np3", "np3-set"])
@pytest.mark.parametrize("scenario,warm_up_steps", [("operation", 0), ("skip", 0), ("skip", 3)],
                         ids=["operation", "skip", "skip-cached"])
def test_deadlock_raises_on_every_waiting_rank_then_goes_on(np_, on_subset, scenario, warm_up_steps):
    start = time.monotonic()
    results = run_ranks(np_, _diverge, scenario, on_subset, warm_up_steps, env=ENV, timeout=120)
    assert time.monotonic() - start < 120
    members = [0, 1] if on_subset else list(range(np_))
    for rank, (message, elapsed, values) in enumerate(results):
        assert values == _expected_results(np_, on_subset, rank), (rank, values)
        if rank not in members:
            assert message is None
            continue
        assert message is not None, f"rank {rank} did not raise"
        set_id = 1 if on_subset else 0
        host = f"(host {socket.gethostname()})"  # every rank is named with its host: this machine
        if scenario == "operation":
            # One user name as two collectives: a mismatch as soon as every rank waits, without
            # waiting for the timeout (allowing for a loaded machine).
            assert elapsed < 10 * TIMEOUT_S + 20, (rank, elapsed)
            assert (f"Mismatched operations: the ranks of process set {set_id} submitted the name 'm' as different "
                    f"collectives: rank 0 {host} submitted ALLREDUCE allreduce.m") in message, message
            for other in members[1:]:
                assert f"rank {other} {host} submitted ALLGATHER allgather.m" in message, message
        else:
            # Not before the timeout; well before anything else would end it (the cached tensors
            # are sent to the coordinator after half the timeout first).
            assert TIMEOUT_S <= elapsed < 10 * TIMEOUT_S + 20, (rank, elapsed)
            assert f"Deadlock: every rank of process set {set_id} has waited" in message, message
            assert "HOROVOD_DEADLOCK_TIMEOUT_SECONDS" in message, message
            assert f"rank 0 {host} waits on allreduce.a (ALLREDUCE, not submitted by rank" in message, message
            for other in members[1:]:
                assert f"rank {other} {host} waits on allreduce.b (ALLREDUCE, not submitted by rank 0)" in message, \
                    message
        assert message == results[members[0]][0], "every rank gets the same message"


def _slow_but_correct(steps, sleep_s, cached):
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics
    basics = HorovodBasics()
    basics.init()
    rank, size = basics.rank(), basics.size()
    sums = []
    names = ["allreduce.same"] * steps if cached else [f"allreduce.step{i}" for i in range(steps)]
    for name in names:
        if rank == size - 1:
            time.sleep(sleep_s)  # computing: not waiting on anything, while the others wait
        sums.append(_allreduce(ops, name, [rank + 1.0], 0).tolist())
    basics.shutdown()
    return sums


@pytest.mark.parametrize("cached", [False, True], ids=["uncached", "cached"])
@pytest.mark.parametrize("np_", [2, 3])
def test_slow_rank_never_trips_it(np_, cached):
    timeout_s = 1.0
    steps = 3
    results = run_ranks(np_, _slow_but_correct, steps, 3 * timeout_s, cached,
                        env={"HOROVOD_DEADLOCK_TIMEOUT_SECONDS": str(timeout_s)}, timeout=120)
    expected = [[float(sum(r + 1.0 for r in range(np_)))]] * steps
    assert results == [expected] * np_


def _across_sets(warm_up_steps):
    """Rank 0 waits on an allreduce of the set {0, 1} while every other rank waits on one of the
    global set that rank 0 never submits; then correct allreduces on both sets."""
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics
    from horovod.common.exceptions import HorovodInternalError
    from horovod.common.process_sets import ProcessSet
    basics = HorovodBasics()
    subset = ProcessSet([0, 1])
    basics.init(process_sets=[subset])
    rank = basics.rank()
    set_id = subset.process_set_id
    for step in range(warm_up_steps):  # afterwards both tensors are in their sets' response caches
        if rank in (0, 1):
            _allreduce(ops, "allreduce.a", [step], set_id)
        _allreduce(ops, "allreduce.b", [step], 0)
    start = time.monotonic()
    message, elapsed = None, None
    try:
        if rank == 0:
            _allreduce(ops, "allreduce.a", [1.0], set_id)
        else:
            _allreduce(ops, "allreduce.b", [1.0], 0)
    except HorovodInternalError as e:
        message, elapsed = str(e), time.monotonic() - start
    results = []
    if rank in (0, 1):
        results.append(_allreduce(ops, "allreduce.after", [rank, 10.0 * rank], set_id).tolist())
    results.append(_allreduce(ops, "allreduce.global", [rank + 1.0], 0).tolist())
    basics.shutdown()
    return message, elapsed, results


@pytest.mark.parametrize("warm_up_steps", [0, 3], ids=["uncached", "cached"])
@pytest.mark.parametrize("np_", [3, 4])  # at np=2 the set {0, 1} would be the global set
def test_deadlock_across_process_sets_raises_on_every_rank(np_, warm_up_steps):
    results = run_ranks(np_, _across_sets, warm_up_steps, env=ENV, timeout=120)
    for rank, (message, elapsed, values) in enumerate(results):
        assert values == _expected_results(np_, True, rank), (rank, values)
        assert message is not None, f"rank {rank} did not raise"
        assert 2 * TIMEOUT_S <= elapsed < 10 * TIMEOUT_S + 20, (rank, elapsed)
        assert "Deadlock across process sets: every rank of the job has waited" in message, message
        if rank == 0:
            assert "in process set 1:" in message and "rank 0 " in message and "waits on allreduce.a" in message
            assert "waits on an operation of another process set" in message, message
        else:
            assert "in process set 0:" in message and f"rank {rank} " in message and "waits on allreduce.b" in message
