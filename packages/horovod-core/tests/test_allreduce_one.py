"""horovod.common.ops.allreduce_one_async, the single-tensor allreduce (issue 23's submission
path): in place and into another array, with each op and scale factors, on every dtype the
engine reduces, against numpy; the caller's context kept until wait; the mistakes refused at
submission as allreduce_async refuses them, leaving nothing in flight."""

import numpy as np
import pytest

from horovod_testing import run_ranks


def _worker():
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics
    from horovod_testing.collectives import AVERAGE, MAX, MIN, SUM

    basics = HorovodBasics()
    basics.init()
    rank, size = basics.rank(), basics.size()
    checked = 0
    for dtype in ["int32", "int64", "float16", "float32", "float64"]:
        base = (np.arange(12).reshape(3, 4) % 5).astype(dtype)
        inputs = [(base + r).astype(dtype) for r in range(size)]
        for op, reference in [(SUM, sum(x.astype(np.float64) for x in inputs)),
                              (MIN, np.minimum.reduce([x.astype(np.float64) for x in inputs])),
                              (MAX, np.maximum.reduce([x.astype(np.float64) for x in inputs]))]:
            # In place.
            x = inputs[rank].copy()
            assert ops.wait(ops.allreduce_one_async(x, x, f"one.{dtype}.{op}", op)) == [None]
            np.testing.assert_array_equal(x.astype(np.float64), reference)
            # Into another array, the input untouched.
            x = inputs[rank].copy()
            out = np.zeros_like(x)
            context = object()
            h = ops.allreduce_one_async(x, out, f"two.{dtype}.{op}", op, context=context)
            assert ops.context(h) is context
            ops.wait(h)
            np.testing.assert_array_equal(out.astype(np.float64), reference)
            np.testing.assert_array_equal(x, inputs[rank])
            checked += 2
    # Average with a prescale and a postscale.
    x = np.full(5, float(rank + 1), np.float64)
    ops.wait(ops.allreduce_one_async(x, x, "scaled", AVERAGE, 2.0, 0.5))
    np.testing.assert_allclose(x, np.full(5, sum(r + 1.0 for r in range(size)) / size))
    # Refused at submission, as allreduce_async refuses them: nothing is left in flight.
    errors = []
    held = np.ones(3, np.float32)
    h = ops.allreduce_one_async(held, held, "held", SUM)
    for bad in [lambda: ops.allreduce_one_async(np.ones(3, np.float32), np.ones(3, np.float32), "held", SUM),
                lambda: ops.allreduce_one_async(np.ones(3, np.float32), np.ones(3, np.float32), "bad.op", 99),
                lambda: ops.allreduce_one_async(np.ones((4, 4), np.float32)[:, 1], np.ones(4, np.float32),
                                                "strided", SUM),
                lambda: ops.allreduce_one_async([1, 2], [1, 2], "not.a.tensor", SUM)]:
        with pytest.raises(ValueError) as e:
            bad()
        errors.append(str(e.value))
    in_flight = sorted(ops._in_flight)
    ops.wait(h)
    basics.shutdown()
    return checked, errors, in_flight == [h]


@pytest.mark.parametrize("np_", [1, 2, 3])
def test_allreduce_one(np_):
    for checked, errors, only_the_held_one in run_ranks(np_, _worker, timeout=120):
        assert checked == 30
        assert "already being processed" in errors[0], errors[0]
        assert "unknown reduce op 99" in errors[1], errors[1]
        assert "must be contiguous" in errors[2], errors[2]
        assert "DLPack" in errors[3], errors[3]
        assert only_the_held_one
