"""horovod.lightning: Lightning's Trainer and Fabric on a real Horovod job at np 2 (CPU).

One job runs every scenario (each a short ``Trainer.fit`` or Fabric loop) on both ranks; the tests
check their parts of the results: identical parameters on every rank, the loss trajectory of
``strategy="ddp"`` (gloo) on the same data, ``sync_dist`` logging, gradient accumulation against a
doubled batch, checkpoint resumption, early stopping, uneven data, Fabric against a torch
reference, and the strategy's collectives."""

import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import warnings

import pytest
import torch
from horovod_testing import run_ranks, run_script

SAMPLES = 64
BATCH = 8
LR = 0.1


def dataset():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, 4, generator=generator)
    y = (x.sum(dim=1, keepdim=True) > 0).float() + 0.1 * torch.randn(SAMPLES, 1, generator=generator)
    return torch.utils.data.TensorDataset(x, y)


def make_net():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def params(module):
    return [p.detach().clone() for p in module.parameters()]


def lightning_module(optimizer='sgd', rank_values=None):
    """A LightningModule (defined here so that the test process need not import Lightning)."""
    import lightning.pytorch as pl

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = make_net()
            self.losses = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.losses.append(loss.item())
            self.log('loss', loss, on_step=False, on_epoch=True, sync_dist=True)
            self.log('rank_value', float(self.global_rank + 1), on_step=False, on_epoch=True, sync_dist=True)
            if rank_values is not None:
                # Not synced: each rank sees its own value (EarlyStopping's vote must agree).
                self.log('rank_val', float(rank_values[self.global_rank][self.current_epoch]),
                         on_step=False, on_epoch=True)
            return loss

        def configure_optimizers(self):
            if optimizer == 'adam':
                return torch.optim.Adam(self.parameters(), lr=0.01)
            if optimizer == 'zero':
                import horovod.torch as hvd
                return hvd.ZeroRedundancyOptimizer(self.parameters(), torch.optim.Adam, lr=0.01)
            return torch.optim.SGD(self.parameters(), lr=LR, momentum=0.9)

    return Module()


def trainer(strategy, **kwargs):
    import lightning.pytorch as pl
    # default_root_dir: where anything Lightning writes by default goes (not the working directory).
    options = dict(accelerator='cpu', devices=1, max_epochs=2, enable_progress_bar=False, logger=False,
                   enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
                   default_root_dir=os.path.join(os.environ.get('CHECKPOINT_DIR', '.'), 'root'))
    options.update(kwargs)
    return pl.Trainer(strategy=strategy, **options)


def loader(batch_size=BATCH, data=None):
    return torch.utils.data.DataLoader(data if data is not None else dataset(), batch_size=batch_size)


def fit(strategy, module=None, batch_size=BATCH, data=None, ckpt_path=None, **kwargs):
    module = module if module is not None else lightning_module()
    t = trainer(strategy, **kwargs)
    t.fit(module, loader(batch_size, data), ckpt_path=ckpt_path)
    return t, module


def run_trainer_scenarios(hvd, out):
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
    from lightning.pytorch.plugins.io import TorchCheckpointIO

    from horovod.lightning import HorovodStrategy

    rank = hvd.rank()
    t, module = fit(HorovodStrategy())
    out['hvd'] = {'losses': module.losses, 'params': params(module),
                  'loss': t.callback_metrics['loss'].item(), 'rank_value': t.callback_metrics['rank_value'].item(),
                  'epoch': t.current_epoch}
    strategy = t.strategy
    out['collectives'] = {
        'sum': strategy.reduce(torch.tensor([rank + 1.0, 2.0]), reduce_op='sum').tolist(),
        'mean': strategy.reduce(torch.tensor(rank + 1.0)).item(),
        'max': strategy.reduce(torch.tensor(rank + 1.0), reduce_op=torch.distributed.ReduceOp.MAX).item(),
        'gather': strategy.all_gather(torch.tensor([rank, 10 * rank])).tolist(),
        'broadcast': strategy.broadcast({'from': rank}, src=1),
        'any': strategy.reduce_boolean_decision(rank == 1, all=False),
        'all': strategy.reduce_boolean_decision(rank == 1, all=True),
        'passthrough': strategy.reduce(3.5),
    }
    strategy.barrier()
    try:
        strategy.reduce(torch.tensor(1.0), reduce_op='median')
        out['collectives']['bad_op'] = None
    except ValueError as e:
        out['collectives']['bad_op'] = str(e)

    # accumulate_grad_batches=2 on half batches: the same updates as the full batches above.
    _, module = fit(HorovodStrategy(), batch_size=BATCH // 2, accumulate_grad_batches=2)
    out['accumulate'] = params(module)

    # A checkpoint after epoch 1 of 2 (written by rank 0), resumed by a new Trainer.
    checkpoint_dir = os.environ['CHECKPOINT_DIR']
    saved = []

    class RecordingIO(TorchCheckpointIO):
        def save_checkpoint(self, checkpoint, path, storage_options=None):
            saved.append(os.path.basename(path))
            super().save_checkpoint(checkpoint, path, storage_options)

    checkpoints = ModelCheckpoint(dirpath=checkpoint_dir, filename='{epoch}', save_top_k=-1)
    _, full = fit(HorovodStrategy(checkpoint_io=RecordingIO()), lightning_module('adam'),
                  callbacks=[checkpoints], enable_checkpointing=True)
    _, resumed = fit(HorovodStrategy(), lightning_module('adam'),
                     ckpt_path=os.path.join(checkpoint_dir, 'epoch=0.ckpt'))
    out['checkpoint'] = {'saved': saved, 'full': params(full), 'resumed': params(resumed),
                         'files': sorted(os.listdir(checkpoint_dir))}

    # A ZeroRedundancyOptimizer from configure_optimizers: not wrapped again; Lightning's
    # checkpoint holds its whole state, consolidated on rank 0.
    zero_dir = os.path.join(checkpoint_dir, 'zero')
    _, zero = fit(HorovodStrategy(), lightning_module('zero'), enable_checkpointing=True,
                  callbacks=[ModelCheckpoint(dirpath=zero_dir, filename='{epoch}', save_top_k=-1)])
    hvd.barrier()
    state = torch.load(os.path.join(zero_dir, 'epoch=1.ckpt'), weights_only=False)['optimizer_states'][0]
    out['zero'] = {'params': params(zero), 'state_entries': len(state['state']),
                   'held': len(zero.trainer.optimizers[0].state)}

    # Early stopping: rank 0's metric stops improving after epoch 1, rank 1's keeps improving.
    values = [[3, 2, 2, 2, 2, 2], [3, 2, 1, 0, -1, -2]]
    t, _ = fit(HorovodStrategy(), lightning_module(rank_values=values), max_epochs=6, limit_train_batches=1,
               callbacks=[EarlyStopping(monitor='rank_val', patience=0, mode='min', check_on_train_epoch_end=True)])
    out['early_stopping'] = t.current_epoch

    # Uneven data, no DistributedSampler: rank 0 has 3 batches per epoch, rank 1 has 5.
    data = torch.utils.data.Subset(dataset(), range(0, (3 + 2 * rank) * BATCH))
    t, module = fit(HorovodStrategy(), data=data, use_distributed_sampler=False)
    out['uneven'] = {'params': params(module), 'steps': len(module.losses), 'epoch': t.current_epoch}

    try:
        fit(HorovodStrategy(), devices=2)
        out['devices_error'] = None
    except ValueError as e:
        out['devices_error'] = str(e)


def run_ddp(rank, out):
    """The same training as out['hvd'] under strategy='ddp' (gloo), this rank one of two nodes."""
    from lightning.fabric.plugins.environments import LightningEnvironment
    from lightning.pytorch.strategies import DDPStrategy
    os.environ.update({'MASTER_ADDR': '127.0.0.1', 'NODE_RANK': str(rank), 'LOCAL_RANK': '0'})
    strategy = DDPStrategy(process_group_backend='gloo', cluster_environment=LightningEnvironment())
    _, module = fit(strategy, num_nodes=2)
    out['ddp'] = {'losses': module.losses, 'params': params(module)}
    torch.distributed.destroy_process_group()


def run_fabric(hvd, out):
    from lightning.fabric import Fabric

    from horovod.lightning import HorovodFabricStrategy

    fabric = Fabric(accelerator='cpu', devices=1, strategy=HorovodFabricStrategy())
    fabric.launch()  # no launcher: horovodrun started the processes; this sets Horovod up
    net = make_net()
    model, opt = fabric.setup(net, torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9))
    data = fabric.setup_dataloaders(loader())
    batches = []
    for x, y in data:
        batches.append(x.clone())
        opt.zero_grad()
        fabric.backward(torch.nn.functional.mse_loss(model(x), y))
        opt.step()
    rank = hvd.rank()
    out['fabric'] = {
        'params': params(net), 'batches': batches,
        'sum': fabric.all_reduce(torch.tensor(rank + 1.0), reduce_op='sum').item(),
        'gather': fabric.all_gather(torch.tensor([rank])).tolist(),
        'broadcast': fabric.broadcast(f'rank {rank}', src=1),
        'is_global_zero': fabric.is_global_zero, 'world_size': fabric.world_size,
    }
    fabric.barrier()


def lightning_worker():
    import horovod.torch as hvd
    warnings.filterwarnings('ignore')
    hvd.init()
    out = {}
    run_trainer_scenarios(hvd, out)
    run_fabric(hvd, out)
    run_ddp(hvd.rank(), out)
    return out


@pytest.fixture(scope='module')
def results(tmp_path_factory):
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    checkpoint_dir = tmp_path_factory.mktemp('checkpoints')
    return run_ranks(2, lightning_worker, env={'MASTER_PORT': port, 'CHECKPOINT_DIR': checkpoint_dir}, timeout=300)


def assert_same(got, want, tol, what):
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=tol, msg=what)


def test_parameters_identical_on_every_rank(results):
    for key in ('hvd', 'uneven'):
        for p, q in zip(results[1][key]['params'], results[0][key]['params'], strict=True):
            assert torch.equal(p, q), key
    # Two epochs of four steps trained the model (the comparison is not vacuous).
    assert len(results[0]['hvd']['losses']) == 8
    start = params(make_net())
    assert max((p - q).abs().max().item() for p, q in zip(results[0]['hvd']['params'], start, strict=True)) > 1e-2


def test_loss_trajectory_equals_ddp(results):
    for rank, r in enumerate(results):
        hvd_losses, ddp_losses = r['hvd']['losses'], r['ddp']['losses']
        assert len(hvd_losses) == len(ddp_losses) == 8
        assert max(abs(a - b) for a, b in zip(hvd_losses, ddp_losses, strict=True)) <= 1e-5, rank
        assert_same(r['hvd']['params'], r['ddp']['params'], 1e-5, f'rank {rank}: parameters differ from ddp')
    # The ranks saw different data.
    assert results[0]['hvd']['losses'] != results[1]['hvd']['losses']


def test_sync_dist_logging_is_the_mean_over_ranks(results):
    # Last epoch (steps 4..7) of each rank, equal batches: the mean over every rank's batches.
    last_epoch = [loss for r in results for loss in r['hvd']['losses'][4:]]
    for r in results:
        assert r['hvd']['loss'] == pytest.approx(sum(last_epoch) / len(last_epoch), abs=1e-6)
        assert r['hvd']['rank_value'] == pytest.approx(1.5)


def test_accumulate_grad_batches_equals_a_doubled_batch(results):
    for r in results:
        assert_same(r['accumulate'], r['hvd']['params'], 1e-6, 'accumulate_grad_batches=2 differs')


def test_checkpoint_from_rank_0_resumes(results):
    assert results[0]['checkpoint']['saved'] == ['epoch=0.ckpt', 'epoch=1.ckpt']
    assert results[1]['checkpoint']['saved'] == []
    assert results[0]['checkpoint']['files'] == ['epoch=0.ckpt', 'epoch=1.ckpt']
    for r in results:
        assert_same(r['checkpoint']['resumed'], r['checkpoint']['full'], 1e-7, 'resumed run differs')


def test_zero_redundancy_optimizer_under_the_strategy(results):
    for r in results:
        # Adam sharded over the ranks trains as Adam under DistributedOptimizer.
        assert_same(r['zero']['params'], r['checkpoint']['full'], 1e-6, 'ZeRO differs from DistributedOptimizer')
        assert r['zero']['state_entries'] == 4  # the whole state: every parameter of the model
    # Sharded by size: the 32-element weight alone on one rank, the other three (8, 8, 1) on the other.
    assert sorted(r['zero']['held'] for r in results) == [1, 3]


def test_early_stopping_stops_every_rank_at_the_same_epoch(results):
    # Rank 0 alone stops after epoch 2 (no improvement on epoch 1's 2); rank 1 alone never would.
    assert [r['early_stopping'] for r in results] == [3, 3]


def test_uneven_data_does_not_hang(results):
    assert [r['uneven']['steps'] for r in results] == [6, 10]
    assert all(r['uneven']['epoch'] == 2 for r in results)


def test_strategy_collectives(results):
    for r in results:
        c = r['collectives']
        assert c['sum'] == [3.0, 4.0]
        assert c['mean'] == 1.5 and c['max'] == 2.0
        assert c['gather'] == [[0, 0], [1, 10]]
        assert c['broadcast'] == {'from': 1}
        assert c['any'] is True and c['all'] is False
        assert c['passthrough'] == 3.5
        assert 'reduce_op' in c['bad_op'] and 'median' in c['bad_op']
        assert 'devices=1' in r['devices_error']


def test_fabric_matches_torch_reference(results):
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    data = dataset()
    x_all, y_all = data.tensors
    per_rank = SAMPLES // 2
    for step in range(per_rank // BATCH):
        total = [torch.zeros_like(p) for p in net.parameters()]
        for rank in range(2):
            # DistributedSampler without shuffling: rank r takes samples r, r + 2, r + 4, ...
            index = torch.arange(rank, SAMPLES, 2)[step * BATCH:(step + 1) * BATCH]
            assert torch.equal(results[rank]['fabric']['batches'][step], x_all[index])
            net.zero_grad()
            torch.nn.functional.mse_loss(net(x_all[index]), y_all[index]).backward()
            for t, p in zip(total, net.parameters(), strict=True):
                t += p.grad
        for t, p in zip(total, net.parameters(), strict=True):
            p.grad = t / 2
        opt.step()
    for rank, r in enumerate(results):
        f = r['fabric']
        assert_same(f['params'], params(net), 1e-6, f'rank {rank}: Fabric differs from the reference')
        assert f['sum'] == 3.0 and f['gather'] == [[0], [1]] and f['broadcast'] == 'rank 1'
        assert f['is_global_zero'] == (rank == 0) and f['world_size'] == 2


DOCS = pathlib.Path(__file__).resolve().parents[3] / 'docs' / 'lightning.md'


def test_documented_example_trains(tmp_path):
    text = DOCS.read_text()
    block = re.search(r'## A complete example.*?```python\n(.*?)```', text, re.S).group(1)
    script = tmp_path / 'lightning_digits.py'
    script.write_text(block)
    args = ['--epochs', '5', '--root-dir', str(tmp_path)]
    horovodrun = shutil.which('horovodrun')
    if horovodrun:
        done = subprocess.run([horovodrun, '-np', '2', '-H', 'localhost:2', sys.executable, str(script), *args],
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stdout + done.stderr
        output = done.stdout
    else:
        output = run_ranks(2, run_script, str(script), *args, timeout=240)[0]
    match = re.search(r'test accuracy: (\d\.\d{4})', output)
    assert match, output
    assert float(match.group(1)) >= 0.9, output
    assert output.count('test accuracy') == 1, 'only rank 0 prints'
