"""join (spec core.md §6.9) and the newer collectives on a dynamically added process set
(core.md §5), with a rank outside the set."""

import numpy as np
import torch
from jobs import job_fixture
from test_alltoall_reducescatter import COLS, raised, scatter_rows, send_rows, send_splits
from test_ops import as_numpy, rank_input, weights


def join_worker():
    import horovod.torch as hvd
    hvd.init()
    rank = hvd.rank()
    result = {}
    if rank == 0:
        # Joins at once: it contributes zeros to the others' allreduces.
        result['last'] = hvd.join()
    else:
        result['average'] = hvd.allreduce(torch.full((3,), float(rank + 1)),
                                          name='joined.average').tolist()
        result['sum'] = hvd.allreduce(torch.full((2,), rank + 1, dtype=torch.int32), op=hvd.Sum,
                                      name='joined.sum').tolist()
        result['gather'] = raised(lambda: hvd.allgather(torch.ones(1), name='joined.gather'))
        result['last'] = hvd.join()
    # Everyone has joined: collectives run normally again.
    result['after'] = hvd.allreduce(torch.ones(1), op=hvd.Sum, name='after.join').item()
    return result


def test_join(job):
    np_, results = job('join')
    lasts = {result['last'] for result in results}
    assert len(lasts) == 1, 'ranks disagree on the last joined rank'
    last = lasts.pop()
    assert 0 < last < np_, 'rank 0 joined first, so another rank joined last'
    others = sum(r + 1 for r in range(1, np_))
    for rank, result in enumerate(results):
        assert result['after'] == float(np_)
        if rank == 0:
            continue
        # Average divides by the full size, the joined rank counted with zeros.
        np.testing.assert_allclose(result['average'], [others / np_] * 3)
        assert result['sum'] == [others] * 2
        kind, message = result['gather']
        assert kind == 'HorovodInternalError' and 'join' in message.lower(), message


def process_set_worker():
    import horovod.torch as hvd
    from horovod.common.process_sets import ProcessSet
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    # Without global rank 1, so that set ranks and global ranks differ at np=3.
    members = [r for r in range(size) if r != 1]
    ps = hvd.add_process_set(members)
    assert isinstance(ps, ProcessSet) and hvd.ProcessSet is ProcessSet
    result = {'id': ps.process_set_id, 'ranks': ps.ranks}
    x = rank_input(rank, torch.float32, (5, COLS))
    y = rank_input(rank, torch.float64, (7, 3))
    if ps.included():
        set_rank, set_size = ps.rank(), ps.size()
        a = rank_input(rank, torch.float32, (send_rows(set_rank, set_size), COLS))
        out, received = hvd.alltoall(a, splits=send_splits(set_rank, set_size),
                                     name='ps.alltoall', process_set=ps)
        result['alltoall'] = (as_numpy(out), received.tolist())
        result['reducescatter'] = as_numpy(hvd.reducescatter(y, op=hvd.Sum, name='ps.rs',
                                                             process_set=ps))
        result['grouped_reducescatter'] = [as_numpy(t) for t in hvd.grouped_reducescatter(
            [y, x], name='ps.grs', process_set=ps)]
        result['grouped_allgather'] = [as_numpy(t) for t in hvd.grouped_allgather(
            [x, y], name='ps.gag', process_set=ps)]
        g = torch.ones(7, 2, dtype=torch.float64, requires_grad=True)
        out = hvd.reducescatter(g, op=hvd.Sum, name='ps.rs.grad', process_set=ps)
        (out * weights(rank, tuple(out.shape), 20)).sum().backward()
        result['reducescatter.grad'] = g.grad.numpy().copy()
        result['barrier'] = hvd.barrier(process_set=ps)
    else:
        result['outside'] = {
            'alltoall': raised(lambda: hvd.alltoall(x, process_set=ps)),
            'alltoall_async': raised(lambda: hvd.alltoall_async(x, splits=[1] * len(members),
                                                                process_set=ps)),
            'reducescatter': raised(lambda: hvd.reducescatter(y, process_set=ps)),
            'reducescatter_async': raised(lambda: hvd.reducescatter_async(y, process_set=ps)),
            'grouped_reducescatter': raised(lambda: hvd.grouped_reducescatter([y],
                                                                              process_set=ps)),
            'grouped_allgather': raised(lambda: hvd.grouped_allgather([x], process_set=ps)),
            'barrier': raised(lambda: hvd.barrier(process_set=ps)),
        }
        assert not hvd.mpi_ops._handle_map
    result['removed'] = hvd.remove_process_set(ps)
    result['id after removal'] = ps.process_set_id
    result['barrier after removal'] = raised(lambda: hvd.barrier(process_set=ps))
    return result


def test_ops_on_a_process_set(job):
    np_, results = job('process_set')
    members = [r for r in range(np_) if r != 1]
    n = len(members)
    alltoall_inputs = [as_numpy(rank_input(g, torch.float32, (send_rows(s, n), COLS)))
                       for s, g in enumerate(members)]
    rs_full = reference_set_sum(members, torch.float64, (7, 3))
    rows = scatter_rows(n, 7)
    for rank, result in enumerate(results):
        assert result['ranks'] == members and result['id'] == results[0]['id'] != 0
        assert result['removed'] is True and result['id after removal'] is None
        assert result['barrier after removal'][0] == 'ValueError'
        if rank not in members:
            for op, error in result['outside'].items():
                assert error is not None and error[0] == 'ValueError', (op, error)
            continue
        set_rank = members.index(rank)
        offset, count = rows[set_rank]
        expected, expected_splits = [], []
        for s in range(n):
            splits = send_splits(s, n)
            start = sum(splits[:set_rank])
            expected.append(alltoall_inputs[s][start:start + splits[set_rank]])
            expected_splits.append(splits[set_rank])
        got, received = result['alltoall']
        np.testing.assert_array_equal(got, np.concatenate(expected))
        assert received == expected_splits
        np.testing.assert_allclose(result['reducescatter'], rs_full[offset:offset + count])
        # grouped_reducescatter [y (7 rows), x (5 rows)] with the default op, Average.
        y_avg = rs_full / n
        x_avg = reference_set_sum(members, torch.float32, (5, COLS)) / n
        x_offset, x_count = scatter_rows(n, 5)[set_rank]
        grs_y, grs_x = result['grouped_reducescatter']
        np.testing.assert_allclose(grs_y, y_avg[offset:offset + count])
        np.testing.assert_allclose(grs_x, x_avg[x_offset:x_offset + x_count], rtol=1e-5, atol=1e-6)
        gag_x, gag_y = result['grouped_allgather']
        np.testing.assert_array_equal(
            gag_x, np.concatenate([as_numpy(rank_input(g, torch.float32, (5, COLS)))
                                   for g in members]))
        np.testing.assert_array_equal(
            gag_y, np.concatenate([as_numpy(rank_input(g, torch.float64, (7, 3)))
                                   for g in members]))
        # Sum: the allgather (within the set) of the weights, times the set size.
        gathered = np.concatenate([weights(g, (rows[s][1], 2), 20).numpy()
                                   for s, g in enumerate(members)])
        np.testing.assert_allclose(result['reducescatter.grad'], n * gathered)
        assert result['barrier'] is None


def reference_set_sum(members, dtype, shape):
    return np.sum([as_numpy(rank_input(g, dtype, shape)).astype(np.float64) for g in members],
                  axis=0)


# The process-set body runs first: it has an unnamed op (the gradient's allgather), whose name
# comes from the handle counter, and the join body leaves rank 0's counter behind the others'.
WORKERS = {'process_set': process_set_worker, 'join': join_worker}

job = job_fixture(WORKERS, sizes=(2, 3), env={'HOROVOD_DYNAMIC_PROCESS_SETS': '1'})
