"""One rank of an MPI test job (run by test_mpi.py under mpirun): runs the named suite and writes
its result to <outdir>/rank<r>.json."""

import json
import os
import sys
import traceback


def collectives():
    from horovod_testing.collectives import NumpyAdapter, run_collective_suite
    return run_collective_suite(NumpyAdapter)


def process_sets():
    from horovod_testing.collectives import NumpyAdapter
    from horovod_testing.process_sets import run_process_set_suite
    return run_process_set_suite(NumpyAdapter)


def static_process_sets():
    from horovod_testing.collectives import NumpyAdapter
    from horovod_testing.process_sets import run_static_process_set_suite
    # The suite reads the job size before init; under mpirun it comes from Open MPI.
    os.environ["HOROVOD_SIZE"] = os.environ["OMPI_COMM_WORLD_SIZE"]
    return run_static_process_set_suite(NumpyAdapter)


def join():
    from horovod_testing.collectives import NumpyAdapter, run_join_suite
    return run_join_suite(NumpyAdapter)


def basics():
    from horovod.common.basics import HorovodBasics
    hvd = HorovodBasics()
    hvd.init()
    return {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
            "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(), "mpi_enabled": hvd.mpi_enabled(),
            "mpi_built": hvd.mpi_built(), "threads": hvd.mpi_threads_supported() if hvd.mpi_enabled() else None,
            "gloo_enabled": hvd.gloo_enabled()}


def _allreduce_sum(value):
    import numpy as np

    from horovod.common import ops
    x = np.array([value], np.float64)
    ops.wait(ops.allreduce_async([x], [x], ["allreduce.sum"], 1))
    return float(x[0])


def split_comm():
    """Two independent Horovod jobs on the halves of MPI_COMM_WORLD (even and odd ranks)."""
    from mpi4py import MPI

    from horovod.common.basics import HorovodBasics
    world = MPI.COMM_WORLD
    half = world.Split(world.Get_rank() % 2, world.Get_rank())
    hvd = HorovodBasics()
    hvd.init(comm=half)
    return {"size": hvd.size(), "rank": hvd.rank(), "sum": _allreduce_sum(world.Get_rank())}


def rank_list():
    """hvd.init(comm=[0, 1]): ranks 0 and 1 form the job; the last rank is refused."""
    from mpi4py import MPI

    from horovod.common.basics import HorovodBasics
    hvd = HorovodBasics()
    try:
        hvd.init(comm=[0, 1])
    except ValueError as e:
        return {"error": str(e)}
    return {"size": hvd.size(), "rank": hvd.rank(), "sum": _allreduce_sum(MPI.COMM_WORLD.Get_rank() + 1)}


def comm_process_set():
    """A process set built from an mpi4py communicator."""
    from mpi4py import MPI

    import numpy as np

    from horovod.common import ops
    from horovod.common.basics import HorovodBasics
    from horovod.common.process_sets import ProcessSet
    world = MPI.COMM_WORLD
    evens = world.Split(0 if world.Get_rank() % 2 == 0 else MPI.UNDEFINED, world.Get_rank())
    # Every rank must register the same sets: the non-members describe it by ranks.
    ps = ProcessSet(evens) if evens != MPI.COMM_NULL else ProcessSet(range(0, world.Get_size(), 2))
    hvd = HorovodBasics()
    hvd.init(process_sets=[ps])
    result = {"ranks": ps.ranks, "id": ps.process_set_id}
    if world.Get_rank() % 2 == 0:
        x = np.array([world.Get_rank()], np.float64)
        ops.wait(ops.allreduce_async([x], [x], ["allreduce.evens"], 1,
                                     process_set_id=ps.process_set_id))
        result["sum"] = float(x[0])
        result["comm_id"] = hvd._comm_process_set_id(evens)
    ops.barrier()  # the odd ranks stay until the set's work is done (a rank exiting shuts all down)
    return result


def hierarchical():
    """Two fake hosts of two ranks (HOROVOD_HOSTNAME from the MPI rank) with hierarchical
    allreduce and allgather: results against numpy references, and the engine's stats."""
    import numpy as np

    from horovod.common import _core
    from horovod_testing.collectives import (AVERAGE, MAX, MIN, PRODUCT, SUM, NumpyAdapter, assert_equal,
                                             rank_input, reference_allreduce)
    os.environ["HOROVOD_HOSTNAME"] = "fakehost%d" % (int(os.environ["OMPI_COMM_WORLD_RANK"]) // 2)
    adapter = NumpyAdapter()
    adapter.init()
    rank, size = adapter.rank(), adapter.size()
    cases = 0
    for dtype in ["uint8", "int32", "int64", "float16", "float32", "float64"]:
        for count in [1, 7, 1023, 300_001]:
            for op in [AVERAGE, SUM, MIN, MAX, PRODUCT] if count < 1000 else [SUM]:
                x = rank_input(rank, dtype, (count,), salt=op)
                result = adapter.allreduce(x, op, 1.0, 1.0, f"h.{dtype}.{count}.{op}", inplace=True)
                expected = reference_allreduce([rank_input(r, dtype, (count,), salt=op) for r in range(size)], op,
                                               1.0, 1.0, dtype)
                assert_equal(result, expected, dtype, f"allreduce {dtype} x{count} op {op}")
                cases += 1
    rows = [(r * 7 + 3) % 5 for r in range(size)]
    gathered = adapter.allgather(rank_input(rank, "int16", (rows[rank], 3), salt=1), "h.gather")
    expected = np.concatenate([rank_input(r, "int16", (rows[r], 3), salt=1) for r in range(size)])
    assert_equal(gathered, expected, "int16", "allgather")
    stats = dict(_core.engine_stats())
    adapter.shutdown()
    return {"cases": cases, "stats": stats}


def main():
    name, outdir = sys.argv[1], sys.argv[2]
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
    try:
        outcome = {"ok": globals()[name]()}
    except BaseException:  # noqa: B036  (reported to the test, which fails with it)
        outcome = {"error": traceback.format_exc()}
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(outcome, f)


if __name__ == "__main__":
    main()
