"""DistributedOptimizer: ranks training on different data must end with identical parameters,
equal to a single-process reference that averages (or sums) the ranks' gradients itself; plus
its checks and error cases. One job per world size runs every worker body (see jobs.py)."""

import warnings

import pytest
import torch
from jobs import job_fixture

STEPS = 3
LR = 0.05


class Net(torch.nn.Module):
    """Two layers, plus ``extra``, which only takes part in the forward pass when asked."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 2)
        self.extra = torch.nn.Linear(4, 2)
        self.double()

    def forward(self, x, use_extra=True):
        out = self.fc2(torch.tanh(self.fc1(x)))
        return out + self.extra(x) if use_extra else out


def batch(rank, step, k):
    generator = torch.Generator().manual_seed(10_000 * rank + 100 * step + k)
    x = torch.randn(8, 4, generator=generator, dtype=torch.float64)
    y = torch.randn(8, 2, generator=generator, dtype=torch.float64)
    return x, y


def loss_fn(model, rank, step, k, scenario):
    x, y = batch(rank, step, k)
    # With 'unused', only rank 0 uses the extra layer: the others still take part in its
    # allreduce, with zeros.
    use_extra = not scenario.get('unused') or rank == 0
    return torch.nn.functional.mse_loss(model(x, use_extra), y)


SCENARIOS = {
    'average': {},
    'sum': {'op': 'Sum'},
    'backward_passes_per_step': {'backward_passes_per_step': 2},
    'int_groups': {'groups': 2},
    'explicit_groups': {'groups': 'explicit'},
    'num_groups': {'num_groups': 3},
    'predivide': {'gradient_predivide_factor': 2.0},
    'fp16': {'compression': 'fp16'},
    'bf16': {'compression': 'bf16'},
    'clip': {'clip': True},
    'unused': {'unused': True},
    'unused_grouped': {'unused': True, 'groups': 1},
}


def train_worker():
    import horovod.torch as hvd
    hvd.init()
    rank = hvd.rank()
    results = {}
    for name, scenario in SCENARIOS.items():
        model = Net()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        kwargs = {}
        if 'op' in scenario:
            kwargs['op'] = getattr(hvd, scenario['op'])
        if scenario.get('groups') == 'explicit':
            kwargs['groups'] = [[model.fc1.weight, model.fc2.weight], [model.extra.bias]]
        elif 'groups' in scenario:
            kwargs['groups'] = scenario['groups']
        if 'compression' in scenario:
            kwargs['compression'] = getattr(hvd.Compression, scenario['compression'])
        for key in ('backward_passes_per_step', 'gradient_predivide_factor', 'num_groups'):
            if key in scenario:
                kwargs[key] = scenario[key]
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', DeprecationWarning)
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                           **kwargs)
        for step in range(STEPS):
            opt.zero_grad()
            for k in range(scenario.get('backward_passes_per_step', 1)):
                loss_fn(model, rank, step, k, scenario).backward()
            if scenario.get('clip'):
                opt.synchronize()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
                with opt.skip_synchronize():
                    opt.step()
            else:
                opt.step()
        results[name] = [p.detach().clone() for p in model.parameters()]
    return results


def reference(scenario, size):
    """Plain torch in one process: each rank's gradient computed in turn, then combined."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    params = list(model.parameters())
    for step in range(STEPS):
        total = [torch.zeros_like(p) for p in params]
        for rank in range(size):
            model.zero_grad()
            for k in range(scenario.get('backward_passes_per_step', 1)):
                loss_fn(model, rank, step, k, scenario).backward()
            for t, p in zip(total, params, strict=True):
                if p.grad is not None:
                    t += p.grad
        for t, p in zip(total, params, strict=True):
            p.grad = t if scenario.get('op') == 'Sum' else t / size
        if scenario.get('clip'):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        opt.step()
    return params


@pytest.mark.parametrize('name', list(SCENARIOS))
def test_training_matches_reference(job, name):
    size, results = job('trained')
    expected = reference(SCENARIOS[name], size)
    # float64 model; fp16 compression rounds every gradient to about 3 decimal digits, bf16 to
    # about 2 to 3.
    tol = {'fp16': 2e-3, 'bf16': 1e-2}.get(name, 1e-10)
    for rank, per_rank in enumerate(results):
        for got, want in zip(per_rank[name], expected, strict=True):
            torch.testing.assert_close(got, want.detach(), rtol=tol, atol=tol,
                                       msg=f'{name}: rank {rank} differs from the reference')
        # Bitwise identical across ranks, whatever the tolerance to the reference.
        for got, first in zip(per_rank[name], results[0][name], strict=True):
            assert torch.equal(got, first), f'{name}: rank {rank} differs from rank 0'


def behaviour_worker():
    import horovod.torch as hvd
    hvd.init()
    rank = hvd.rank()
    out = {}
    model = Net()
    # Built under no_grad (the hooks must still be installed).
    with torch.no_grad():
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                       named_parameters=model.named_parameters())
    out['names'] = sorted(opt._parameter_names.values())
    out['class'] = (type(opt).__name__, isinstance(opt, torch.optim.SGD),
                    type(opt).__module__)

    # zero_grad() between backward() and step() races with the allreduce.
    loss_fn(model, rank, 0, 0, {}).backward()
    try:
        opt.zero_grad()
        out['zero_grad'] = None
    except AssertionError as e:
        out['zero_grad'] = str(e)
    opt.step()

    # A second backward before step() with backward_passes_per_step=1.
    opt.zero_grad()
    loss_fn(model, rank, 1, 0, {}).backward()
    try:
        loss_fn(model, rank, 1, 1, {}).backward()
        out['too_many_passes'] = None
    except AssertionError as e:
        out['too_many_passes'] = str(e)
    opt.synchronize()

    # step() after an explicit synchronize() outside skip_synchronize() warns.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        opt.step()
    out['warnings'] = [str(w.message) for w in caught if w.category is UserWarning]

    # After set_backward_passes_per_step(2), two passes per step are fine.
    opt.set_backward_passes_per_step(2)
    opt.zero_grad()
    for k in range(2):
        loss_fn(model, rank, 2, k, {}).backward()
    opt.step()

    # load_state_dict() forgets handles left by a backward pass without step().
    loss_fn(model, rank, 3, 0, {}).backward()
    opt.load_state_dict(opt.state_dict())
    out['handles_after_load'] = len(opt._handles)
    opt.zero_grad()

    default = hvd.DistributedOptimizer(torch.optim.SGD(Net().parameters(), lr=LR))
    out['default_names'] = sorted(default._parameter_names.values())
    return out


def test_optimizer_behaviour(job):
    size, results = job('behaviour')
    for out in results:
        assert out['names'] == results[0]['names']
        assert len(set(out['names'])) == len(out['names']) == 6
        assert out['class'] == ('SGD', True, 'horovod.torch.optimizer')
        if size > 1:
            assert 'zero_grad' in out['zero_grad']
            assert 'backward_passes_per_step' in out['too_many_passes']
        else:
            # One rank: no hooks are installed, so nothing is in flight to race with.
            assert out['zero_grad'] is None and out['too_many_passes'] is None
        assert len(out['warnings']) == 1
        assert 'optimizer.step() called without optimizer.skip_synchronize()' in \
            out['warnings'][0]
        assert out['handles_after_load'] == 0
        assert out['default_names'] == [f'allreduce.noname.0.{i}' for i in range(6)]


def validation_worker():
    import horovod.torch as hvd
    hvd.init()
    model = Net()

    def sgd():
        return torch.optim.SGD(model.parameters(), lr=LR)

    errors = {}
    cases = {
        'predivide_with_sum': dict(op=hvd.Sum, gradient_predivide_factor=2.0),
        'zero_passes': dict(backward_passes_per_step=0),
        'groups_zero': dict(groups=0),
        'groups_str': dict(groups='two'),
        'groups_non_tensor': dict(groups=[[1, 2]]),
        'groups_twice': dict(groups=[[model.fc1.weight], [model.fc1.weight]]),
        'groups_foreign': dict(groups=[[torch.nn.Parameter(torch.ones(2))]]),
        'not_tuples': dict(named_parameters=list(model.parameters())),
        'duplicates': dict(named_parameters=[('w', p) for p in model.parameters()]),
        'unnamed': dict(named_parameters=list(model.named_parameters())[:2]),
    }
    for name, kwargs in cases.items():
        try:
            hvd.DistributedOptimizer(sgd(), **kwargs)
            errors[name] = None
        except (ValueError, NotImplementedError) as e:
            errors[name] = (type(e).__name__, str(e))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        hvd.DistributedOptimizer(sgd(), num_groups=2)
    errors['num_groups'] = [w.category.__name__ for w in caught]
    return errors


def test_argument_validation(job):
    for errors in job('validation')[1]:
        check_validation(errors)


def check_validation(errors):
    assert errors['predivide_with_sum'][0] == 'ValueError'
    for name in ('zero_passes', 'groups_zero', 'groups_str', 'groups_non_tensor', 'groups_twice',
                 'groups_foreign', 'not_tuples', 'duplicates', 'unnamed'):
        assert errors[name] is not None and errors[name][0] == 'ValueError', name
    assert 'w' in errors['duplicates'][1]
    assert 'ids' in errors['unnamed'][1]
    assert errors['num_groups'] == ['DeprecationWarning']


WORKERS = {'trained': train_worker, 'behaviour': behaviour_worker,
           'validation': validation_worker}
job = job_fixture(WORKERS)


def test_requires_init():
    import horovod.torch as hvd
    with pytest.raises(ValueError, match='(?i)init'):
        hvd.DistributedOptimizer(torch.optim.SGD(Net().parameters(), lr=LR))
