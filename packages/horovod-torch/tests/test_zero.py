"""ZeroRedundancyOptimizer (ZeRO stage 1): ranks training on different data end with the parameters
hvd.DistributedOptimizer(AdamW) gives, while each holds a 1/N share of AdamW's state; the
consolidated state reloads at other world sizes; process sets; add_param_group; schedulers.

One job at np 2 and one at np 4 run every worker body (see jobs.py); the world-size-1 reload runs
in this process."""

import copy
import os
import pathlib
import sys
import tempfile

import numpy as np
import pytest
import torch
from horovod_testing import run_ranks

from horovod.torch.zero import partition_parameters

STEPS = 20
LR = 1e-2
WIDTH = 32
LAYERS = 8


def make_model():
    """Eight equal layers, so that a whole-parameter partition can balance at np 4."""
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers)


def batch(rank, step):
    generator = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(16, WIDTH, generator=generator), torch.randn(16, WIDTH, generator=generator)


def train(model, opt, rank, steps, scheduler=None, first=0):
    for step in range(first, first + steps):
        opt.zero_grad()
        x, y = batch(rank, step)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()


def state_bytes(opt):
    """Bytes of the optimizer state tensors this rank holds."""
    return sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values() if torch.is_tensor(v))


def max_diff(a, b):
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters(), strict=True))


def params(model):
    return [p.detach().clone() for p in model.parameters()]


def compare_with_distributed_optimizer(hvd, process_set, rank_in_data, bucket_bytes=None):
    """20 AdamW steps (with a StepLR schedule) through ZeRO and through DistributedOptimizer.
    ``bucket_bytes``: small values split a step into many exchanges (the default: one)."""
    zero_model, ref_model = make_model(), make_model()
    zero = hvd.ZeroRedundancyOptimizer(zero_model.parameters(), torch.optim.AdamW, process_set=process_set,
                                       lr=LR, weight_decay=0.05)
    if bucket_bytes is not None:
        zero.bucket_bytes = bucket_bytes
    ref = hvd.DistributedOptimizer(torch.optim.AdamW(ref_model.parameters(), lr=LR, weight_decay=0.05),
                                   named_parameters=ref_model.named_parameters(), process_set=process_set)
    train(zero_model, zero, rank_in_data, STEPS, torch.optim.lr_scheduler.StepLR(zero, 5, 0.5))
    train(ref_model, ref, rank_in_data, STEPS, torch.optim.lr_scheduler.StepLR(ref, 5, 0.5))
    return {'diff': max_diff(zero_model, ref_model), 'params': params(zero_model),
            'zero_state': state_bytes(zero), 'full_state': state_bytes(ref),
            'lr': zero.param_groups[0]['lr'], 'ref_lr': ref.param_groups[0]['lr']}


def add_param_group_run(hvd, rank, size):
    """ZeRO starts with the first half of the layers and gets the rest (another lr) after 5 steps;
    the reference is plain AdamW in this process over every rank's gradients, averaged."""
    def split(model):
        ps = list(model.parameters())
        return ps[:LAYERS], ps[LAYERS:]

    zero_model, ref_model = make_model(), make_model()
    first, second = split(zero_model)
    zero = hvd.ZeroRedundancyOptimizer(first, torch.optim.AdamW, lr=LR)
    zero.bucket_bytes = 1000
    ref_first, ref_second = split(ref_model)
    ref = torch.optim.AdamW(ref_first, lr=LR)
    for step in range(10):
        if step == 5:
            zero.add_param_group({'params': second, 'lr': LR / 2})
            ref.add_param_group({'params': ref_second, 'lr': LR / 2})
        train(zero_model, zero, rank, 1, first=step)
        ref.zero_grad()
        grads = [torch.zeros_like(p) for p in ref_model.parameters()]
        for r in range(size):
            ref_model.zero_grad()
            x, y = batch(r, step)
            torch.nn.functional.mse_loss(ref_model(x), y).backward()
            for g, p in zip(grads, ref_model.parameters(), strict=True):
                g += p.grad
        for g, p in zip(grads, ref_model.parameters(), strict=True):
            p.grad = g / size
        ref.step()
    return max_diff(zero_model, ref_model)


def checkpoint_run(hvd, rank):
    """Trains, consolidates on rank 0, writes the state to a file every rank reads, and compares
    one more step (same batch on every rank) of the trained optimizer with one of a fresh
    optimizer that loaded the file."""
    model = make_model()
    zero = hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=LR)
    train(model, zero, rank, 5)
    out = {}
    try:
        zero.state_dict()
        out['unconsolidated'] = None
    except RuntimeError as e:
        out['unconsolidated'] = str(e)
    zero.consolidate_state_dict(to=0)
    path = os.path.join(tempfile.gettempdir(), 'zero.pt')
    if rank == 0:
        state = zero.state_dict()
        torch.save(state, path)
        out['state'] = state
    else:
        try:
            zero.state_dict()
            out['not_root'] = None
        except RuntimeError as e:
            out['not_root'] = str(e)
    hvd.barrier()
    loaded = torch.load(path, weights_only=True)
    before = params(model)

    x, y = batch(99, 0)
    zero.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    zero.step()
    out['before'] = before
    out['continued'] = params(model)

    fresh = make_model()
    with torch.no_grad():
        for p, q in zip(fresh.parameters(), before, strict=True):
            p.copy_(q)
    reloaded = hvd.ZeroRedundancyOptimizer(fresh.parameters(), torch.optim.AdamW, lr=LR)
    reloaded.load_state_dict(loaded)
    torch.nn.functional.mse_loss(fresh(x), y).backward()
    reloaded.step()
    out['reloaded_diff'] = max_diff(model, fresh)
    return out


def errors(hvd):
    model = make_model()
    out = {}
    for name, call in [
        ('class', lambda: hvd.ZeroRedundancyOptimizer(model.parameters(), torch.nn.Linear, lr=LR)),
        ('to', lambda: hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD, lr=LR)
         .consolidate_state_dict(to=hvd.size())),
        ('groups', lambda: hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD, lr=LR)
         .load_state_dict({'state': {}, 'param_groups': []})),
        ('dtype', lambda: hvd.ZeroRedundancyOptimizer([torch.zeros(2, dtype=torch.int64)], torch.optim.SGD, lr=LR)),
    ]:
        try:
            call()
            out[name] = None
        except ValueError as e:
            out[name] = str(e)
    return out


def zero_worker():
    import horovod.torch as hvd
    size = int(os.environ['HOROVOD_SIZE'])
    # At np 4 the pairs {0, 2} and {1, 3} also train, each on its own set, at the same time.
    pairs = [hvd.ProcessSet([0, 2]), hvd.ProcessSet([1, 3])] if size == 4 else []
    hvd.init(process_sets=pairs)
    rank = hvd.rank()
    out = {'global': compare_with_distributed_optimizer(hvd, hvd.global_process_set, rank)}
    if pairs:
        pair = pairs[rank % 2]
        # 1000 B: each bucket holds one parameter (or a few biases) per owner.
        out['pair'] = compare_with_distributed_optimizer(hvd, pair, rank, bucket_bytes=1000)
        out['pair_ranks'] = pair.ranks
        hvd.barrier()  # the pairs finish at different times; a rank that leaves ends the job
        return out
    out['add_param_group'] = add_param_group_run(hvd, rank, size)
    out['checkpoint'] = checkpoint_run(hvd, rank)
    out['errors'] = errors(hvd)
    return out


@pytest.fixture(scope='module')
def jobs():
    """The np 2 and np 4 jobs, each started on first use."""
    started = {}

    def job(size):
        if size not in started:
            started[size] = run_ranks(size, zero_worker, timeout=180)
        return started[size]

    return job


@pytest.mark.parametrize('size', [2, 4])
def test_matches_distributed_optimizer(jobs, size):
    results = jobs(size)
    for rank, r in enumerate(results):
        assert r['global']['diff'] <= 1e-6, f'rank {rank}: {r["global"]["diff"]}'
        # The scheduler drove the wrapped optimizer's lr: 20 steps of StepLR(5, 0.5).
        assert r['global']['lr'] == r['global']['ref_lr'] == pytest.approx(LR / 16)
        for p, q in zip(r['global']['params'], results[0]['global']['params'], strict=True):
            assert torch.equal(p, q), f'rank {rank} differs from rank 0'


@pytest.mark.parametrize('size, limit', [(2, 0.6), (4, 0.35)])
def test_state_is_sharded(jobs, size, limit):
    results = jobs(size)
    for rank, r in enumerate(results):
        ratio = r['global']['zero_state'] / r['global']['full_state']
        assert 0 < ratio <= limit, f'rank {rank} holds {ratio:.3f} of the state at np {size}'
    # Together the ranks hold the whole state, once.
    assert sum(r['global']['zero_state'] for r in results) == results[0]['global']['full_state']


def test_process_sets(jobs):
    results = jobs(4)
    for rank, r in enumerate(results):
        assert rank in r['pair_ranks']
        assert r['pair']['diff'] <= 1e-6
        assert 0 < r['pair']['zero_state'] / r['pair']['full_state'] <= 0.6
        partner = results[r['pair_ranks'][0]]['pair']['params']
        for p, q in zip(r['pair']['params'], partner, strict=True):
            assert torch.equal(p, q)
    # The two pairs trained on different data: their models differ.
    assert not torch.equal(results[0]['pair']['params'][0], results[1]['pair']['params'][0])


def test_add_param_group_matches_reference(jobs):
    for rank, r in enumerate(jobs(2)):
        assert r['add_param_group'] <= 1e-6, f'rank {rank}: {r["add_param_group"]}'


def test_checkpoint_reloads_at_world_size_2(jobs):
    results = jobs(2)
    assert 'consolidate_state_dict' in results[0]['checkpoint']['unconsolidated']
    assert 'consolidate_state_dict' in results[1]['checkpoint']['not_root']
    state = results[0]['checkpoint']['state']
    # A whole AdamW state: every parameter, both moments.
    assert sorted(state['state']) == list(range(2 * LAYERS))
    assert all({'exp_avg', 'exp_avg_sq', 'step'} <= set(s) for s in state['state'].values())
    for r in results:
        assert r['checkpoint']['reloaded_diff'] == 0.0
        # The extra step moved the parameters (the comparison is not vacuous).
        assert max((a - b).abs().max().item()
                   for a, b in zip(r['checkpoint']['continued'], r['checkpoint']['before'], strict=True)) > 1e-4


@pytest.fixture
def one_rank():
    import horovod.torch as hvd
    hvd.init()
    yield hvd
    hvd.shutdown()


def test_checkpoint_reloads_at_world_size_1(jobs, one_rank):
    hvd = one_rank
    assert hvd.size() == 1
    checkpoint = jobs(2)[0]['checkpoint']
    x, y = batch(99, 0)
    results = {}
    for kind in ('zero', 'plain'):
        model = make_model()
        with torch.no_grad():
            for p, q in zip(model.parameters(), checkpoint['before'], strict=True):
                p.copy_(q)
        if kind == 'zero':
            opt = hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=LR)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=LR)
        # load_state_dict may keep the given tensors and step them in place: a copy each.
        opt.load_state_dict(copy.deepcopy(checkpoint['state']))
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        results[kind] = params(model)
        # The whole state is this rank's.
        if kind == 'zero':
            assert len(opt.state) == 2 * LAYERS
    for zero, plain, continued in zip(results['zero'], results['plain'], checkpoint['continued'], strict=True):
        assert torch.equal(zero, continued)
        torch.testing.assert_close(plain, continued, rtol=0, atol=1e-7)


def test_errors(jobs):
    errs = jobs(2)[0]['errors']
    assert 'torch.optim.Optimizer subclass' in errs['class']
    assert 'global rank in the process set' in errs['to']
    assert 'param_groups' in errs['groups'] or 'groups' in errs['groups']
    assert 'float16, float32 or float64' in errs['dtype']


def test_partition_is_greedy_by_size():
    # Sorted by size within a group; each to the least loaded rank; groups in order.
    # 40 -> 0, 30 -> 1, 20 -> 1 (30 < 40), 10 -> 0 (40 < 50).
    assert partition_parameters([[10, 40, 30, 20]], 2) == [[0, 0, 1, 1]]
    assert partition_parameters([[5, 5, 5], [100]], 3) == [[0, 1, 2], [0]]
    assert partition_parameters([[7, 3]], 1) == [[0, 0]]
    with pytest.raises(ValueError, match='positive number of ranks'):
        partition_parameters([[1]], 0)


ELASTIC_SCRIPT = pathlib.Path(__file__).resolve().parent / 'elastic_scripts' / 'zero_elastic_train.py'
ELASTIC_STEPS = 30


def elastic_reference():
    """The elastic script's training in one process: plain AdamW on each global batch."""
    sys.path.insert(0, str(ELASTIC_SCRIPT.parent))
    try:
        import zero_elastic_train as script
    finally:
        sys.path.pop(0)
    model = script.make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    for step in range(ELASTIC_STEPS):
        x, y = script.global_batch(step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().reshape(-1).tolist() for p in model.parameters()]


def test_elastic_reset_from_4_to_2_ranks_keeps_the_state(tmp_path):
    from horovod_testing.elastic import ElasticJob, check_finals, discovery_script
    script, set_hosts = discovery_script(str(tmp_path))
    # Two "hosts" of this machine (the engine tells them apart by name), two slots each.
    set_hosts(['localhost:2', '127.0.0.1:2'])
    args = ['--network-interface', 'lo', '-np', '4', '--min-np', '2', '--max-np', '4',
            '--host-discovery-script', script, sys.executable, str(ELASTIC_SCRIPT), str(ELASTIC_STEPS)]
    env = dict(os.environ, STEP_SLEEP='0.1', OMP_NUM_THREADS='1')
    with ElasticJob(args, env, timeout=240) as job:
        job.wait_for(lambda: sum(r['size'] == 4 and r['rank'] == 0 for r in job.steps()) >= 5, 'steps at size 4',
                     timeout=180)
        set_hosts(['localhost:2'])
        code, output = job.finish()
    assert code == 0, output
    assert job.sizes() == [4, 2], output
    # At 4 ranks each held the state of about a quarter of the 8 parameters, at 2 about half.
    held = {(r['size'], r['rank']): r['held'] for r in job.steps() if r['steps'] > 1}
    assert sum(v for (size, _), v in held.items() if size == 4) == 8
    assert all(v == 4 for (size, _), v in held.items() if size == 2), held
    finals = [r for _, r in job.records('FINAL')]
    assert sorted(r['rank'] for r in finals) == [0, 1] and all(r['held'] == 4 for r in finals), finals
    params = check_finals(job, key='params')
    for got, want in zip(params, elastic_reference(), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)
