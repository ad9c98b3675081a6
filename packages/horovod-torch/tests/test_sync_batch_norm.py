"""SyncBatchNorm on CPU: ranks holding slices (even or not) of one global batch must get what a
single-process torch.nn.BatchNorm gets on the whole batch: outputs, input gradients, running
statistics and num_batches_tracked; the sum over ranks of the local weight and bias gradients
must equal the single-process gradients."""

import functools

import pytest
import torch
from jobs import job_fixture

STEPS = 2
C = 3


def _scenarios():
    base = {'dims': 4, 'affine': True, 'track': True, 'uneven': True, 'dtype': torch.float64,
            'momentum': 0.1, 'empty_rank': False}
    scenarios = {}
    for dims in (2, 4):
        for affine in (True, False):
            for track in (True, False):
                for uneven in (False, True):
                    name = f'{dims}d_affine{int(affine)}_track{int(track)}_uneven{int(uneven)}'
                    scenarios[name] = dict(base, dims=dims, affine=affine, track=track,
                                           uneven=uneven)
    scenarios['float32'] = dict(base, dtype=torch.float32)
    scenarios['momentum_none'] = dict(base, momentum=None)
    scenarios['empty_rank'] = dict(base, empty_rank=True)
    return scenarios


SCENARIOS = _scenarios()


def batch_sizes(np_, s):
    if s['empty_rank']:
        return [0] + [5] * (np_ - 1) if np_ > 1 else [5]
    if s['uneven']:
        return [2 + 3 * r for r in range(np_)]
    return [4] * np_


def global_data(np_, s, step):
    n = sum(batch_sizes(np_, s))
    shape = (n, C) if s['dims'] == 2 else (n, C, 2, 3)
    g = torch.Generator().manual_seed(1000 * step + 7)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 0.5
    dy = torch.randn(shape, generator=g, dtype=torch.float64)
    return x.to(s['dtype']), dy.to(s['dtype'])


def make_layer(cls, s, **kwargs):
    layer = cls(C, momentum=s['momentum'], affine=s['affine'], track_running_stats=s['track'],
                **kwargs).to(s['dtype'])
    if s['affine']:
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            layer.weight.copy_(torch.rand(C, generator=g) + 0.5)
            layer.bias.copy_(torch.randn(C, generator=g))
    return layer


def run(layer, xs_dys):
    """Trains ``STEPS`` steps, then evaluates; returns everything the test compares."""
    out = {'y': [], 'dx': [], 'dw': [], 'db': []}
    for x, dy in xs_dys[:STEPS]:
        layer.train()
        x = x.clone().requires_grad_()
        layer.zero_grad()
        y = layer(x)
        y.backward(dy)
        out['y'].append(y.detach())
        out['dx'].append(x.grad)
        out['dw'].append(layer.weight.grad if layer.affine else None)
        out['db'].append(layer.bias.grad if layer.affine else None)
    layer.eval()
    with torch.no_grad():
        out['eval'] = layer(xs_dys[STEPS][0])
    out['buffers'] = {k: v.clone() for k, v in layer.named_buffers()}
    return out


def worker(name):
    import horovod.torch as hvd

    hvd.init()
    s = SCENARIOS[name]
    np_, rank = hvd.size(), hvd.rank()
    sizes = batch_sizes(np_, s)
    begin, end = sum(sizes[:rank]), sum(sizes[:rank + 1])
    data = [tuple(t[begin:end] for t in global_data(np_, s, step)) for step in range(STEPS + 1)]
    return run(make_layer(hvd.SyncBatchNorm, s), data)


def worker_errors():
    import horovod.torch as hvd

    hvd.init()
    layer = hvd.SyncBatchNorm(C)
    with pytest.raises(ValueError, match='2 or more dimensions'):
        layer(torch.randn(C))
    return isinstance(layer, torch.nn.modules.batchnorm._BatchNorm)


def worker_convert():
    import horovod.torch as hvd

    hvd.init()
    model = torch.nn.Sequential(torch.nn.Linear(4, C), torch.nn.BatchNorm1d(C),
                                torch.nn.Sequential(torch.nn.BatchNorm2d(C)))
    bn = model[1]
    converted = hvd.SyncBatchNorm.convert_sync_batchnorm(model)
    return (converted is model, type(model[1]).__name__, type(model[2][0]).__name__,
            model[1].weight is bn.weight, model[1].running_mean is bn.running_mean)


WORKERS = {name: functools.partial(worker, name) for name in SCENARIOS}
WORKERS['errors'] = worker_errors
WORKERS['convert'] = worker_convert
job = job_fixture(WORKERS, sizes=(1, 2, 3))


def tolerance(s):
    return {'rtol': 1e-4, 'atol': 1e-5} if s['dtype'] == torch.float32 else {'rtol': 1e-9, 'atol': 1e-10}


@pytest.mark.parametrize('name', list(SCENARIOS))
def test_matches_single_process_batch_norm(job, name):
    np_, results = job(name)
    s = SCENARIOS[name]
    reference_cls = torch.nn.BatchNorm1d if s['dims'] == 2 else torch.nn.BatchNorm2d
    data = [global_data(np_, s, step) for step in range(STEPS + 1)]
    expected = run(make_layer(reference_cls, s), data)
    tol = tolerance(s)
    for step in range(STEPS):
        torch.testing.assert_close(torch.cat([r['y'][step] for r in results]), expected['y'][step], **tol)
        torch.testing.assert_close(torch.cat([r['dx'][step] for r in results]), expected['dx'][step], **tol)
        if s['affine']:
            torch.testing.assert_close(sum(r['dw'][step] for r in results), expected['dw'][step], **tol)
            torch.testing.assert_close(sum(r['db'][step] for r in results), expected['db'][step], **tol)
    sizes = batch_sizes(np_, s)
    # Evaluation: every rank normalises its own slice with the (identical) running statistics,
    # or, without them, with the statistics of the whole batch.
    torch.testing.assert_close(torch.cat([r['eval'] for r in results]), expected['eval'], **tol)
    for r, n in zip(results, sizes, strict=True):
        assert r['eval'].shape[0] == n
        assert r['buffers'].keys() == expected['buffers'].keys()
        for key, value in expected['buffers'].items():
            torch.testing.assert_close(r['buffers'][key], value, **tol)
    if s['track']:
        assert all(int(r['buffers']['num_batches_tracked']) == STEPS for r in results)


def test_input_checks_and_cpu(job):
    _, results = job('errors')
    assert all(results)


def test_convert_sync_batchnorm(job):
    _, results = job('convert')
    for r in results:
        assert r == (True, 'SyncBatchNorm', 'SyncBatchNorm', True, True)
