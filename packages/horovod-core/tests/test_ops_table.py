"""horovod.common.ops' automatic names and its one table of operations in flight: the table keeps
the engine's objects and the caller's context until ``wait``, refused submissions leave nothing,
and starting or stopping the engine empties the table and restarts the names."""

import gc
import weakref

import numpy as np

from horovod_testing import run_ranks


class _Owner:
    """A caller's object that only the table keeps alive once the caller drops it."""


def _worker():
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics

    basics = HorovodBasics()
    basics.init()
    rank, size = basics.rank(), basics.size()
    facts = {}

    # Names: the wire format, one counter per (prefix, process set), one step per group.
    facts['names'] = [ops.op_name('allreduce', 'w'), ops.op_name('allreduce', None),
                      ops.op_name('allreduce', None), ops.op_name('allreduce', None, 1),
                      ops.op_name('broadcast', None), ops.op_names('grouped_allgather', None, 0, 3),
                      ops.op_names('horovod_allreduce', 'g', 0, 2), ops.member_names('x'),
                      ops.op_name('allreduce', None)]

    # The table keeps the context alive until wait, and wait forgets the handle.
    owner = _Owner()
    watch = weakref.ref(owner)
    array = np.full(4, float(rank + 1), np.float32)
    h = ops.allreduce_async([array], [array], ops.op_names('allreduce', 'kept'), 1, context=(owner, 'extra'))
    del owner
    gc.collect()
    facts['alive_while_in_flight'] = watch() is not None and ops.in_flight(h)
    facts['context'] = ops.context(h)[1]
    ops.wait(h)
    gc.collect()
    facts['after_wait'] = (ops.in_flight(h), ops.context(h, 'gone'), watch() is None)
    facts['sum'] = array.tolist()

    # A submission the core refuses leaves no entry (root rank outside the world).
    try:
        h = ops.broadcast_async([np.zeros(2, np.float32)], ops.op_names('broadcast', 'bad'), size + 5,
                                context='refused')
        facts['refused'] = 'accepted'
    except ValueError:
        facts['refused'] = ops.in_flight(h)

    # Shutdown drops whatever is still in flight (a handle nobody waits for) and the counters.
    left = ops.allgather_async([np.ones(1, np.int32)], ops.op_names('allgather', 'left'),
                               context='left over')
    facts['left_in_flight'] = ops.in_flight(left)
    ops.barrier()  # every rank has submitted it (so none is refused for a shutdown of the others)
    basics.shutdown()
    facts['after_shutdown'] = (dict(ops._in_flight), dict(ops._noname_counters))
    basics.init()
    facts['after_reinit'] = ops.op_name('allreduce', None)
    basics.shutdown()
    return facts


def test_names_and_keep_alive_table():
    results = run_ranks(2, _worker, timeout=90)
    for facts in results:
        assert facts['names'] == [
            'allreduce.w', 'allreduce.noname.1', 'allreduce.noname.2', 'allreduce.noname.1',
            'broadcast.noname.1', ['grouped_allgather.noname.1_1of3', 'grouped_allgather.noname.1_2of3',
                                   'grouped_allgather.noname.1_3of3'],
            ['horovod_allreduce.g_1of2', 'horovod_allreduce.g_2of2'], ['x'], 'allreduce.noname.3']
        assert facts['alive_while_in_flight']
        assert facts['context'] == 'extra'
        assert facts['after_wait'] == (False, 'gone', True)
        assert facts['sum'] == [3.0] * 4
        assert facts['refused'] is False
        assert facts['left_in_flight']
        assert facts['after_shutdown'] == ({}, {})
        assert facts['after_reinit'] == 'allreduce.noname.1'
