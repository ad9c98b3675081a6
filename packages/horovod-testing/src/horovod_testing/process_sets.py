"""Process-set checks (spec core.md §2.1, §5) through the same tensor adapters as
``horovod_testing.collectives``: every collective on subsets of the ranks, membership errors,
disjoint sets running at once, removal with id reuse, and static registration at init.

Run the suites on every rank of a job of at least 2 ranks (``run_ranks``); each returns
{check name: cases}.
"""

import os

import numpy as np

from horovod_testing.collectives import (AVERAGE, MAX, SUM, assert_equal, check_alltoall, check_barrier,
                                         check_grouped_allgather, check_grouped_reducescatter, check_reducescatter,
                                         rank_input, reference_allreduce)


def _expect_value_error(what, submit):
    try:
        submit()
    except ValueError:
        return 1
    raise AssertionError(f"{what} did not raise ValueError")


def check_set_identity(adapter, process_set):
    """size() is the set's size; rank() the rank within the set, ValueError for a non-member."""
    ranks, rank = process_set.ranks, adapter.rank()
    if process_set.size() != len(ranks):
        raise AssertionError(f"{process_set}: size() {process_set.size()}, expected {len(ranks)}")
    if process_set.included() != (rank in ranks):
        raise AssertionError(f"{process_set}: included() {process_set.included()} on rank {rank}")
    if rank in ranks:
        if process_set.rank() != ranks.index(rank):
            raise AssertionError(f"{process_set}: rank() {process_set.rank()}, expected {ranks.index(rank)}")
        return 3
    return 2 + _expect_value_error(f"{process_set}.rank() on non-member rank {rank}", process_set.rank)


def check_member_ops(adapter, process_set):
    """Every collective on the set, run by its members; Average divides by the set size and
    broadcast roots are global ranks."""
    ranks = process_set.ranks
    rank, me = adapter.rank(), process_set.ranks.index(adapter.rank())
    cases = 0
    for dtype in ("float32", "int32", "float16"):
        for op, (prescale, postscale) in [(SUM, (1.0, 1.0)), (AVERAGE, (1.0, 1.0)), (AVERAGE, (2.0, 0.5)),
                                          (MAX, (1.0, 1.0))]:
            x = adapter.tensor(rank_input(rank, dtype, (4, 3), salt=20), dtype)
            result = adapter.allreduce(x, op, prescale, postscale, f"set.{dtype}.{op}.{prescale}", False,
                                       process_set=process_set)
            expected = reference_allreduce([rank_input(r, dtype, (4, 3), salt=20) for r in ranks], op, prescale,
                                           postscale, dtype)
            assert_equal(adapter.to_numpy(result), expected, dtype, f"allreduce op={op} on {process_set}")
            cases += 1
    if hasattr(adapter, "grouped_allreduce"):
        group = [("float32", (3,)), ("int64", (2, 2))]
        tensors = [adapter.tensor(rank_input(rank, dt, shape, salt=21 + i), dt) for i, (dt, shape) in enumerate(group)]
        results = adapter.grouped_allreduce(tensors, AVERAGE, "set.group", False, process_set=process_set)
        for i, ((dt, shape), result) in enumerate(zip(group, results, strict=True)):
            expected = reference_allreduce([rank_input(r, dt, shape, salt=21 + i) for r in ranks], AVERAGE, 1.0, 1.0,
                                           dt)
            assert_equal(adapter.to_numpy(result), expected, dt, f"grouped allreduce member {i} on {process_set}")
        cases += 1
    rows = [(j + 1) % 3 for j in range(len(ranks))]
    for dtype in ("float64", "uint8"):
        x = adapter.tensor(rank_input(rank, dtype, (rows[me], 2), salt=22), dtype)
        result = adapter.allgather(x, f"set.{dtype}", process_set=process_set)
        expected = np.concatenate([rank_input(r, dtype, (rows[j], 2), salt=22) for j, r in enumerate(ranks)])
        assert_equal(adapter.to_numpy(result), expected, dtype, f"allgather on {process_set}")
        cases += 1
    for root in ranks:
        for inplace in (False, True):
            x = adapter.tensor(rank_input(rank, "int32", (3, 2), salt=23), "int32")
            result = adapter.broadcast(x, root, f"set.{root}.{inplace}", inplace, process_set=process_set)
            assert_equal(adapter.to_numpy(result), rank_input(root, "int32", (3, 2), salt=23), "int32",
                         f"broadcast from global rank {root} on {process_set}")
            cases += 1
    outsider = [r for r in range(adapter.size()) if r not in ranks]
    if outsider:
        x = adapter.tensor(np.zeros(2, np.float32), "float32")
        cases += _expect_value_error(f"broadcast on {process_set} from non-member root {outsider[0]}",
                                     lambda: adapter.broadcast(x, outsider[0], "set.outsider_root", False,
                                                               process_set=process_set))
    if hasattr(adapter, "alltoall"):
        cases += check_alltoall(adapter, process_set, dtypes=["float32", "int64"])
    if hasattr(adapter, "reducescatter"):
        cases += check_reducescatter(adapter, process_set, dtypes=["float32", "int32"])
    if hasattr(adapter, "grouped_allgather"):
        cases += check_grouped_allgather(adapter, process_set)
    if hasattr(adapter, "grouped_reducescatter"):
        cases += check_grouped_reducescatter(adapter, process_set)
    if hasattr(adapter, "barrier"):
        cases += check_barrier(adapter, process_set)
    return cases


def check_non_member_ops(adapter, process_set):
    """A rank outside the set may not submit on it: ValueError at submission."""
    x = adapter.tensor(np.zeros((2 * len(process_set.ranks), 2), np.float32), "float32")
    root = process_set.ranks[0]
    submissions = {
        "allreduce": lambda: adapter.allreduce(x, SUM, 1.0, 1.0, "outsider", False, process_set=process_set),
        "allgather": lambda: adapter.allgather(x, "outsider", process_set=process_set),
        "broadcast": lambda: adapter.broadcast(x, root, "outsider", False, process_set=process_set),
        "alltoall": lambda: adapter.alltoall(x, None, "outsider", process_set=process_set),
        "reducescatter": lambda: adapter.reducescatter(x, SUM, "outsider", process_set=process_set),
        "barrier": lambda: adapter.barrier(process_set=process_set),
    }
    return sum(_expect_value_error(f"{op} by non-member rank {adapter.rank()} on {process_set}", submit)
               for op, submit in submissions.items() if hasattr(adapter, op))


def _global_sync(adapter):
    if hasattr(adapter, "barrier"):
        adapter.barrier()
    else:
        adapter.allreduce(adapter.tensor(np.zeros(1, np.float32), "float32"), SUM, 1.0, 1.0, "sync", False)


def _registered():
    from horovod.common.basics import HorovodBasics
    return {int(k): list(v) for k, v in HorovodBasics()._get_process_set_ids_and_ranks().items()}


def check_concurrent_sets(adapter, low, high, steps=20):
    """Two disjoint sets at once: each member loops over its own set's allreduces (the same
    names in both sets) while the other set does the same."""
    process_set = low if adapter.rank() in low.ranks else high
    cases = 0
    for step in range(steps):
        for dtype, op in (("float32", SUM), ("int32", AVERAGE)):
            x = adapter.tensor(rank_input(adapter.rank(), dtype, (6,), salt=300 + step), dtype)
            result = adapter.allreduce(x, op, 1.0, 1.0, f"loop.{dtype}", False, process_set=process_set)
            expected = reference_allreduce([rank_input(r, dtype, (6,), salt=300 + step) for r in process_set.ranks],
                                           op, 1.0, 1.0, dtype)
            assert_equal(adapter.to_numpy(result), expected, dtype, f"allreduce step {step} on {process_set}")
            cases += 1
    return cases


def run_process_set_suite(adapter_factory):
    """Dynamic process sets (init(process_sets="dynamic")) at size >= 2."""
    adapter = adapter_factory()
    adapter.init(process_sets="dynamic")
    rank, size = adapter.rank(), adapter.size()
    everyone = list(range(size))
    counts = {"identity": 0, "member_ops": 0, "non_member_ops": 0, "registry": 0}
    candidates = [list(range(0, size, 2)), sorted({0, size - 1}), [size - 1]]
    rank_lists = []
    for ranks in candidates:
        if ranks != everyone and ranks not in rank_lists:
            rank_lists.append(ranks)
    sets = [adapter.add_process_set(ranks) for ranks in rank_lists]
    ids = [ps.process_set_id for ps in sets]
    if ids != list(range(1, len(sets) + 1)):
        raise AssertionError(f"dynamic sets {rank_lists} got ids {ids}, expected 1..{len(sets)}")
    expected_registry = {0: everyone, **{i + 1: r for i, r in enumerate(rank_lists)}}
    if _registered() != expected_registry:
        raise AssertionError(f"registered sets {_registered()}, expected {expected_registry}")
    counts["registry"] += 1
    for ranks in (rank_lists[0], everyone):
        counts["registry"] += _expect_value_error(f"adding a duplicate of {ranks}",
                                                  lambda ranks=ranks: adapter.add_process_set(ranks))
    for ps in sets:
        counts["identity"] += check_set_identity(adapter, ps)
        if rank in ps.ranks:
            counts["member_ops"] += check_member_ops(adapter, ps)
        else:
            counts["non_member_ops"] += check_non_member_ops(adapter, ps)
        _global_sync(adapter)
    # Remove newest first, so that "oldest freed first" (core.md §5.2) differs from "lowest first".
    for ps in reversed(sets):
        if adapter.remove_process_set(ps) is not True or ps.process_set_id is not None:
            raise AssertionError(f"remove_process_set({ps}) failed or left the id")
    if _registered() != {0: everyone}:
        raise AssertionError(f"after removing every set: {_registered()}")
    if adapter.remove_process_set(sets[0]) is not False:
        raise AssertionError("removing an already removed set did not return False")
    from horovod.common.process_sets import global_process_set
    if adapter.remove_process_set(global_process_set) is not False:
        raise AssertionError("removing the global set did not return False")
    counts["registry"] += 3
    half = size // 2
    low, high = adapter.add_process_set(list(range(half))), adapter.add_process_set(list(range(half, size)))
    expected_ids = [len(sets), len(sets) - 1]
    if [low.process_set_id, high.process_set_id] != expected_ids:
        raise AssertionError(f"after freeing ids {list(range(len(sets), 0, -1))} in that order, new sets got "
                             f"{[low.process_set_id, high.process_set_id]}, expected {expected_ids}")
    counts["registry"] += 1
    counts["concurrent"] = check_concurrent_sets(adapter, low, high)
    _global_sync(adapter)
    # The global set still works while other sets exist.
    x = adapter.tensor(rank_input(rank, "float32", (3,)), "float32")
    assert_equal(adapter.to_numpy(adapter.allreduce(x, AVERAGE, 1.0, 1.0, "global_after_sets", False)),
                 reference_allreduce([rank_input(r, "float32", (3,)) for r in everyone], AVERAGE, 1.0, 1.0, "float32"),
                 "float32", "global allreduce next to other sets")
    for ps in (low, high):
        if adapter.remove_process_set(ps) is not True:
            raise AssertionError(f"remove_process_set({ps}) failed")
    counts["registry"] += 1
    return counts


def run_static_process_set_suite(adapter_factory):
    """Static sets through init(process_sets=[...]) at size >= 2: ids 1..k in list order, a
    duplicate entry raises ValueError but leaves Horovod initialised with the others, and
    add_process_set needs dynamic sets. With ``adapter.shutdown``, also re-initialises with a
    duplicate of the global set."""
    from horovod.common.process_sets import ProcessSet
    size = int(os.environ["HOROVOD_SIZE"])
    everyone = list(range(size))
    counts = {"registry": 0, "identity": 0, "member_ops": 0, "non_member_ops": 0}
    sets = [ProcessSet([0]), ProcessSet(range(size - 1, 0, -1)), ProcessSet([0])]
    adapter = adapter_factory()
    try:
        adapter.init(process_sets=sets)
    except ValueError as e:
        if "2" not in str(e):
            raise AssertionError(f"the duplicate's error does not name its index 2: {e}") from e
    else:
        raise AssertionError("init with a duplicate process set did not raise ValueError")
    rank = adapter.rank()  # still initialised
    ids = [ps.process_set_id for ps in sets]
    if ids != [1, 2, None]:
        raise AssertionError(f"static sets got ids {ids}, expected [1, 2, None]")
    expected = {0: everyone, 1: [0], 2: everyone[1:]}
    if _registered() != expected:
        raise AssertionError(f"registered sets {_registered()}, expected {expected}")
    counts["registry"] += 2
    counts["registry"] += _expect_value_error("add_process_set without dynamic process sets",
                                              lambda: adapter.add_process_set([0]))
    for ps in sets[:2]:
        counts["identity"] += check_set_identity(adapter, ps)
        if rank in ps.ranks:
            counts["member_ops"] += check_member_ops(adapter, ps)
        else:
            counts["non_member_ops"] += check_non_member_ops(adapter, ps)
        _global_sync(adapter)
    if hasattr(adapter, "shutdown"):
        adapter.shutdown()
        duplicate_of_global = ProcessSet(everyone)
        counts["registry"] += _expect_value_error("init with a duplicate of the global set",
                                                  lambda: adapter.init(process_sets=[duplicate_of_global]))
        if duplicate_of_global.process_set_id is not None or _registered() != {0: everyone}:
            raise AssertionError(f"after re-init with a duplicate of the global set: {duplicate_of_global}, "
                                 f"{_registered()}")
        x = adapter.tensor(rank_input(rank, "int32", (3,)), "int32")
        assert_equal(adapter.to_numpy(adapter.allreduce(x, AVERAGE, 1.0, 1.0, "reinit", False)),
                     reference_allreduce([rank_input(r, "int32", (3,)) for r in everyone], AVERAGE, 1.0, 1.0, "int32"),
                     "int32", "allreduce after re-init")
        counts["registry"] += 2
    return counts
