"""Automatic tensor names count per op kind and per process set, so that ranks which submitted
different numbers of other unnamed operations still name the same collective alike.

With names taken from the handle counter (every op advances it), rank 0's extra barrier,
broadcast and allreduce on a process set of its own would push its later automatic names
three ahead of rank 1's, and the global collectives below would never match (a hang)."""

import torch
from horovod_testing import run_ranks


def worker():
    import horovod.torch as hvd
    from horovod.common import ops

    hvd.init()
    rank = hvd.rank()
    only_rank0 = hvd.add_process_set([0])
    if rank == 0:
        # Unnamed operations that rank 1 does not submit.
        hvd.barrier(process_set=only_rank0)
        hvd.broadcast(torch.ones(2), root_rank=0, process_set=only_rank0)
        hvd.allreduce(torch.ones(2), process_set=only_rank0)
        hvd.allgather(torch.ones(1), process_set=only_rank0)
    handle = hvd.allreduce_async(torch.full((3,), float(rank + 1)), op=hvd.Sum)
    summed = hvd.synchronize(handle)
    gathered = hvd.allgather(torch.tensor([rank]))
    root = hvd.broadcast(torch.tensor([rank + 10]), root_rank=1)
    grouped = hvd.grouped_allreduce([torch.ones(2), torch.ones(1)], op=hvd.Sum)
    exchanged = hvd.alltoall(torch.tensor([rank, rank]))
    hvd.barrier()
    counters = dict(ops._noname_counters)
    hvd.shutdown()
    return {'handle': handle, 'summed': summed, 'gathered': gathered, 'root': root,
            'grouped': grouped, 'exchanged': exchanged, 'counters': counters,
            'cleared': not ops._noname_counters}


def test_automatic_names_agree_despite_extra_unnamed_ops():
    results = run_ranks(2, worker, env={'HOROVOD_DYNAMIC_PROCESS_SETS': 1}, timeout=90)
    # The handle counters diverged: handle-based names would not have matched.
    assert results[0]['handle'] != results[1]['handle']
    for r in results:
        torch.testing.assert_close(r['summed'], torch.full((3,), 3.0))
        assert r['gathered'].tolist() == [0, 1]
        assert r['root'].tolist() == [11]
        assert [t.tolist() for t in r['grouped']] == [[2.0, 2.0], [2.0]]
        assert r['exchanged'].tolist() == [0, 1]
        assert r['cleared']
    # Global-set counters agree; rank 0 also counted its own set's ops separately.
    global_keys = {k: v for k, v in results[0]['counters'].items() if k[1] == 0}
    assert global_keys == results[1]['counters']
    assert len(results[0]['counters']) > len(results[1]['counters'])
