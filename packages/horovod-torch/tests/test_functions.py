"""broadcast_parameters, broadcast_optimizer_state, broadcast_object and allgather_object.

One job per world size runs every worker body below; each test checks its part of the results.
"""

import pytest
import torch
from jobs import job_fixture


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def broadcast_parameters_worker():
    import horovod.torch as hvd
    hvd.init()
    rank = hvd.rank()
    root = hvd.size() - 1
    results = {}

    model = make_model(seed=rank)
    hvd.broadcast_parameters(model.state_dict(), root_rank=root)
    results['state_dict'] = {k: v.clone() for k, v in model.state_dict().items()}

    model = make_model(seed=rank)
    hvd.broadcast_parameters(list(model.named_parameters()), root_rank=root)
    results['named'] = [p.detach().clone() for p in model.parameters()]

    tensors = [torch.full((2, 2), float(rank)), torch.arange(3) * (rank + 1)]
    hvd.broadcast_parameters(tensors, root_rank=root)
    results['plain'] = tensors

    errors = []
    for bad in (model.parameters(), torch.ones(2), 'weights'):
        try:
            hvd.broadcast_parameters(bad, root_rank=root)
        except ValueError as e:
            errors.append(str(e))
    results['errors'] = errors
    return results


def test_broadcast_parameters(job):
    np_, results = job('parameters')
    root = np_ - 1
    expected_model = make_model(seed=root)
    for per_rank in results:
        for key, value in expected_model.state_dict().items():
            assert torch.equal(per_rank['state_dict'][key], value)
        for got, want in zip(per_rank['named'], expected_model.parameters(), strict=True):
            assert torch.equal(got, want)
        assert torch.equal(per_rank['plain'][0], torch.full((2, 2), float(root)))
        assert torch.equal(per_rank['plain'][1], torch.arange(3) * (root + 1))
        assert len(per_rank['errors']) == 3
        assert 'generator' in per_rank['errors'][0]
        assert 'Tensor' in per_rank['errors'][1]
        assert 'str' in per_rank['errors'][2]


def optimizer_state_worker():
    return {(optimizer_name, wrap): optimizer_state(optimizer_name, wrap)
            for optimizer_name in ('sgd', 'adam') for wrap in (False, True)}


def optimizer_state(optimizer_name, wrap):
    import horovod.torch as hvd
    hvd.init()
    rank = hvd.rank()
    model = make_model(seed=rank)
    if optimizer_name == 'sgd':
        base = torch.optim.SGD
        opt = base(model.parameters(), lr=0.1 * (rank + 1), momentum=0.5 + 0.1 * rank)
    else:
        base = torch.optim.Adam
        opt = base(model.parameters(), lr=0.01 * (rank + 1), betas=(0.8 + 0.01 * rank, 0.999),
                   weight_decay=0.01 * rank, amsgrad=True)
    if wrap:
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    # Give the ranks different states: a different number of local steps on different
    # gradients, set directly and stepped with the base class so that nothing is allreduced.
    torch.manual_seed(100 + rank)
    for _ in range(rank + 1):
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        base.step(opt)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    return opt.state_dict()


@pytest.mark.parametrize('optimizer_name', ['sgd', 'adam'])
@pytest.mark.parametrize('wrap', [False, True])
def test_broadcast_optimizer_state(job, optimizer_name, wrap):
    _, results = job('optimizer_state')
    results = [per_rank[(optimizer_name, wrap)] for per_rank in results]
    root = results[0]
    for state_dict in results[1:]:
        assert state_dict['param_groups'] == root['param_groups']
        for index, group in enumerate(state_dict['param_groups']):
            for key, value in group.items():
                assert type(value) is type(root['param_groups'][index][key]), key
        assert state_dict['state'].keys() == root['state'].keys()
        for pid, state in state_dict['state'].items():
            assert state.keys() == root['state'][pid].keys()
            for key, value in state.items():
                if torch.is_tensor(value):
                    assert torch.equal(value, root['state'][pid][key]), (pid, key)
                else:
                    assert value == root['state'][pid][key], (pid, key)


def fresh_optimizer_worker():
    import horovod.torch as hvd
    hvd.init()
    model = make_model(seed=hvd.rank())
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    # No step taken yet: the state is created by one step on zero gradients, without allreduce.
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    try:
        hvd.broadcast_optimizer_state(torch.optim.LBFGS(model.parameters()), root_rank=0)
        lbfgs_error = None
    except ValueError as e:
        lbfgs_error = str(e)
    return opt.state_dict(), [p.detach().clone() for p in model.parameters()], lbfgs_error


def test_broadcast_optimizer_state_initialises_empty_state(job):
    _, results = job('fresh_optimizer')
    for state_dict, params, lbfgs_error in results:
        assert len(state_dict['state']) == 4
        for state in state_dict['state'].values():
            assert torch.count_nonzero(state['momentum_buffer']) == 0
        for got, want in zip(params, results[0][1], strict=True):
            assert torch.equal(got, want)
        assert 'LBFGS' in lbfgs_error


class Payload:
    """A user-defined class, pickled by value from the test module."""

    def __init__(self, rank):
        self.rank = rank
        self.data = {'rank': rank, 'list': list(range(rank + 1)), 'text': 'x' * (10 * rank)}


def objects_worker():
    import horovod.torch as hvd
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    root = size - 1
    obj = hvd.broadcast_object(Payload(rank), root_rank=root)
    default_root = hvd.broadcast_object({'from': rank})
    gathered = hvd.allgather_object(Payload(rank).data)
    named = hvd.allgather_object(rank * 10, name='ints')
    return obj.rank, obj.data, default_root, gathered, named


def test_broadcast_and_allgather_object(job):
    np_, results = job('objects')
    for obj_rank, obj_data, default_root, gathered, named in results:
        assert obj_rank == np_ - 1
        assert obj_data == Payload(np_ - 1).data
        assert default_root == {'from': 0}
        assert gathered == [Payload(r).data for r in range(np_)]
        assert named == [10 * r for r in range(np_)]


WORKERS = {'parameters': broadcast_parameters_worker, 'optimizer_state': optimizer_state_worker,
           'fresh_optimizer': fresh_optimizer_worker, 'objects': objects_worker}


job = job_fixture(WORKERS)
