"""DistributedOptimizer with op=Adasum (torch.md §7.2): what holds without running an Adasum
reduction: the class chosen, names, checks, synchronize() and skip_synchronize()."""

import torch
from jobs import job_fixture


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 2)


def construction_worker():
    import horovod.torch as hvd
    hvd.init(process_sets='dynamic')
    size = hvd.size()
    out = {}
    model = Net()
    opt = hvd.DistributedOptimizer(torch.optim.SGD([
        {'params': model.fc1.parameters()}, {'params': model.fc2.parameters()}], lr=0.1),
        op=hvd.Adasum)
    out['class'] = (type(opt).__name__, isinstance(opt, torch.optim.SGD), type(opt).__module__)
    out['names'] = sorted(opt._parameter_names.values())
    out['synchronize'] = opt.synchronize()
    try:
        with opt.skip_synchronize():
            pass
        out['skip_synchronize'] = None
    except AssertionError as e:
        out['skip_synchronize'] = str(e)
    try:
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum,
                                 gradient_predivide_factor=2.0)
        out['predivide'] = None
    except ValueError as e:
        out['predivide'] = str(e)
    if size > 1:
        subset = hvd.add_process_set(list(range(size - 1)))
        try:
            hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     op=hvd.Adasum, process_set=subset)
            out['process_set'] = None
        except NotImplementedError as e:
            out['process_set'] = str(e)
        hvd.remove_process_set(subset)
    return out


job = job_fixture({'construction': construction_worker})


def test_adasum_construction(job):
    size, results = job('construction')
    for out in results:
        assert out['class'] == ('SGD', True, 'horovod.torch.optimizer')
        assert out['synchronize'] is None
        assert 'predivide' in out['predivide']
        if size > 1:
            # Positions restart in each param group.
            assert out['names'] == ['allreduce.noname.0', 'allreduce.noname.0',
                                    'allreduce.noname.1', 'allreduce.noname.1']
            assert 'Adasum' in out['skip_synchronize']
            assert 'process set' in out['process_set']
        else:
            # One rank: the plain distributed optimizer (nothing to combine).
            assert out['names'] == ['allreduce.noname.0.0', 'allreduce.noname.0.1',
                                    'allreduce.noname.1.0', 'allreduce.noname.1.1']
            assert out['skip_synchronize'] is None
