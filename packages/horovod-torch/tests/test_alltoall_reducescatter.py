"""alltoall, reducescatter and the grouped allgather / reducescatter of horovod.torch: results in
every supported dtype, gradients (spec torch.md §4.3), submission errors, and barrier, all
against numpy references computed in the test process from the same seeded per-rank inputs.
"""

import numpy as np
import torch
from jobs import job_fixture
from test_ops import (
    MOVE_DTYPES,
    REDUCE_DTYPES,
    as_numpy,
    assert_matches,
    dtype_name,
    rank_input,
    reference_allreduce,
    weights,
)

COLS = 2


def send_splits(rank, size):
    """Rows rank ``rank`` sends to each member: 0, 1 or 2, so some ranks send nothing to some."""
    return [(rank + k) % 3 for k in range(size)]


def send_rows(rank, size):
    """dim 0 of rank ``rank``'s alltoall input: odd ranks keep one trailing row that is not
    sent (the splits may sum to less than dim 0)."""
    return sum(send_splits(rank, size)) + rank % 2


def reference_alltoall(size, receiver, inputs):
    """What ``receiver`` gets: each sender's block for it, in sender order."""
    blocks, received = [], []
    for sender in range(size):
        splits = send_splits(sender, size)
        offset = sum(splits[:receiver])
        blocks.append(inputs[sender][offset:offset + splits[receiver]])
        received.append(splits[receiver])
    return np.concatenate(blocks), received


def scatter_rows(size, d0):
    """(offset, count) of each set member's rows in a reducescatter of dim 0 ``d0``."""
    counts = [d0 // size + (1 if r < d0 % size else 0) for r in range(size)]
    offsets = np.cumsum([0] + counts)
    return [(int(offsets[r]), counts[r]) for r in range(size)]


def alltoall_worker():
    import horovod.torch as hvd
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    splits = send_splits(rank, size)
    results = {}
    for dtype in MOVE_DTYPES:
        x = rank_input(rank, dtype, (send_rows(rank, size), COLS))
        before = x.clone()
        out, received = hvd.alltoall(x, splits=splits)
        assert received.dtype == torch.int32 and received.shape == (size,)
        results[(dtype_name(dtype), 'list')] = (as_numpy(out), received.tolist())
        handle = hvd.alltoall_async(x, splits=torch.tensor(splits, dtype=torch.int32),
                                    name=f'{dtype}.tensor')
        out, received = hvd.synchronize(handle)
        results[(dtype_name(dtype), 'tensor')] = (as_numpy(out), received.tolist())
        assert torch.equal(x, before), 'alltoall modified its input'
        # Equal split: every rank sends 2 rows to every member; the sync form returns the
        # output only.
        even = rank_input(rank, dtype, (2 * size, COLS), salt=1)
        out = hvd.alltoall(even)
        assert isinstance(out, torch.Tensor)
        results[(dtype_name(dtype), 'even')] = as_numpy(out)
    # Nothing to send at all: zero rows in and out.
    out, received = hvd.alltoall(torch.zeros(0, COLS), splits=[0] * size)
    results['empty'] = (tuple(out.shape), received.tolist())
    return results


def test_alltoall(job):
    np_, results = job('alltoall')
    for dtype in MOVE_DTYPES:
        inputs = [as_numpy(rank_input(r, dtype, (send_rows(r, np_), COLS))) for r in range(np_)]
        evens = [as_numpy(rank_input(r, dtype, (2 * np_, COLS), salt=1)) for r in range(np_)]
        for rank, per_rank in enumerate(results):
            expected, expected_splits = reference_alltoall(np_, rank, inputs)
            for form in ('list', 'tensor'):
                got, received = per_rank[(dtype_name(dtype), form)]
                assert received == expected_splits
                assert got.dtype == expected.dtype
                np.testing.assert_array_equal(got, expected, err_msg=f'alltoall {form} {dtype}')
            expected = np.concatenate([evens[s][2 * rank:2 * rank + 2] for s in range(np_)])
            np.testing.assert_array_equal(per_rank[(dtype_name(dtype), 'even')], expected)
    for per_rank in results:
        assert per_rank['empty'] == ((0, COLS), [0] * np_)


RS_FORMS = ['reducescatter', 'reducescatter_async']


def reducescatter_worker():
    import horovod.torch as hvd
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    d0 = 2 * size + 1  # uneven: the first member gets one row more
    results = {}
    for dtype in REDUCE_DTYPES:
        for op_name in ('Sum', 'Average'):
            op = getattr(hvd, op_name)
            x = rank_input(rank, dtype, (d0, 3))
            before = x.clone()
            results[(dtype_name(dtype), op_name, 'reducescatter')] = as_numpy(
                hvd.reducescatter(x, op=op))
            handle = hvd.reducescatter_async(x, name=f'{dtype}.{op_name}', op=op)
            results[(dtype_name(dtype), op_name, 'reducescatter_async')] = as_numpy(
                hvd.synchronize(handle))
            assert torch.equal(x, before), 'reducescatter modified its input'
    # Default op (Average) with scale factors.
    x = rank_input(rank, torch.float64, (d0, 3))
    results['scaled'] = as_numpy(hvd.reducescatter(x, prescale_factor=2.0, postscale_factor=3.0))
    # Fewer rows than ranks: the last members get zero rows.
    results['short'] = as_numpy(hvd.reducescatter(rank_input(rank, torch.float32, (1, 3)),
                                                  op=hvd.Sum))
    return results


def test_reducescatter(job):
    np_, results = job('reducescatter')
    d0 = 2 * np_ + 1
    rows = scatter_rows(np_, d0)
    for dtype in REDUCE_DTYPES:
        for op_name in ('Sum', 'Average'):
            full = reference_allreduce(np_, dtype, (d0, 3), op_name)
            for rank, per_rank in enumerate(results):
                offset, count = rows[rank]
                for form in RS_FORMS:
                    got = per_rank[(dtype_name(dtype), op_name, form)]
                    assert got.shape == (count, 3)
                    assert_matches(got, full[offset:offset + count], dtype,
                                   f'{form} {op_name} {dtype} on rank {rank}')
    full = reference_allreduce(np_, torch.float64, (d0, 3), 'Average', prescale=2.0, postscale=3.0)
    short = reference_allreduce(np_, torch.float32, (1, 3), 'Sum')
    for rank, per_rank in enumerate(results):
        offset, count = rows[rank]
        assert_matches(per_rank['scaled'], full[offset:offset + count], torch.float64, 'scaled')
        expected = short if rank == 0 else short[:0]
        assert_matches(per_rank['short'], expected, torch.float32, 'fewer rows than ranks')


GROUP = [(torch.float32, (3,)), (torch.int64, ()), (torch.float64, (2, 2))]


def grouped_worker():
    import horovod.torch as hvd
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    results = {}
    d0 = size + 2
    for op_name in ('Sum', 'Average'):
        tensors = [rank_input(rank, dtype, (d0, *tail), salt=i)
                   for i, (dtype, tail) in enumerate(GROUP)]
        out = hvd.grouped_reducescatter(tensors, op=getattr(hvd, op_name))
        assert isinstance(out, list) and len(out) == len(GROUP)
        results[('grouped_reducescatter', op_name)] = [as_numpy(o) for o in out]
        handle = hvd.grouped_reducescatter_async(tensors, name=op_name, op=getattr(hvd, op_name))
        results[('grouped_reducescatter_async', op_name)] = [as_numpy(o)
                                                             for o in hvd.synchronize(handle)]
    # Rank r contributes r + 1 rows of every member.
    tensors = [rank_input(rank, dtype, (rank + 1, *tail), salt=i)
               for i, (dtype, tail) in enumerate(GROUP)]
    out = hvd.grouped_allgather(tensors)
    assert isinstance(out, list) and len(out) == len(GROUP)
    results['grouped_allgather'] = [as_numpy(o) for o in out]
    handle = hvd.grouped_allgather_async(tensors, name='gather')
    results['grouped_allgather_async'] = [as_numpy(o) for o in hvd.synchronize(handle)]
    return results


def test_grouped_reducescatter_and_allgather(job):
    np_, results = job('grouped')
    d0 = np_ + 2
    rows = scatter_rows(np_, d0)
    for op_name in ('Sum', 'Average'):
        fulls = [reference_allreduce(np_, dtype, (d0, *tail), op_name, salt=i)
                 for i, (dtype, tail) in enumerate(GROUP)]
        for rank, per_rank in enumerate(results):
            offset, count = rows[rank]
            for form in ('grouped_reducescatter', 'grouped_reducescatter_async'):
                for got, full, (dtype, _) in zip(per_rank[(form, op_name)], fulls, GROUP,
                                                 strict=True):
                    assert_matches(got, full[offset:offset + count], dtype, f'{form} {op_name}')
    gathered = [np.concatenate([as_numpy(rank_input(r, dtype, (r + 1, *tail), salt=i))
                                for r in range(np_)])
                for i, (dtype, tail) in enumerate(GROUP)]
    for per_rank in results:
        for form in ('grouped_allgather', 'grouped_allgather_async'):
            for got, want in zip(per_rank[form], gathered, strict=True):
                assert got.dtype == want.dtype
                np.testing.assert_array_equal(got, want, err_msg=form)


# Gradients: rank r computes loss_r = sum(op(x_r) * w_r) with its own weights w_r and calls
# loss_r.backward(); the expected gradient of x_r follows from the backward rules of the spec.


def autograd_worker():
    import horovod.torch as hvd
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    grads = {}

    splits = send_splits(rank, size)
    x = torch.ones(send_rows(rank, size), COLS, dtype=torch.float64, requires_grad=True)
    out, received = hvd.alltoall(x, splits=splits)
    assert not received.requires_grad
    (out * weights(rank, tuple(out.shape), 10)).sum().backward()
    grads['alltoall'] = x.grad.numpy().copy()

    x = torch.ones(2 * size, COLS, dtype=torch.float64, requires_grad=True)
    out = hvd.alltoall(x)
    (out * weights(rank, tuple(out.shape), 11)).sum().backward()
    grads['alltoall.even'] = x.grad.numpy().copy()

    d0 = 2 * size + 1
    for op_name in ('Sum', 'Average'):
        x = torch.ones(d0, COLS, dtype=torch.float64, requires_grad=True)
        out = hvd.reducescatter(x, op=getattr(hvd, op_name), prescale_factor=2.0,
                                postscale_factor=0.5 if op_name == 'Sum' else 1.0)
        (out * weights(rank, tuple(out.shape), 12)).sum().backward()
        grads[f'reducescatter.{op_name}'] = x.grad.numpy().copy()

        a = torch.ones(d0, dtype=torch.float64, requires_grad=True)
        b = torch.ones(d0, 3, dtype=torch.float32, requires_grad=True)
        ya, yb = hvd.grouped_reducescatter([a, b], op=getattr(hvd, op_name))
        ((ya * weights(rank, tuple(ya.shape), 13)).sum()
         + (yb * weights(rank, tuple(yb.shape), 14).float()).sum()).backward()
        grads[f'grouped_reducescatter.{op_name}'] = (a.grad.numpy().copy(),
                                                     b.grad.numpy().copy())

    total_rows = size * (size + 1) // 2
    a = torch.ones(rank + 1, 2, dtype=torch.float64, requires_grad=True)
    b = torch.ones(rank + 1, dtype=torch.float64, requires_grad=True)
    ya, yb = hvd.grouped_allgather([a, b])
    ((ya * weights(rank, (total_rows, 2), 15)).sum()
     + (yb * weights(rank, (total_rows,), 16)).sum()).backward()
    grads['grouped_allgather'] = (a.grad.numpy().copy(), b.grad.numpy().copy())
    return grads


def test_gradients(job):
    np_, results = job('autograd')

    def out_rows(receiver):
        return sum(send_splits(s, np_)[receiver] for s in range(np_))

    d0 = 2 * np_ + 1
    rows = scatter_rows(np_, d0)

    def gathered_weights(salt, tail, dtype=np.float64):
        # Every rank's weights for its reducescatter output, concatenated in rank order.
        return np.concatenate([weights(r, (rows[r][1], *tail), salt).numpy().astype(dtype)
                               for r in range(np_)])

    offsets = np.cumsum([0] + [r + 1 for r in range(np_)])
    total_rows = offsets[-1]
    for rank, grads in enumerate(results):
        # alltoall: the block rank sent to k comes back with k's weights for it.
        expected = np.zeros((send_rows(rank, np_), COLS))
        splits = send_splits(rank, np_)
        for k in range(np_):
            w = weights(k, (out_rows(k), COLS), 10).numpy()
            start = sum(send_splits(s, np_)[k] for s in range(rank))
            sent_from = sum(splits[:k])
            expected[sent_from:sent_from + splits[k]] = w[start:start + splits[k]]
        np.testing.assert_allclose(grads['alltoall'], expected)
        expected = np.concatenate([weights(k, (2 * np_, COLS), 11).numpy()[2 * rank:2 * rank + 2]
                                   for k in range(np_)])
        np.testing.assert_allclose(grads['alltoall.even'], expected)

        # reducescatter: allgather of the gradient, x set size for Sum, x the scale factors.
        np.testing.assert_allclose(grads['reducescatter.Sum'],
                                   np_ * 2.0 * 0.5 * gathered_weights(12, (COLS,)))
        np.testing.assert_allclose(grads['reducescatter.Average'],
                                   2.0 * gathered_weights(12, (COLS,)))
        for op_name, factor in (('Sum', np_), ('Average', 1)):
            ga, gb = grads[f'grouped_reducescatter.{op_name}']
            np.testing.assert_allclose(ga, factor * gathered_weights(13, ()))
            np.testing.assert_allclose(gb, factor * gathered_weights(14, (3,), np.float32),
                                       rtol=1e-6)

        # grouped allgather: this rank's rows of the averaged incoming gradient.
        ga, gb = grads['grouped_allgather']
        mean_a = np.mean([weights(r, (total_rows, 2), 15).numpy() for r in range(np_)], axis=0)
        mean_b = np.mean([weights(r, (total_rows,), 16).numpy() for r in range(np_)], axis=0)
        np.testing.assert_allclose(ga, mean_a[offsets[rank]:offsets[rank + 1]])
        np.testing.assert_allclose(gb, mean_b[offsets[rank]:offsets[rank + 1]])


def raised(fn):
    """(exception type name, message) of what ``fn()`` raises, or None."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 (the test compares the type)
        return type(e).__name__, str(e)
    return None


def errors_worker():
    import horovod.torch as hvd
    hvd.init()
    size = hvd.size()
    x = torch.ones(2 * size, 3)
    errors = {
        'short splits': raised(lambda: hvd.alltoall_async(x, splits=[1] * (size + 1))),
        'splits past dim 0': raised(lambda: hvd.alltoall_async(x, splits=[3] * size)),
        'float splits tensor': raised(lambda: hvd.alltoall_async(
            x, splits=torch.ones(size, dtype=torch.float32))),
        'int64 splits tensor': raised(lambda: hvd.alltoall_async(
            x, splits=torch.ones(size, dtype=torch.int64))),
        '2-D splits': raised(lambda: hvd.alltoall_async(
            x, splits=torch.ones(size, 1, dtype=torch.int32))),
        'non-int splits': raised(lambda: hvd.alltoall_async(x, splits=[1.5] * size)),
        'reducescatter Min': raised(lambda: hvd.reducescatter_async(x, op=hvd.Min)),
        'reducescatter Max': raised(lambda: hvd.reducescatter(x, op=hvd.Max)),
        'reducescatter bool': raised(lambda: hvd.reducescatter(x.bool())),
        'alltoall non-contiguous': raised(lambda: hvd.alltoall(torch.ones(3, 2 * size).t())),
        'reducescatter scalar': raised(lambda: hvd.reducescatter(torch.tensor(1.0))),
    }
    if size > 1:
        errors['indivisible'] = raised(lambda: hvd.alltoall_async(torch.ones(size + 1, 3)))
    assert not hvd.mpi_ops._handle_map, 'a refused submission left a handle behind'
    # Barrier: also with an operation in flight that completes after it.
    handle = hvd.allreduce_async(torch.ones(2), op=hvd.Sum, name='around.barrier')
    barrier_result = hvd.barrier()
    pending = hvd.synchronize(handle).tolist()
    return errors, barrier_result, pending


def test_submission_errors_and_barrier(job):
    np_, results = job('errors')
    for errors, barrier_result, pending in results:
        for case in ('short splits', 'splits past dim 0', 'float splits tensor',
                     'int64 splits tensor', '2-D splits', 'non-int splits',
                     'alltoall non-contiguous', 'reducescatter bool'):
            assert errors[case] is not None and errors[case][0] == 'ValueError', (case, errors[case])
        assert 'contiguous' in errors['alltoall non-contiguous'][1]
        assert 'int32' in errors['float splits tensor'][1]
        for case in ('reducescatter Min', 'reducescatter Max', 'reducescatter scalar'):
            assert errors[case] is not None and errors[case][0] == 'HorovodInternalError', \
                (case, errors[case])
        for case in ('reducescatter Min', 'reducescatter Max'):
            assert 'Average' in errors[case][1] and 'Sum' in errors[case][1], errors[case]
        if np_ > 1:
            kind, message = errors['indivisible']
            assert kind == 'ValueError' and 'divisible' in message, message
        assert barrier_result is None
        assert pending == [float(np_)] * 2


WORKERS = {'alltoall': alltoall_worker, 'reducescatter': reducescatter_worker,
           'grouped': grouped_worker, 'autograd': autograd_worker, 'errors': errors_worker}


job = job_fixture(WORKERS, sizes=(1, 2, 3))
