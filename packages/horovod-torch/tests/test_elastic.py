"""horovod.torch.elastic: TorchState handlers, ElasticSampler and the run decorator (torch.md §9)."""

import pytest
import torch
from horovod_testing import run_ranks

import horovod.torch as hvd
from horovod.torch.elastic import sampler as sampler_module
from horovod.torch.elastic import state as state_module


@pytest.fixture(scope='module', autouse=True)
def single_process():
    hvd.init()
    yield
    hvd.shutdown()


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Linear(3, 2)


def train_step(model, optimizer):
    optimizer.zero_grad()
    model(torch.ones(4, 3)).sum().backward()
    optimizer.step()


def test_exported_as_hvd_elastic():
    assert hvd.elastic.__all__ == ['TorchState', 'ElasticSampler', 'run']
    assert hvd.elastic.TorchState is state_module.TorchState


def test_model_and_optimizer_restore_to_last_commit():
    model = make_model(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    state = hvd.elastic.TorchState(model, optimizer, epoch=0)
    assert state.model is model and state.optimizer is optimizer

    train_step(model, optimizer)
    state.epoch = 1
    state.commit()
    committed = {k: v.clone() for k, v in model.state_dict().items()}
    committed_exp_avg = optimizer.state_dict()['state'][0]['exp_avg'].clone()

    for _ in range(2):
        train_step(model, optimizer)
        state.epoch += 1
        state.restore()
        for name, value in model.state_dict().items():
            assert torch.equal(value, committed[name])
        assert torch.equal(optimizer.state_dict()['state'][0]['exp_avg'], committed_exp_avg)
        assert state.epoch == 1


def test_none_values_are_plain_attributes():
    state = hvd.elastic.TorchState(batch=3)
    assert state.model is None and state.optimizer is None
    assert state._handlers == {}
    assert state._saved_state == {'batch': 3, 'model': None, 'optimizer': None}


def test_assigning_a_handled_attribute_swaps_and_saves():
    state = hvd.elastic.TorchState(make_model(0))
    replacement = make_model(1)
    state.model = replacement
    assert state.model is replacement
    expected = {k: v.clone() for k, v in replacement.state_dict().items()}
    with torch.no_grad():
        replacement.weight.add_(1.0)
    state.restore()
    assert torch.equal(replacement.weight, expected['weight'])


def test_handler_registry_is_consulted_in_order():
    class Counter:
        def __init__(self):
            self.value = 0

    class CounterHandler(state_module.StateHandler):
        def save(self):
            self.saved = self.value.value

        def restore(self):
            self.value.value = self.saved

        def sync(self):
            pass

    original = state_module.get_handler_registry()
    state_module.set_handler_registry(original + [(Counter, CounterHandler)])
    try:
        counter = Counter()
        state = hvd.elastic.TorchState(counter=counter)
        assert isinstance(state._handlers['counter'], CounterHandler)
        counter.value = 5
        state.save()
        counter.value = 9
        state.restore()
        assert state.counter.value == 5
    finally:
        state_module.set_handler_registry(original)
    assert state_module.get_handler_registry() is original
    assert [t for t, _ in original] == [torch.nn.Module, torch.optim.Optimizer,
                                        hvd.elastic.ElasticSampler]
    with pytest.raises(NotImplementedError):
        state_module.StateHandler(1).sync()


def fake_world(monkeypatch, size, rank):
    monkeypatch.setattr(sampler_module, 'size', lambda: size)
    monkeypatch.setattr(sampler_module, 'rank', lambda: rank)


@pytest.mark.parametrize('length, size', [(10, 1), (10, 3), (7, 2), (2, 3)])
def test_sampler_partitions_every_index(monkeypatch, length, size):
    shares = []
    for rank in range(size):
        fake_world(monkeypatch, size, rank)
        sampler = hvd.elastic.ElasticSampler(list(range(length)), shuffle=False)
        shares.append(list(sampler))
        assert len(sampler) == len(shares[-1]) == -(-length // size)
    assert set(sum(shares, [])) == set(range(length))
    assert shares[0] == list(range(length))[0:size * len(shares[0]):size]


def test_sampler_shuffles_by_seed_and_epoch():
    data = list(range(50))
    a = hvd.elastic.ElasticSampler(data, seed=1)
    b = hvd.elastic.ElasticSampler(data, seed=1)
    assert list(a) == list(b) and sorted(a) == data and list(a) != data
    b.set_epoch(1)
    assert list(a) != list(b)


def test_sampler_resumes_after_resize(monkeypatch):
    fake_world(monkeypatch, 2, 0)
    sampler = hvd.elastic.ElasticSampler(list(range(12)), shuffle=False)
    sampler.record_batch(0, 2)
    sampler.record_batch(1, 2)
    assert sampler.state_dict() == {'epoch': 0, 'processed_num': 8}

    fake_world(monkeypatch, 3, 1)
    restored = hvd.elastic.ElasticSampler(list(range(12)), shuffle=False)
    restored.load_state_dict(sampler.state_dict())
    assert restored.remaining_indices == [8, 9, 10, 11]
    assert (restored.num_samples, restored.total_size) == (2, 6)
    assert list(restored) == [9, 8]  # padded list 8 9 10 11 8 9, every third from rank 1

    restored.set_epoch(1)
    assert restored.processed_num == 0 and len(restored.remaining_indices) == 12


def test_sampler_state_is_saved_and_restored():
    sampler = hvd.elastic.ElasticSampler(list(range(8)))
    state = hvd.elastic.TorchState(sampler=sampler)
    sampler.record_batch(0, 3)
    state.commit()
    sampler.record_batch(1, 3)
    sampler.set_epoch(4)
    state.restore()
    assert sampler.state_dict() == {'epoch': 0, 'processed_num': 3}
    assert len(sampler) == 5


def sync_worker():
    import torch

    import horovod.torch as hvd
    hvd.init()
    rank = hvd.rank()
    model = make_model(rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sampler = hvd.elastic.ElasticSampler(list(range(10)))
    sampler.record_batch(0, rank + 1)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=rank + 5)
    state.sync()
    result = {'weight': model.weight.detach().clone(), 'epoch': state.epoch,
              'sampler': sampler.state_dict(), 'expected': make_model(0).weight.detach()}
    hvd.shutdown()
    return result


def test_sync_broadcasts_rank0_state():
    results = run_ranks(2, sync_worker, timeout=90)
    for result in results:
        assert torch.equal(result['weight'], result['expected'])
        assert result['epoch'] == 5
        assert result['sampler'] == {'epoch': 0, 'processed_num': 2}


def retry_worker():
    import torch

    import horovod.torch as hvd
    hvd.init()
    model = make_model(hvd.rank())
    state = hvd.elastic.TorchState(model, batch=0)
    attempts = []

    @hvd.elastic.run
    def train(state, steps):
        attempts.append((state.batch, model.weight.detach().clone()))
        for _ in range(steps):
            with torch.no_grad():
                model.weight.add_(1.0)
            state.batch += 1
            if len(attempts) == 1 and state.batch == 2:
                raise hvd.HorovodInternalError('simulated peer failure')
            state.commit()
        total = hvd.allreduce(model.weight.detach(), op=hvd.Sum)
        return state.batch, total

    batch, total = train(state, 3)
    result = {'batch': batch, 'total': total, 'attempts': attempts,
              'rank': hvd.rank(), 'size': hvd.size()}
    hvd.shutdown()
    return result


def test_run_restores_and_retries_after_internal_error():
    results = run_ranks(2, retry_worker, timeout=120)
    start = make_model(0).weight.detach()
    for rank, result in enumerate(results):
        assert (result['rank'], result['size']) == (rank, 2)
        (first_batch, first_weight), (second_batch, second_weight) = result['attempts']
        assert first_batch == 0 and torch.equal(first_weight, start)
        # Rolled back to the commit after step 1, then synced from rank 0.
        assert second_batch == 1 and torch.equal(second_weight, start + 1)
        assert result['batch'] == 4
        assert torch.allclose(result['total'], 2 * (start + 4))
