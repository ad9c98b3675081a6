"""hvd.reduce: the root gets the reduction (Sum; Average with scale factors), the other ranks a copy
of their input, against numpy; a root outside the set and Adasum are refused at submission."""

import numpy as np
import pytest

from jobs import SIZES, results, worker


@worker
def reduce_body():
    import mxnet as mx

    import horovod.mxnet as hvd
    rank, n = hvd.rank(), hvd.size()
    inputs = [np.arange(6, dtype=np.float32).reshape(2, 3) * (r + 1) for r in range(n)]
    checked = 0
    for root in range(n):
        for op, pre, post, reference in [(hvd.Sum, 1.0, 1.0, sum(inputs)),
                                         (hvd.Average, 2.0, 0.5, sum(inputs) * 2.0 / n * 0.5),
                                         (hvd.Max, 1.0, 1.0, np.maximum.reduce(inputs))]:
            x = mx.nd.array(inputs[rank])
            out = hvd.reduce(x, root, name=f'r.{root}.{op}', op=op, prescale_factor=pre, postscale_factor=post)
            expected = reference if rank == root else inputs[rank]
            np.testing.assert_allclose(out.asnumpy(), expected, rtol=1e-6)
            np.testing.assert_array_equal(x.asnumpy(), inputs[rank])
            checked += 1
    refused = []
    for bad in (lambda: hvd.reduce(mx.nd.ones(2), n), lambda: hvd.reduce(mx.nd.ones(2), 0, op=hvd.Adasum)):
        try:
            bad()
            refused.append(None)
        except ValueError as e:
            refused.append(str(e))
    return checked, refused


@pytest.mark.parametrize('np_', SIZES)
def test_reduce(np_):
    for checked, refused in results(reduce_body, np_):
        assert checked == 3 * np_
        assert 'not a member of process set' in refused[0], refused[0]
        assert 'got 2' in refused[1], refused[1]
