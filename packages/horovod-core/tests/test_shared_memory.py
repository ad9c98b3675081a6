"""The shared-memory transport (csrc/backends/shm/shared_memory.h), used by default when every rank is on
one host: results against numpy references at np = 2, 3 and 4 for sizes around its internal
boundaries (the 64 KiB whole-reduce limit, the 1 MiB slot, several pipelined slots, the 256 KiB
pieces of the single-copy allreduce), every dtype, large allgathers and broadcasts, and negotiation
messages longer than a slot; with the single-copy allreduce (process_vm_readv, allowed on this
machine) and without it (through the segment). The same job with HOROVOD_SHARED_MEMORY=0 checks
that the switch really changes the transport."""

import numpy as np
import pytest

from horovod_testing import run_ranks

_KIB = 1024
_MIB = 1024 * 1024


def _setup():
    from horovod.common import _core, ops
    from horovod.common.basics import HorovodBasics
    from horovod_testing.collectives import NumpyAdapter
    basics = HorovodBasics()
    basics.init()
    adapter = NumpyAdapter()
    return basics, ops, adapter, _core


def _transport_suite():
    from horovod_testing.collectives import (AVERAGE, MAX, MIN, PRODUCT, SUM, assert_equal, rank_input,
                                             reference_allreduce)
    basics, ops, adapter, core = _setup()
    rank, size = basics.rank(), basics.size()
    cases = 0
    dtypes = ["uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "float32", "float64", "bool"]
    for dtype in dtypes:
        item = np.dtype(dtype).itemsize
        # Just under and over the whole-reduce limit, one element past a slot, and (for 4-byte
        # types) an odd size spanning three slots.
        counts = [1, 64 * _KIB // item - 1, 64 * _KIB // item + 5, _MIB // item + 3]
        if item == 4:
            counts.append(2 * _MIB + 13)
        ops_to_check = [SUM, MIN, MAX, PRODUCT] if dtype in ("int64", "float32", "bool") else [SUM]
        if dtype in ("float32", "float64"):
            ops_to_check.append(AVERAGE)
        for count in counts:
            for op in ops_to_check:
                x = rank_input(rank, dtype, (count,), salt=op)
                result = adapter.allreduce(x, op, 1.0, 1.0, f"shm.{dtype}.{count}.{op}", inplace=True)
                expected = reference_allreduce([rank_input(r, dtype, (count,), salt=op) for r in range(size)], op,
                                               1.0, 1.0, dtype)
                assert_equal(result, expected, dtype, f"allreduce {dtype} x{count} op {op}")
                cases += 1
    # Allgather: uneven row counts, each rank's block longer than a slot.
    rows = [140 + 13 * r for r in range(size)]
    mine = rank_input(rank, "float64", (rows[rank], 1001), salt=7)
    gathered = adapter.allgather(mine, "shm.gather")
    expected = np.concatenate([rank_input(r, "float64", (rows[r], 1001), salt=7) for r in range(size)])
    assert_equal(gathered, expected, "float64", "allgather of blocks over 1 MiB")
    cases += 1
    # Broadcast from every root, 2.5 MiB and an odd byte count.
    for root in range(size):
        x = rank_input(rank, "uint8", (5 * _MIB // 2 + 7,), salt=root)
        result = adapter.broadcast(x, root, f"shm.bcast.{root}", inplace=True)
        assert_equal(result, rank_input(root, "uint8", (5 * _MIB // 2 + 7,), salt=root), "uint8",
                     f"broadcast from {root}")
        cases += 1
    # A negotiation message longer than a slot: 4000 new tensors with long names in one group.
    names = [f"shm.group.{i}." + "x" * 300 for i in range(4000)]
    tensors = [np.full(3, rank + i, np.int32) for i in range(4000)]
    h = ops.allreduce_async(tensors, tensors, names, SUM)
    ops.wait(h)
    total = sum(range(size))
    for i, t in enumerate(tensors):
        assert_equal(t, np.full(3, total + size * i, np.int32), "int32", f"grouped tensor {i}")
    cases += 1
    stats = core.engine_stats()
    basics.shutdown()
    return cases, stats["shared_memory"], stats["shared_memory_single_copy"]


@pytest.mark.parametrize("single_copy", ["1", "0"])
@pytest.mark.parametrize("np_", [2, 3, 4])
def test_transport_against_numpy(np_, single_copy):
    results = run_ranks(np_, _transport_suite, env={"HOROVOD_SHARED_MEMORY_SINGLE_COPY": single_copy}, timeout=400)
    for cases, shared, direct in results:
        assert shared, "every rank is on this host: the shared-memory transport should be in use"
        assert direct == (single_copy == "1")
        assert cases == 90 + 1 + np_ + 1


def test_switched_off():
    results = run_ranks(2, _transport_suite, env={"HOROVOD_SHARED_MEMORY": "0"}, timeout=400)
    for cases, shared, direct in results:
        assert not shared and not direct
        assert cases == 90 + 1 + 2 + 1


def _pieces_suite():
    """Fused groups through the single-copy path (several tensors reduced straight from their own
    memory, no fusion buffer): odd and empty sizes, in place and out of place, scaled, more
    tensors than one process_vm_readv takes, and separate submissions the engine fuses."""
    from horovod_testing.collectives import (AVERAGE, MAX, SUM, assert_equal, rank_input,
                                             reference_allreduce)
    basics, ops, adapter, core = _setup()
    rank, size = basics.rank(), basics.size()
    cases = 0
    sizes = [0, 1, 7, 4099, 65537, 300_001, 17]
    for dtype in ["uint8", "int32", "int64", "float16", "float32", "float64", "bool"]:
        ops_to_check = [SUM] if dtype == "bool" else [SUM, MAX]
        if dtype in ("float32", "float64"):
            ops_to_check.append(AVERAGE)
        for op in ops_to_check:
            for inplace in (True, False):
                salt = 100 + op
                tensors = [rank_input(rank, dtype, (n,), salt=salt + i) for i, n in enumerate(sizes)]
                results = adapter.grouped_allreduce(tensors, op, f"pieces.{dtype}.{op}.{inplace}", inplace)
                for i, n in enumerate(sizes):
                    expected = reference_allreduce([rank_input(r, dtype, (n,), salt=salt + i) for r in range(size)],
                                                   op, 1.0, 1.0, dtype)
                    assert_equal(results[i], expected, dtype, f"group {dtype} op {op} tensor {i} (x{n})")
                if not inplace:
                    for i, n in enumerate(sizes):
                        assert_equal(tensors[i], rank_input(rank, dtype, (n,), salt=salt + i), dtype,
                                     f"input {i} left unchanged")
                cases += 1
    # Pre- and postscaled (the prescaled group takes the fusion buffer).
    for pre, post in [(1.0, 0.25), (3.0, 0.5)]:
        x = rank_input(rank, "float64", (200_003,), salt=9)
        result = adapter.allreduce(x, SUM, pre, post, f"pieces.scaled.{pre}", inplace=False)
        expected = reference_allreduce([rank_input(r, "float64", (200_003,), salt=9) for r in range(size)], SUM,
                                       pre, post, "float64")
        assert_equal(result, expected, "float64", f"scaled {pre} {post}")
        cases += 1
    # 1500 tensors in one group: more than the 1024 vectors of one process_vm_readv.
    tensors = [rank_input(rank, "float64", (13,), salt=i) for i in range(1500)]
    results = adapter.grouped_allreduce(tensors, SUM, "pieces.many", inplace=False)
    for i in range(1500):
        expected = reference_allreduce([rank_input(r, "float64", (13,), salt=i) for r in range(size)], SUM, 1.0,
                                       1.0, "float64")
        assert_equal(results[i], expected, "float64", f"tensor {i} of 1500")
    cases += 1
    # Separate submissions, fused by the engine.
    tensors = [rank_input(rank, "float32", (4096 + i,), salt=i) for i in range(60)]
    outputs = [np.empty_like(t) for t in tensors]
    handles = []
    for i, (t, o) in enumerate(zip(tensors, outputs, strict=True)):
        h = ops.allreduce_async([t], [o], [f"pieces.async.{i}"], SUM)
        handles.append(h)
    for h in handles:
        ops.wait(h)
    for i, o in enumerate(outputs):
        expected = reference_allreduce([rank_input(r, "float32", (4096 + i,), salt=i) for r in range(size)], SUM,
                                       1.0, 1.0, "float32")
        assert_equal(o, expected, "float32", f"async tensor {i}")
    cases += 1
    stats = core.engine_stats()
    basics.shutdown()
    return cases, stats["shared_memory_single_copy"]


@pytest.mark.parametrize("single_copy", ["1", "0"])
@pytest.mark.parametrize("np_", [2, 3, 4])
def test_fused_groups_against_numpy(np_, single_copy):
    results = run_ranks(np_, _pieces_suite, env={"HOROVOD_SHARED_MEMORY_SINGLE_COPY": single_copy}, timeout=400)
    for cases, direct in results:
        assert direct == (single_copy == "1")
        assert cases == 2 * 15 + 2 + 1 + 1  # 15 (dtype, op) pairs, in place and not
