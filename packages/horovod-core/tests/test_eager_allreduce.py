"""Eager allreduce (engine/controller.h): over Gloo, a cached allreduce that is a rank's only business
in a cycle travels with the cache round's bits, and when every rank sent it the round has reduced
it. Synchronous small allreduces of several dtypes, ops and scales, in place and not, up to the
one-step limit (64 KiB at two ranks, 32 KiB at more) and just beyond it, are checked against numpy
at every step; so are steps where the ranks submit two cached tensors in opposite orders (the
round then carries no data, or data under different tags, and the cycle goes on without it). The
counter shows that the path ran. The shared-memory transport reduces by its own path, so there the
round carries no data."""

import pytest

from horovod_testing import run_ranks

_STEPS = 25


def _eager_steps():
    import numpy as np
    from horovod.common import _core, ops
    from horovod.common.basics import HorovodBasics
    from horovod_testing.collectives import AVERAGE, MAX, SUM
    basics = HorovodBasics()
    basics.init()
    rank, size = basics.rank(), basics.size()
    limit = 65536 if size == 2 else 32768

    def values(n, dtype, step, r=rank):
        base = (np.arange(n) * 7 + r * 13 + step) % 101
        return (base / 3).astype(dtype) if np.issubdtype(dtype, np.floating) else base.astype(dtype)

    def reference(n, dtype, step, op):
        every = [values(n, dtype, step, r) for r in range(size)]
        if op == MAX:
            return np.maximum.reduce(every)
        total = every[0]
        for x in every[1:]:
            total = total + x  # in rank order, as the engine reduces
        return total

    # (name, elements, dtype, op, postscale, in place)
    cases = [("eager.scalar", 1, np.float32, SUM, 1.0, True),
             ("eager.ints", 333, np.int32, SUM, 1.0, False),
             ("eager.max", 1000, np.float64, MAX, 1.0, True),
             ("eager.average", 2048, np.float32, AVERAGE, 0.5, False),
             ("eager.limit", limit // 4, np.float32, SUM, 1.0, True),
             ("eager.beyond", limit // 4 + 1, np.float32, SUM, 1.0, False)]
    for step in range(_STEPS):
        for name, n, dtype, op, postscale, in_place in cases:
            x = values(n, dtype, step)
            out = x if in_place else np.empty_like(x)
            ops.wait(ops.allreduce_async([x], [out], [name], op, postscale_factor=postscale))
            expected = reference(n, dtype, step, op)
            if op == AVERAGE or (name == "eager.beyond" and size > 2):  # scaled; or the ring's order
                expected = expected / size * postscale if op == AVERAGE else expected
                np.testing.assert_allclose(out, expected, rtol=1e-6, err_msg=f"{name} at step {step}")
            else:
                np.testing.assert_array_equal(out, expected, err_msg=f"{name} at step {step}")
        # Two cached tensors submitted in opposite orders on odd and even ranks.
        a = np.full(10, rank + step, np.float32)
        b = np.full(20, 2 * rank + step, np.float64)
        first, second = ((a, "eager.pair.a"), (b, "eager.pair.b"))[::1 if rank % 2 == 0 else -1]
        h1 = ops.allreduce_async([first[0]], [first[0]], [first[1]], SUM)
        h2 = ops.allreduce_async([second[0]], [second[0]], [second[1]], SUM)
        ops.wait(h1)
        ops.wait(h2)
        assert (a == sum(r + step for r in range(size))).all(), a
        assert (b == sum(2 * r + step for r in range(size))).all(), b
    stats = _core.engine_stats()
    basics.shutdown()
    return stats["eager_allreduces"]


@pytest.mark.parametrize("np_", [2, 3])
def test_small_allreduces_ride_the_cache_round(np_):
    eager = run_ranks(np_, _eager_steps, env={"HOROVOD_SHARED_MEMORY": "0"}, timeout=300)
    # Each step's first five allreduces are cached from step 1 on; every rank submits each of them
    # alone, so the cycles where all ranks have it carry its data (a cycle where only some have it
    # does not). "eager.beyond" never rides.
    for rank, count in enumerate(eager):
        assert count >= 2 * (_STEPS - 1), f"rank {rank}: {count} eager allreduces; every rank: {eager}"
        assert count <= 7 * _STEPS, f"rank {rank}: {count}"
    assert len(set(eager)) == 1, f"the ranks disagree on which rounds settled: {eager}"


def test_shared_memory_round_carries_no_data():
    eager = run_ranks(2, _eager_steps, env={"HOROVOD_SHARED_MEMORY": "1"}, timeout=300)
    assert eager == [0, 0], eager
