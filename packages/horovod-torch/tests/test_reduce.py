"""hvd.reduce and hvd.reduce_async: the root gets the reduction (each op, with scale factors), the
other ranks a copy of their input, against numpy; the input is never modified; a bad root, Adasum
and an unsupported dtype are refused at submission."""

import numpy as np
import pytest
import torch
from horovod_testing import run_ranks


def worker():
    import horovod.torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    checked = 0
    for root in range(size):
        for dtype in (torch.int32, torch.float32, torch.float64):
            inputs = [(torch.arange(6).reshape(2, 3) * (r + 2)) % 5 + 1 for r in range(size)]
            wide = [x.double().numpy() for x in inputs]
            cases = [(hvd.Sum, 1.0, 1.0, sum(wide)),
                     (hvd.Min, 1.0, 1.0, np.minimum.reduce(wide)),
                     (hvd.Max, 1.0, 1.0, np.maximum.reduce(wide)),
                     (hvd.Product, 1.0, 1.0, np.prod(wide, axis=0))]
            if dtype.is_floating_point:
                cases.append((hvd.Average, 2.0, 0.25, sum(w * 2.0 for w in wide) / size * 0.25))
            for k, (op, prescale, postscale, reference) in enumerate(cases):
                x = inputs[rank].to(dtype)
                before = x.clone()
                name = f'{root}.{dtype}.{k}'
                if k % 2:
                    result = hvd.synchronize(hvd.reduce_async(x, root, name, op, prescale, postscale))
                else:
                    result = hvd.reduce(x, root_rank=root, name=name, op=op, prescale_factor=prescale,
                                        postscale_factor=postscale)
                expected = reference if rank == root else wide[rank]
                assert result.dtype == dtype and result.shape == x.shape
                np.testing.assert_allclose(result.double().numpy(), expected, rtol=1e-6)
                assert torch.equal(x, before)
                checked += 1
    # An unnamed reduce, twice: automatic names count per op.
    for _ in range(2):
        result = hvd.reduce(torch.ones(3), 0, op=hvd.Sum)
        assert result.tolist() == ([float(size)] * 3 if rank == 0 else [1.0] * 3)
    errors = []
    for bad in (lambda: hvd.reduce(torch.ones(2), size),
                lambda: hvd.reduce(torch.ones(2), 0, op=hvd.Adasum),
                lambda: hvd.reduce(torch.ones(2, dtype=torch.bool), 0),
                lambda: hvd.reduce(torch.ones(2), '0')):
        with pytest.raises(ValueError) as e:
            bad()
        errors.append(str(e.value))
    hvd.shutdown()
    return checked, errors


@pytest.mark.parametrize('np_', [1, 2])
def test_reduce(np_):
    for checked, errors in run_ranks(np_, worker, timeout=120):
        assert checked == np_ * (4 + 5 + 5)
        assert 'not a member of process set' in errors[0], errors[0]
        assert 'not Adasum' in errors[1], errors[1]
        assert 'does not support tensor type' in errors[2], errors[2]
        assert 'root_rank must be an int' in errors[3], errors[3]
