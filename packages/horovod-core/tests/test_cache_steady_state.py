"""A training loop's steady state on the response cache (issue 23): once every rank has cached an
operation, submitting it again is settled by the cache's bitwise AND alone, without a coordinator
round, on every rank, with the shared-memory transport and without it. Results are checked against
the numpy reference at every step."""

import pytest

from horovod_testing import run_ranks

_STEPS = 40


def _steady_state():
    import numpy as np
    from horovod.common import _core, ops
    from horovod.common.basics import HorovodBasics
    from horovod_testing.collectives import SUM
    basics = HorovodBasics()
    basics.init()
    rank, size = basics.rank(), basics.size()
    # Two tensors per step, as a step of a small model: one submitted alone, one as a group of two.
    single_in = np.full(1024, rank + 1, np.float32)
    group_in = [np.full(7, rank * 2, np.int64), np.full(3, 1.5 * rank, np.float64)]
    single_out = np.empty_like(single_in)
    group_out = [np.empty_like(t) for t in group_in]

    def step():
        h1 = ops.allreduce_async([single_in], [single_out], ["steady.single"], SUM)
        h2 = ops.allreduce_async(group_in, group_out, ops.member_names("steady.group", 2), SUM)
        ops.wait(h1)
        ops.wait(h2)
        assert (single_out == size * (size + 1) / 2).all(), single_out
        assert (group_out[0] == size * (size - 1)).all(), group_out[0]
        assert (group_out[1] == 0.75 * size * (size - 1)).all(), group_out[1]

    step()  # negotiated by the coordinator, then cached
    before = _core.engine_stats()
    for _ in range(_STEPS):
        step()
    after = _core.engine_stats()
    basics.shutdown()
    return {key: after[key] - before[key] for key in ("cache_hits", "coordinator_rounds", "cycles")}


@pytest.mark.parametrize("shared_memory", ["1", "0"])
@pytest.mark.parametrize("np_", [2, 3])
def test_cached_operations_take_no_coordinator_round(np_, shared_memory):
    results = run_ranks(np_, _steady_state, env={"HOROVOD_SHARED_MEMORY": shared_memory}, timeout=300)
    for rank, counts in enumerate(results):
        assert counts["coordinator_rounds"] == 0, f"rank {rank}: {counts}; every rank: {results}"
        assert counts["cache_hits"] == 3 * _STEPS, f"rank {rank}: {counts}"  # three tensors a step
        assert counts["cycles"] >= 1, f"rank {rank}: {counts}"
