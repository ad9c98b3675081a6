"""DistributedOptimizer options beyond test_optimizer.py: sparse gradients (allgathered, or
densified), parameters whose requires_grad changes, unused parameters with local accumulation
and groups, several param groups without names, and a process set that leaves a rank out. Each
rank's parameters after a few steps must equal a single-process reference that combines the
ranks' gradients itself."""

import pytest
import torch
from jobs import job_fixture

STEPS = 3
LR = 0.05


class Net(torch.nn.Module):
    """An embedding (sparse gradients when asked), two linear layers, and ``extra``, used in
    the forward pass only when asked."""

    def __init__(self, sparse=False):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(10, 4, sparse=sparse)
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 2)
        self.extra = torch.nn.Linear(4, 2)
        self.double()

    def forward(self, ids, use_extra=True):
        x = self.emb(ids)
        out = self.fc2(torch.tanh(self.fc1(x)))
        return out + self.extra(x) if use_extra else out


def loss_fn(model, rank, step, k, scenario):
    generator = torch.Generator().manual_seed(10_000 * rank + 100 * step + k)
    # Few distinct ids per batch, repeated: sparse gradients with duplicate indices.
    ids = torch.randint(0, 10, (8,), generator=generator)
    y = torch.randn(8, 2, generator=generator, dtype=torch.float64)
    use_extra = not scenario.get('unused') or rank == 0
    return torch.nn.functional.mse_loss(model(ids, use_extra), y)


def make_optimizer(model, scenario):
    if scenario.get('param_groups'):
        return torch.optim.Adam([
            {'params': list(model.emb.parameters()) + list(model.fc1.parameters())},
            {'params': list(model.fc2.parameters()) + list(model.extra.parameters()),
             'lr': LR / 2}], lr=LR)
    # SGD without momentum takes sparse gradients as they are.
    momentum = 0.0 if scenario.get('sparse') else 0.9
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=momentum)


SCENARIOS = {
    'sparse': {'sparse': True},
    'sparse_as_dense': {'sparse': True, 'sparse_as_dense': True},
    'dynamic_requires_grad': {'freeze_after': 1},
    'unused_accumulated_grouped': {'unused': True, 'backward_passes_per_step': 2,
                                   'groups': 'explicit'},
    'unused_int_groups': {'unused': True, 'groups': 3},
    'param_groups_unnamed': {'param_groups': True},
    'process_set': {'process_set': True},
}


def set_members(size):
    """The ranks of the 'process_set' scenario: all but the last one (a set of all ranks would
    duplicate the global set)."""
    return list(range(size - 1))


def train_worker():
    import horovod.torch as hvd
    hvd.init(process_sets='dynamic')
    rank, size = hvd.rank(), hvd.size()
    results = {'sparse_grad_layout': None}
    for name, scenario in SCENARIOS.items():
        if scenario.get('process_set') and size == 1:
            continue
        model = Net(sparse=scenario.get('sparse', False))
        opt = make_optimizer(model, scenario)
        kwargs = {'sparse_as_dense': scenario.get('sparse_as_dense', False),
                  'backward_passes_per_step': scenario.get('backward_passes_per_step', 1)}
        if not scenario.get('param_groups'):
            kwargs['named_parameters'] = model.named_parameters()
        if scenario.get('groups') == 'explicit':
            kwargs['groups'] = [[model.fc1.weight, model.extra.weight, model.fc2.bias]]
        elif 'groups' in scenario:
            kwargs['groups'] = scenario['groups']
        if scenario.get('process_set'):
            kwargs['process_set'] = hvd.add_process_set(set_members(size))
        opt = hvd.DistributedOptimizer(opt, **kwargs)
        for step in range(STEPS):
            if scenario.get('freeze_after') == step:
                model.fc1.weight.requires_grad_(False)
            opt.zero_grad()
            for k in range(scenario.get('backward_passes_per_step', 1)):
                loss_fn(model, rank, step, k, scenario).backward()
            opt.step()
            if name == 'sparse' and step == 0:
                results['sparse_grad_layout'] = str(model.emb.weight.grad.layout)
        results[name] = [p.detach().clone() for p in model.parameters()]
        if scenario.get('process_set'):
            hvd.remove_process_set(kwargs['process_set'])
    return results


def reference(scenario, ranks):
    """Plain torch in one process: the gradients of ``ranks`` computed in turn and averaged.
    A parameter with no gradient on any rank gets zeros, as the distributed optimizer gives it
    (its allreduce still runs, with every rank contributing zeros)."""
    model = Net()
    opt = make_optimizer(model, scenario)
    params = list(model.parameters())
    for step in range(STEPS):
        if scenario.get('freeze_after') == step:
            model.fc1.weight.requires_grad_(False)
        total = [torch.zeros_like(p) for p in params]
        for rank in ranks:
            model.zero_grad()
            for k in range(scenario.get('backward_passes_per_step', 1)):
                loss_fn(model, rank, step, k, scenario).backward()
            for t, p in zip(total, params, strict=True):
                if p.grad is not None:
                    t += p.grad
        for t, p in zip(total, params, strict=True):
            # One rank: no hooks, so the wrapped optimizer sees the local gradients as they are.
            p.grad = None if len(ranks) == 1 and p.grad is None else t / len(ranks)
        opt.step()
    return params


job = job_fixture({'trained': train_worker})


@pytest.mark.parametrize('name', list(SCENARIOS))
def test_training_matches_reference(job, name):
    size, results = job('trained')
    scenario = SCENARIOS[name]
    if scenario.get('process_set') and size == 1:
        pytest.skip('a process set that leaves a rank out needs two ranks or more')
    for rank, per_rank in enumerate(results):
        ranks = list(range(size))
        if scenario.get('process_set'):
            members = set_members(size)
            ranks = members if rank in members else [rank]
        expected = reference(scenario, ranks)
        for got, want in zip(per_rank[name], expected, strict=True):
            torch.testing.assert_close(got, want.detach(), rtol=1e-10, atol=1e-10,
                                       msg=f'{name}: rank {rank} differs from the reference')


def test_sparse_gradient_stays_sparse(job):
    size, results = job('trained')
    for per_rank in results:
        assert per_rank['sparse_grad_layout'] == 'torch.sparse_coo'
