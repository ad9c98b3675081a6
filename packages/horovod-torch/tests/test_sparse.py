"""Sparse gradients: sparse_allreduce_async (allgather of indices and values) and
DistributedOptimizer on a sparse nn.Embedding, in both modes (sparse allgather and
sparse_as_dense), against a single-process reference trained on the concatenated batch."""

import functools

import pytest
import torch
from jobs import job_fixture

STEPS = 3
LR = 0.5
BATCH = 6


def local_sparse(rank, dtype):
    """Rank r holds r + 2 entries of a 5 x 3 tensor, some at repeated indices."""
    rows = torch.tensor([(rank + k) % 5 for k in range(rank + 2)] + [rank % 5])
    values = torch.arange(1, 3 * (rank + 3) + 1, dtype=torch.float64).reshape(-1, 3) * (rank + 1)
    return torch.sparse_coo_tensor(rows.unsqueeze(0), values.to(dtype), (5, 3))


def worker_sparse_allreduce():
    import horovod.torch as hvd

    hvd.init()
    out = {}
    for dtype in (torch.float32, torch.int64):
        for op_name in ('Sum', 'Average'):
            for name in ('sp', None):
                t = local_sparse(hvd.rank(), dtype)
                handle = hvd.sparse_allreduce_async(t, name=name and f'{name}.{dtype}.{op_name}',
                                                    op=getattr(hvd, op_name))
                assert callable(handle)
                result = handle()
                assert result.layout == torch.sparse_coo and not result.is_coalesced()
                out[(str(dtype), op_name, name)] = (result.to_dense(), result._nnz(),
                                                    result.dtype)
    errors = []
    for bad in (lambda: hvd.sparse_allreduce_async(torch.ones(3), 'dense', hvd.Sum),
                lambda: hvd.sparse_allreduce_async(local_sparse(0, torch.float32), 'max', hvd.Max)):
        with pytest.raises(ValueError) as info:
            bad()
        errors.append(str(info.value))
    out['errors'] = errors
    return out


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embedding = torch.nn.Embedding(12, 4, sparse=True)
        self.fc = torch.nn.Linear(4, 1)
        self.double()

    def forward(self, ids):
        return self.fc(self.embedding(ids).sum(1)).squeeze(1)


def batch(rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)
    ids = torch.randint(0, 12, (BATCH, 3), generator=g)
    y = torch.randn(BATCH, generator=g, dtype=torch.float64)
    return ids, y


def train(model, optimizer, batches):
    for ids, y in batches:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(ids), y).backward()
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def worker_embedding(sparse_as_dense, backward_passes_per_step):
    import horovod.torch as hvd

    hvd.init()
    model = Net()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                         named_parameters=model.named_parameters(),
                                         sparse_as_dense=sparse_as_dense,
                                         backward_passes_per_step=backward_passes_per_step)
    if backward_passes_per_step == 1:
        return train(model, optimizer, [batch(hvd.rank(), step) for step in range(STEPS)])
    for step in range(STEPS):
        optimizer.zero_grad()
        for k in range(backward_passes_per_step):
            ids, y = batch(hvd.rank() + 10 * k, step)
            torch.nn.functional.mse_loss(model(ids), y).backward()
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


MODES = {'sparse': (False, 1), 'sparse_as_dense': (True, 1), 'sparse_accumulate': (False, 2)}
WORKERS = {mode: functools.partial(worker_embedding, *args) for mode, args in MODES.items()}
WORKERS['sparse_allreduce'] = worker_sparse_allreduce
job = job_fixture(WORKERS, sizes=(2,))


def test_sparse_allreduce_async(job):
    np_, results = job('sparse_allreduce')
    for dtype in (torch.float32, torch.int64):
        dense = sum(local_sparse(r, dtype).to_dense() for r in range(np_))
        nnz = sum(local_sparse(r, dtype)._nnz() for r in range(np_))
        for op_name in ('Sum', 'Average'):
            if op_name == 'Sum':
                expected = dense
            elif dtype.is_floating_point:
                expected = dense / np_
            else:
                # Every entry is divided (truncating) before duplicates are summed.
                expected = sum(torch.sparse_coo_tensor(
                    t._indices(), torch.div(t._values(), np_, rounding_mode='trunc'), t.shape).to_dense()
                    for t in (local_sparse(r, dtype) for r in range(np_)))
            for name in ('sp', None):
                for r in results:
                    result, result_nnz, result_dtype = r[(str(dtype), op_name, name)]
                    assert result_dtype == dtype and result_nnz == nnz
                    torch.testing.assert_close(result, expected)
    for r in results:
        assert 'sparse COO' in r['errors'][0]
        assert 'Average and op=Sum' in r['errors'][1]


@pytest.mark.parametrize('mode', list(MODES))
def test_sparse_embedding_matches_single_process(job, mode):
    np_, results = job(mode)
    _, passes = MODES[mode]
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    # Equal batches on every rank: the average over ranks of the rank gradients (summed over
    # the accumulated passes) is the gradient of the mean loss over the concatenated batches.
    for step in range(STEPS):
        optimizer.zero_grad()
        for k in range(passes):
            parts = [batch(r + 10 * k, step) for r in range(np_)] if passes > 1 else \
                [batch(r, step) for r in range(np_)]
            ids = torch.cat([p[0] for p in parts])
            y = torch.cat([p[1] for p in parts])
            torch.nn.functional.mse_loss(model(ids), y).backward()
        optimizer.step()
    for r in results:
        for key, value in model.state_dict().items():
            torch.testing.assert_close(r[key], value, rtol=1e-10, atol=1e-12)


class EmbeddingOnly(torch.nn.Module):
    """Only sparse parameters: what torch.optim.SparseAdam accepts."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.embedding = torch.nn.Embedding(12, 4, sparse=True).double()
        self.register_buffer('readout', torch.linspace(-1.0, 1.0, 4, dtype=torch.float64))

    def forward(self, ids):
        return self.embedding(ids).sum(1) @ self.readout


def worker_sparse_adam():
    import horovod.torch as hvd

    hvd.init()
    model = EmbeddingOnly()
    optimizer = hvd.DistributedOptimizer(torch.optim.SparseAdam(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         sparse_as_dense=True)
    layouts = []
    for step in range(STEPS):
        ids, y = batch(hvd.rank(), step)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(ids), y).backward()
        optimizer.synchronize()
        layouts.append(model.embedding.weight.grad.layout)
        with optimizer.skip_synchronize():
            optimizer.step()
    return model.embedding.weight.detach().clone(), layouts


adam_job = job_fixture({'sparse_adam': worker_sparse_adam}, sizes=(2, 3))


def test_sparse_as_dense_with_sparse_adam(adam_job):
    """The averaged dense gradient becomes sparse again before SparseAdam's step; the weights
    match SparseAdam in one process on the concatenated batches."""
    np_, results = adam_job('sparse_adam')
    model = EmbeddingOnly()
    optimizer = torch.optim.SparseAdam(model.parameters(), lr=0.1)
    for step in range(STEPS):
        parts = [batch(r, step) for r in range(np_)]
        optimizer.zero_grad()
        # Equal batches: the mean loss over the concatenated batch has the ranks' average gradient.
        torch.nn.functional.mse_loss(model(torch.cat([p[0] for p in parts])),
                                     torch.cat([p[1] for p in parts])).backward()
        optimizer.step()
    for weight, layouts in results:
        assert layouts == [torch.sparse_coo] * STEPS
        torch.testing.assert_close(weight, model.embedding.weight.detach(), rtol=1e-10, atol=1e-12)
        # Not a test that cannot fail: training moved the weights.
        assert not torch.allclose(weight, EmbeddingOnly().embedding.weight.detach())
