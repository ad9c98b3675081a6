"""Gradients of the differentiable collectives, against closed-form numpy references.

Each rank r computes ``loss_r = sum(op(x_r) * w_r)`` with its own weights ``w_r`` and calls
``loss_r.backward()``; the expected gradient of ``x_r`` follows from the spec's backward rules.
"""

import numpy as np
import pytest
import torch
from horovod_testing import run_ranks


def weights(rank, shape, salt):
    rng = np.random.default_rng([rank, salt])
    return torch.from_numpy(rng.uniform(-1.0, 1.0, shape))


def autograd_worker():
    import horovod.torch as hvd
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    root = size - 1
    grads = {}

    x = torch.ones(3, 4, dtype=torch.float64, requires_grad=True)
    for op_name in ('Sum', 'Average'):
        x.grad = None
        y = hvd.allreduce(x, op=getattr(hvd, op_name), prescale_factor=2.0)
        (y * weights(rank, (3, 4), 0)).sum().backward()
        grads[f'allreduce.{op_name}'] = x.grad.numpy().copy()

    a = torch.ones(2, dtype=torch.float64, requires_grad=True)
    b = torch.ones(3, 2, dtype=torch.float64, requires_grad=True)
    ya, yb = hvd.grouped_allreduce([a, b], op=hvd.Sum)
    ((ya * weights(rank, (2,), 1)).sum() + (yb * weights(rank, (3, 2), 2)).sum()).backward()
    grads['grouped.a'] = a.grad.numpy().copy()
    grads['grouped.b'] = b.grad.numpy().copy()

    # Rank r contributes r + 1 rows.
    g = torch.ones(rank + 1, 2, dtype=torch.float64, requires_grad=True)
    total_rows = size * (size + 1) // 2
    (hvd.allgather(g) * weights(rank, (total_rows, 2), 3)).sum().backward()
    grads['allgather'] = g.grad.numpy().copy()

    c = torch.ones(5, dtype=torch.float64, requires_grad=True)
    out = hvd.broadcast(c, root_rank=root)
    (out * weights(rank, (5,), 4)).sum().backward()
    grads['broadcast'] = c.grad.numpy().copy()

    # A gradient that arrives non-contiguous (an expanded view) still reduces.
    d = torch.ones(4, 3, dtype=torch.float64, requires_grad=True)
    hvd.allreduce(d, op=hvd.Sum).sum().backward()
    grads['expanded'] = d.grad.numpy().copy()
    return grads


@pytest.mark.parametrize('np_', [1, 2, 3])
def test_gradients(np_):
    results = run_ranks(np_, autograd_worker)

    def mean_weights(shape, salt):
        return np.mean([weights(r, shape, salt).numpy() for r in range(np_)], axis=0)

    def sum_weights(shape, salt):
        return np.sum([weights(r, shape, salt).numpy() for r in range(np_)], axis=0)

    offsets = np.cumsum([0] + [r + 1 for r in range(np_)])
    total_rows = offsets[-1]
    for rank, grads in enumerate(results):
        # d(postscale * sum(prescale * x))/dx, allreduced with the same settings.
        np.testing.assert_allclose(grads['allreduce.Sum'], 2.0 * sum_weights((3, 4), 0))
        np.testing.assert_allclose(grads['allreduce.Average'], 2.0 * mean_weights((3, 4), 0))
        np.testing.assert_allclose(grads['grouped.a'], sum_weights((2,), 1))
        np.testing.assert_allclose(grads['grouped.b'], sum_weights((3, 2), 2))
        rows = mean_weights((total_rows, 2), 3)[offsets[rank]:offsets[rank + 1]]
        np.testing.assert_allclose(grads['allgather'], rows)
        expected = mean_weights((5,), 4) if rank == np_ - 1 else np.zeros(5)
        np.testing.assert_allclose(grads['broadcast'], expected)
        np.testing.assert_allclose(grads['expanded'], np.full((4, 3), float(np_)))


def fp16_worker():
    import horovod.torch as hvd
    hvd.init()
    rng = np.random.default_rng(hvd.rank())
    x = torch.from_numpy(rng.uniform(-1.0, 1.0, (64,))).float()
    out = hvd.allreduce(x, op=hvd.Average, compression=hvd.Compression.fp16, name='fp16')
    grouped = hvd.grouped_allreduce([x, torch.arange(4)], op=hvd.Sum,
                                    compression=hvd.Compression.fp16)
    return out, grouped


def test_fp16_compression_allreduce():
    results = run_ranks(2, fp16_worker)
    inputs = [np.random.default_rng(r).uniform(-1.0, 1.0, (64,)).astype(np.float32)
              for r in range(2)]
    for out, (g_float, g_int) in results:
        assert out.dtype == torch.float32 and g_float.dtype == torch.float32
        assert g_int.dtype == torch.int64
        np.testing.assert_allclose(out.numpy(), np.mean(inputs, axis=0), atol=2e-3)
        np.testing.assert_allclose(g_float.numpy(), np.sum(inputs, axis=0), atol=4e-3)
        np.testing.assert_array_equal(g_int.numpy(), 2 * np.arange(4))
