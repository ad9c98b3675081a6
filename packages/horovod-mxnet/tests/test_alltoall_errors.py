"""An alltoall refused at submission raises mxnet.base.MXNetError (as upstream reports it),
which is also a ValueError naming what was expected; the ranks stay in step afterwards."""

import pytest

from horovod_testing import run_ranks


def body():
    import mxnet as mx
    from mxnet.base import MXNetError

    import horovod.mxnet as hvd
    hvd.init()
    n = hvd.size()
    x = mx.nd.ones((n + 1, 2))  # n + 1 rows: not divisible by the set size
    cases = {
        'uneven_default_splits': lambda: hvd.alltoall(x, name='uneven'),
        'splits_sum': lambda: hvd.alltoall(x, splits=[n + 2] + [0] * (n - 1), name='sum'),
        'splits_length': lambda: hvd.alltoall(x, splits=[1] * (n + 1), name='length'),
        'splits_negative': lambda: hvd.alltoall(x, splits=[2] + [-1] * (n - 1), name='negative'),
        'splits_dtype': lambda: hvd.alltoall(x, splits=mx.nd.array([1] * n), name='dtype'),
        'splits_not_ints': lambda: hvd.alltoall(x, splits=[0.5] * n, name='floats'),
    }
    out = {}
    for what, call in cases.items():
        try:
            call()
            out[what] = None
        except Exception as e:  # noqa: BLE001 - the test looks at the type
            out[what] = (isinstance(e, MXNetError), isinstance(e, ValueError), str(e))
    good = mx.nd.array([[float(hvd.rank())]] * n)
    out['after'] = hvd.alltoall(good, name='good').asnumpy().ravel().tolist()
    return out


@pytest.mark.parametrize('np_', [2, 3])
def test_alltoall_submission_errors_are_mxnet_errors(np_):
    for r, out in enumerate(run_ranks(np_, body, timeout=300)):
        for what, caught in out.items():
            if what == 'after':
                assert caught == [float(k) for k in range(np_)], (r, caught)
                continue
            assert caught is not None, f'rank {r}: {what} raised nothing'
            is_mxnet_error, is_value_error, message = caught
            assert is_mxnet_error and is_value_error, (r, what, message)
            assert 'split' in message.lower() or 'divisible' in message.lower() or 'divid' in message.lower(), \
                (r, what, message)
