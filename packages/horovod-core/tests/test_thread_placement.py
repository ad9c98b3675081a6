"""Where the background thread runs (engine.h, "Where the background thread runs"; docs/engine.md):

- HOROVOD_THREAD_AFFINITY pins it to entry [local_rank] of a list of core ids; a malformed list, one
  with fewer entries than the host has ranks, or a core the process may not use is a ValueError
  at init that names the variable;
- where a host's ranks are at least as many as the cores a rank may use, it moves before its cycles
  to the core of the last submission (HOROVOD_THREAD_FOLLOW_CALLER, on by default), and stays where
  the scheduler puts it with the knob at 0;
- there, with the default cycle time, it looks for work that nobody waits on every 10 ms, so a
  stream of asynchronous allreduces runs in fewer cycles than with HOROVOD_CYCLE_TIME=1.

Each case checks the thread's CPU affinity (sched_getaffinity of its thread id) against
engine_stats and the allreduce results against numpy.
"""

import os

import pytest

from horovod_testing import init_error, run_ranks


def _allreduce_by_background(tag, value):
    """Sums ``value`` over the ranks in an operation that nobody waits on, so that the background
    thread runs its cycle (a waiting caller would run it itself); returns the result."""
    import time

    import numpy as np
    from horovod.common import ops
    from horovod_testing.collectives import SUM
    x = np.full(1000, value, np.float64)
    out = np.empty_like(x)
    handle = ops.allreduce_async([x], [out], [tag], SUM)
    deadline = time.monotonic() + 30
    while not ops.poll(handle):
        assert time.monotonic() < deadline, f"{tag}: not done in 30 s"
        time.sleep(0.002)
    ops.wait(handle)
    return out


def _pinned():
    import numpy as np
    from horovod.common import _core
    from horovod.common.basics import HorovodBasics
    basics = HorovodBasics()
    basics.init()
    rank, size = basics.rank(), basics.size()
    out = _allreduce_by_background("pinned", rank + 1.0)
    np.testing.assert_array_equal(out, np.full(1000, size * (size + 1) / 2))
    stats = _core.engine_stats()
    cores = os.sched_getaffinity(stats["background_thread_id"])
    with open(f"/proc/self/task/{stats['background_thread_id']}/comm") as f:
        assert f.read().strip() == "hvd-background"
    basics.shutdown()
    return stats["background_cpu"], sorted(cores)


def test_thread_affinity_pins_each_rank_to_its_entry():
    core = min(os.sched_getaffinity(0))
    results = run_ranks(2, _pinned, env={"HOROVOD_THREAD_AFFINITY": f"{core},{core}"})
    assert results == [(core, [core])] * 2


@pytest.mark.parametrize("value, expected", [
    ("zero,one", "comma-separated list of core ids"),
    ("0;1", "comma-separated list of core ids"),
    ("-1,0", "comma-separated list of core ids"),
    ("0", "expected an entry for each of the host's 2 ranks"),
    ("{unusable},{unusable}", "may not run on"),
])
def test_thread_affinity_errors_name_the_variable(value, expected):
    # A core this machine does not let the process use: one past the highest it may use.
    value = value.format(unusable=max(os.sched_getaffinity(0)) + 1)
    for message in run_ranks(2, init_error, env={"HOROVOD_THREAD_AFFINITY": value}):
        assert message is not None and "HOROVOD_THREAD_AFFINITY" in message and expected in message, message


def _follows(cores):
    """Restricts this rank to ``cores`` (so that the host's ranks are at least as many as the cores
    a rank may use), then submits from each core in turn and records where the background thread
    ran the cycle."""
    import numpy as np
    from horovod.common import _core
    from horovod.common.basics import HorovodBasics
    os.sched_setaffinity(0, cores)
    basics = HorovodBasics()
    basics.init()
    rank, size = basics.rank(), basics.size()
    seen = []
    for i, core in enumerate(cores * 2):
        # Only this (the submitting) thread moves: sched_setaffinity(0) is per thread.
        os.sched_setaffinity(0, {core})
        # Two operations: a cycle that began before the first was submitted may run it on the
        # core of the one before; the second one's cycle begins after the first has completed.
        for j in range(2):
            out = _allreduce_by_background(f"follow.{i}.{j}", rank + i + j)
            np.testing.assert_array_equal(out, np.full(1000, sum(r + i + j for r in range(size)), np.float64))
        stats = _core.engine_stats()
        seen.append((core, stats["background_cpu"], sorted(os.sched_getaffinity(stats["background_thread_id"]))))
    basics.shutdown()
    return seen


@pytest.mark.parametrize("follow", ["1", "0"])
def test_background_thread_follows_the_submitting_core(follow):
    cores = sorted(os.sched_getaffinity(0))[:2]
    for rank, seen in enumerate(run_ranks(2, _follows, cores, env={"HOROVOD_THREAD_FOLLOW_CALLER": follow})):
        for core, background_cpu, allowed in seen:
            if follow == "1":
                assert (background_cpu, allowed) == (core, [core]), f"rank {rank}: {seen}"
            else:
                assert (background_cpu, allowed) == (-1, cores), f"rank {rank}: {seen}"


def _spare_cores():
    from horovod.common import _core
    from horovod.common.basics import HorovodBasics
    basics = HorovodBasics()
    basics.init()
    _allreduce_by_background("spare", 1.0)
    stats = _core.engine_stats()
    basics.shutdown()
    return stats["background_cpu"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a core to spare for one rank")
def test_a_rank_with_cores_to_spare_leaves_placement_to_the_scheduler():
    assert run_ranks(1, _spare_cores) == [-1]


def _stream(cores, count):
    """Restricted to ``cores`` (no core to spare), submits ``count`` allreduces about a millisecond
    apart without waiting on any (as a backward pass submits its gradients), then waits for them.
    Returns the cycles that ran while the ranks submitted, the seconds that took, and whether every
    result matches numpy."""
    import time

    import numpy as np
    from horovod.common import _core, ops
    from horovod.common.basics import HorovodBasics
    from horovod_testing.collectives import SUM
    os.sched_setaffinity(0, cores)
    basics = HorovodBasics()
    basics.init()
    rank, size = basics.rank(), basics.size()
    ops.wait(ops.barrier_async())
    before = _core.engine_stats()["cycles"]
    start = time.monotonic()
    submitted = []
    for i in range(count):
        x = np.full(64, rank + i, np.float64)
        out = np.empty_like(x)
        submitted.append((ops.allreduce_async([x], [out], [f"stream.{i}"], SUM), x, out, i))
        time.sleep(0.001)
    cycles = _core.engine_stats()["cycles"] - before
    seconds = time.monotonic() - start
    right = True
    for handle, _, out, i in submitted:
        ops.wait(handle)
        right = right and bool(np.array_equal(out, np.full(64, sum(r + i for r in range(size)), np.float64)))
    basics.shutdown()
    return cycles, seconds, right


def test_a_busy_host_gathers_asynchronous_work_into_fewer_cycles():
    # With no core to spare and the default cycle time, the background thread looks for work that
    # nobody waits on every 10 ms (engine.cc, kBusyHostPollPeriod) instead of every cycle time,
    # whether it follows the submitting core or not; a cycle time the user sets is kept.
    cores = sorted(os.sched_getaffinity(0))[:1]
    batched = run_ranks(2, _stream, cores, 300) + run_ranks(
        2, _stream, cores, 300, env={"HOROVOD_THREAD_FOLLOW_CALLER": "0"})
    every_cycle = run_ranks(2, _stream, cores, 300, env={"HOROVOD_CYCLE_TIME": "1"})
    for cycles, seconds, right in batched:
        assert right
        # One cycle per 10 ms, and some more: the first submission wakes the thread at once, and
        # a rank that the other has overtaken cycles again at once for what the other lacks.
        assert cycles <= seconds / 0.010 * 2 + 5, (cycles, seconds)
    assert all(right for _, _, right in every_cycle)
    assert min(c for c, _, _ in every_cycle) > 2 * max(c for c, _, _ in batched), (batched, every_cycle)
