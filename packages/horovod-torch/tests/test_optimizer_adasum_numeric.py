"""DistributedOptimizer with op=Adasum at np=2 (a power of two, as the core's Adasum needs):
each rank steps locally, and the parameter changes are combined per tensor with
Adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b
(Maleki et al., MLSys 2021); compared with that formula computed in one process."""

import torch
from jobs import job_fixture

STEPS = 3
LR = 0.1


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 2)
        self.extra = torch.nn.Linear(4, 2)
        self.double()

    def forward(self, x, use_extra):
        out = self.fc2(torch.tanh(self.fc1(x)))
        return out + self.extra(x) if use_extra else out


def loss_fn(model, rank, step, k):
    generator = torch.Generator().manual_seed(10_000 * rank + 100 * step + k)
    x = torch.randn(8, 4, generator=generator, dtype=torch.float64)
    y = torch.randn(8, 2, generator=generator, dtype=torch.float64)
    # Only rank 0 uses ``extra``: rank 1's delta for it is zero.
    return torch.nn.functional.mse_loss(model(x, use_extra=rank == 0), y)


SCENARIOS = {'plain': {}, 'accumulated': {'backward_passes_per_step': 2},
             'closure': {'closure': True},
             # Default names repeat across param groups; the allreduces must not collide.
             'param_groups_unnamed': {'param_groups': True}}


def train_worker():
    import horovod.torch as hvd
    hvd.init()
    rank = hvd.rank()
    results = {}
    for name, scenario in SCENARIOS.items():
        model = Net()
        passes = scenario.get('backward_passes_per_step', 1)
        if scenario.get('param_groups'):
            base = torch.optim.SGD([{'params': model.fc1.parameters()},
                                    {'params': list(model.fc2.parameters())
                                     + list(model.extra.parameters())}], lr=LR)
            named = None
        else:
            base = torch.optim.SGD(model.parameters(), lr=LR)
            named = model.named_parameters()
        opt = hvd.DistributedOptimizer(base, named_parameters=named, op=hvd.Adasum,
                                       backward_passes_per_step=passes)
        # Its zero-gradient step must bypass the Adasum step (no allreduce, no change).
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        losses = []
        for step in range(STEPS):
            opt.zero_grad()
            if scenario.get('closure'):
                def closure(model=model, step=step):
                    loss = loss_fn(model, rank, step, 0)
                    loss.backward()
                    return loss
                losses.append(opt.step(closure).item())
            else:
                for k in range(passes):
                    loss_fn(model, rank, step, k).backward()
                opt.step()
        results[name] = ([p.detach().clone() for p in model.parameters()], losses)
    return results


def adasum(a, b):
    dot = torch.dot(a.flatten(), b.flatten())
    na, nb = torch.dot(a.flatten(), a.flatten()), torch.dot(b.flatten(), b.flatten())
    ca = 1 - dot / (2 * na) if na > 0 else 1.0
    cb = 1 - dot / (2 * nb) if nb > 0 else 1.0
    return ca * a + cb * b


def reference(scenario):
    model = Net()
    params = list(model.parameters())
    passes = scenario.get('backward_passes_per_step', 1)
    for step in range(STEPS):
        deltas = []
        for rank in range(2):
            model.zero_grad()
            for k in range(passes):
                loss_fn(model, rank, step, k).backward()
            deltas.append([-LR * p.grad if p.grad is not None else torch.zeros_like(p)
                           for p in params])
        with torch.no_grad():
            for p, a, b in zip(params, *deltas, strict=True):
                p += adasum(a, b)
    return params


job = job_fixture({'trained': train_worker}, sizes=(2,))


def test_adasum_matches_reference(job):
    _, results = job('trained')
    for name, scenario in SCENARIOS.items():
        expected = reference(scenario)
        for rank, per_rank in enumerate(results):
            for got, want in zip(per_rank[name][0], expected, strict=True):
                torch.testing.assert_close(got, want.detach(), rtol=1e-8, atol=1e-10,
                                           msg=f'{name}: rank {rank} differs')
        if scenario.get('closure'):
            assert all(len(per_rank[name][1]) == STEPS for per_rank in results)
