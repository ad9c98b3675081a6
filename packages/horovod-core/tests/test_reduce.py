"""horovod.common.ops.reduce_async, the collective added through the one seam (docs/engine.md,
"Adding a collective"): each op with scale factors, in place and into another array, to each root,
against numpy; the mistakes refused at submission (a root outside the set, Adasum, a mismatched
output) and those the ranks disagree on (the root) as the other collectives report them."""

import numpy as np
import pytest

from horovod_testing import run_ranks


def _worker():
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics
    from horovod.common.exceptions import HorovodInternalError
    from horovod_testing.collectives import AVERAGE, MAX, MIN, SUM

    basics = HorovodBasics()
    basics.init()
    rank, size = basics.rank(), basics.size()
    assert 'reduce' in ops.operations()
    checked = 0
    for root in range(size):
        for dtype in ["int32", "float32", "float64"]:
            inputs = [((np.arange(12).reshape(3, 4) * (r + 2)) % 7 + 1).astype(dtype) for r in range(size)]
            wide = [x.astype(np.float64) for x in inputs]
            cases = [(SUM, 1.0, 1.0, sum(wide)),
                     (MIN, 1.0, 1.0, np.minimum.reduce(wide)),
                     (MAX, 1.0, 1.0, np.maximum.reduce(wide))]
            if dtype != "int32":
                cases.append((AVERAGE, 2.0, 0.5, sum(w * 2.0 for w in wide) / size * 0.5))
            for op, prescale, postscale, reference in cases:
                expected = reference if rank == root else wide[rank]
                # In place.
                x = inputs[rank].copy()
                h = ops.reduce_async(x, x, f"r.{root}.{dtype}.{op}.in", root, op, prescale, postscale)
                assert ops.wait(h) == [None]
                np.testing.assert_allclose(x.astype(np.float64), expected, rtol=1e-6)
                # Into another array, the input untouched.
                x = inputs[rank].copy()
                out = np.zeros_like(x)
                ops.wait(ops.reduce_async(x, out, f"r.{root}.{dtype}.{op}.out", root, op, prescale, postscale))
                np.testing.assert_allclose(out.astype(np.float64), expected, rtol=1e-6)
                np.testing.assert_array_equal(x, inputs[rank])
                checked += 2
    errors = []
    x = np.ones(3, np.float32)
    for bad in [lambda: ops.reduce_async(x, x, "bad.root", size, SUM),
                lambda: ops.reduce_async(x, x, "bad.adasum", 0, 2),
                lambda: ops.reduce_async(x, np.ones(4, np.float32), "bad.output", 0, SUM)]:
        with pytest.raises(ValueError) as e:
            bad()
        errors.append(str(e.value))
    disagreement = None
    if size > 1:
        try:
            ops.wait(ops.reduce_async(x, x, "root.disagrees", rank, SUM))
        except HorovodInternalError as e:
            disagreement = str(e)
    basics.shutdown()
    return checked, errors, disagreement


@pytest.mark.parametrize("np_", [1, 2, 3])
def test_reduce(np_):
    for checked, errors, disagreement in run_ranks(np_, _worker, timeout=120):
        assert checked == np_ * 3 * 2 * 3 + np_ * 2 * 2
        assert "not a member of process set" in errors[0], errors[0]
        assert "not Adasum" in errors[1], errors[1]
        assert "must have the input's dtype, shape and device" in errors[2], errors[2]
        if np_ > 1:
            assert "Mismatched REDUCE root ranks" in disagreement, disagreement
