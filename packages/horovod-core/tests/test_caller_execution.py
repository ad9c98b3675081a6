"""Caller execution (issue 23; docs/engine.md, "Caller execution"): a caller that waits on an
unfinished operation runs the cycles itself. Checked against numpy references at np 2 and 3, with
the shared-memory transport and without it, on and off (HOROVOD_CALLER_EXECUTION):

- synchronous allreduces of several sizes give the reference on every rank, and callers ran cycles
  on every rank exactly when caller execution is on;
- operations nobody waits on still complete (the background thread runs their cycles): a rank that
  only polls its handles sees them finish.
"""

import pytest

from horovod_testing import run_ranks


def _synchronous_then_polled():
    import time

    import numpy as np
    from horovod.common import _core, ops
    from horovod.common.basics import HorovodBasics
    from horovod_testing.collectives import SUM
    basics = HorovodBasics()
    basics.init()
    rank, size = basics.rank(), basics.size()
    for i, count in enumerate([1, 1000, 16384, 300001] * 5):
        x = (np.arange(count, dtype=np.float32) % 7) + rank
        out = np.empty_like(x)
        ops.wait(ops.allreduce_async([x], [out], [f"sync.{i}"], SUM))
        expected = size * (np.arange(count, dtype=np.float32) % 7) + size * (size - 1) / 2
        np.testing.assert_array_equal(out, expected)
    caller_cycles = _core.engine_stats()["caller_cycles"]
    # Submitted and only polled: the background thread must run the cycles.
    x = np.full(4096, rank + 1.0, np.float64)
    out = np.empty_like(x)
    handle = ops.allreduce_async([x], [out], ["polled"], SUM)
    deadline = time.monotonic() + 30
    while not ops.poll(handle):
        assert time.monotonic() < deadline, "an operation nobody waited on did not complete in 30 s"
        time.sleep(0.001)
    ops.wait(handle)
    np.testing.assert_array_equal(out, np.full(4096, size * (size + 1) / 2))
    basics.shutdown()
    return caller_cycles


@pytest.mark.parametrize("caller_execution", ["1", "0"])
@pytest.mark.parametrize("shared_memory", ["1", "0"])
@pytest.mark.parametrize("np_", [2, 3])
def test_caller_execution(np_, shared_memory, caller_execution):
    results = run_ranks(np_, _synchronous_then_polled, timeout=300,
                        env={"HOROVOD_SHARED_MEMORY": shared_memory, "HOROVOD_CALLER_EXECUTION": caller_execution})
    for rank, caller_cycles in enumerate(results):
        if caller_execution == "1":
            assert caller_cycles > 0, f"rank {rank}: no cycle ran on a waiting caller"
        else:
            assert caller_cycles == 0, f"rank {rank}: {caller_cycles} cycles ran on a caller with caller execution off"


def _with_a_process_set():
    import numpy as np
    from horovod.common import _core, ops
    from horovod.common.basics import HorovodBasics
    from horovod.common.process_sets import ProcessSet
    from horovod_testing.collectives import SUM
    basics = HorovodBasics()
    subset = ProcessSet([0, 1])
    basics.init(process_sets=[subset])
    rank, size = basics.rank(), basics.size()
    for i in range(5):
        x = np.full(100, rank + 1.0, np.float32)
        ops.wait(ops.allreduce_async([x], [x], [f"global.{i}"], SUM))
        np.testing.assert_array_equal(x, np.full(100, size * (size + 1) / 2))
        if rank in (0, 1):
            y = np.full(10, rank + 1.0, np.float32)
            ops.wait(ops.allreduce_async([y], [y], [f"subset.{i}"], SUM, process_set_id=subset.process_set_id))
            np.testing.assert_array_equal(y, np.full(10, 3.0))
    # Rank 2 must not shut down while ranks 0 and 1 still run their last allreduce on the set.
    z = np.ones(1, np.float32)
    ops.wait(ops.allreduce_async([z], [z], ["global.last"], SUM))
    caller_cycles = _core.engine_stats()["caller_cycles"]
    basics.shutdown()
    return caller_cycles


def test_caller_execution_with_a_process_set():
    # Callers run cycles with another process set registered too (each cycle negotiates every set
    # of the rank), and both sets' results are right; the deadlock across sets is test_deadlock.py's.
    results = run_ranks(3, _with_a_process_set, timeout=300)
    assert all(caller_cycles > 0 for caller_cycles in results), results
