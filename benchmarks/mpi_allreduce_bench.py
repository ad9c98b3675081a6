"""Allreduce of horovod.torch over its MPI backend against raw mpi4py, in the same processes.

Run one process per rank under mpirun (or horovodrun --mpi), on one host:

    mpirun -np 2 python benchmarks/mpi_allreduce_bench.py --json out.json --markdown out.md
    horovodrun --mpi -np 2 python benchmarks/mpi_allreduce_bench.py

Horovod must run its MPI controller and CPU operations (the default under an MPI launcher when
horovod-core was built with MPI); the script stops otherwise. Two measurements:
1. a sweep of float32 sum allreduces from --min-bytes to --max-bytes (x --step-factor), in place:
   horovod.torch's allreduce_ on a torch tensor, and mpi4py's comm.Allreduce(IN_PLACE) on a numpy
   array; the median of --iters timed calls after --warmup calls, and one checked call per size;
2. a training-like step of --small-tensors tensors of --small-bytes: Horovod submits them all
   asynchronously and then waits (so it can fuse them), mpi4py does the same allreduces blocking,
   one by one; the median over --small-steps steps.

Columns and formulas: benchmarks/README.md. The same-process comparison measures Horovod's
overhead (negotiation, fusion, the background thread) over the MPI library it calls.
"""

import argparse
import statistics
import sys
import time

import mpi4py
import numpy as np
import torch
from mpi4py import MPI

import horovod.torch as hvd
import report

# Goals this benchmark reports against: Horovod's 64 MiB allreduce at least this fraction of
# raw MPI's bandwidth, and its many-small-tensors step at most this multiple of raw MPI's time.
LARGE_BANDWIDTH_GOAL = 0.9
SMALL_STEP_GOAL = 2.0

COMM = MPI.COMM_WORLD


class Horovod:
    name = "horovod (MPI)"

    def buffer(self, count: int, value: float):
        return torch.full((count,), value, dtype=torch.float32)

    def allreduce(self, tensor: torch.Tensor) -> None:
        hvd.allreduce_(tensor, op=hvd.Sum, name=f"bench.{tensor.numel()}")

    def allreduce_many(self, tensors: list[torch.Tensor]) -> None:
        handles = [hvd.allreduce_async_(t, op=hvd.Sum, name=f"bench.small.{i}")
                   for i, t in enumerate(tensors)]
        for handle in handles:
            hvd.synchronize(handle)


class Mpi4py:
    name = "mpi4py"

    def buffer(self, count: int, value: float):
        return np.full(count, value, dtype=np.float32)

    def allreduce(self, array: np.ndarray) -> None:
        COMM.Allreduce(MPI.IN_PLACE, array, op=MPI.SUM)

    def allreduce_many(self, arrays: list[np.ndarray]) -> None:
        for array in arrays:
            COMM.Allreduce(MPI.IN_PLACE, array, op=MPI.SUM)


def slowest(seconds: float) -> float:
    """The largest of every rank's `seconds`: a collective has finished when its last rank has."""
    return COMM.allreduce(seconds, op=MPI.MAX)


def count_wrong(buffers) -> int:
    """Elements, over all ranks, that differ from the sum of the ranks' inputs (rank + 1 each)."""
    expected = COMM.Get_size() * (COMM.Get_size() + 1) / 2
    wrong = sum(int((np.asarray(b) != expected).sum()) for b in buffers)
    return COMM.allreduce(wrong, op=MPI.SUM)


def sweep_row(lib, count: int, warmup: int, iters: int) -> dict:
    # The timed calls reduce zeros in place, which stay zeros: repeated sums of other data would
    # grow by a factor of size each call and overflow.
    buffer = lib.buffer(count, 0.0)
    for _ in range(warmup):
        lib.allreduce(buffer)
    COMM.Barrier()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        lib.allreduce(buffer)
        times.append(time.perf_counter() - start)
    checked = lib.buffer(count, float(COMM.Get_rank() + 1))
    lib.allreduce(checked)
    return report.row(lib.name, count * 4, count, slowest(statistics.median(times)),
                      slowest(statistics.mean(times)), count_wrong([checked]), COMM.Get_size())


def many_small_row(lib, tensors: int, count: int, warmup: int, steps: int) -> dict:
    batch = [lib.buffer(count, 0.0) for _ in range(tensors)]
    for _ in range(warmup):
        lib.allreduce_many(batch)
    times = []
    for _ in range(steps):
        COMM.Barrier()
        start = time.perf_counter()
        lib.allreduce_many(batch)
        times.append(time.perf_counter() - start)
    checked = [lib.buffer(count, float(COMM.Get_rank() + 1)) for _ in range(tensors)]
    lib.allreduce_many(checked)
    return {
        "library": lib.name,
        "tensors": tensors,
        "bytes_per_tensor": count * 4,
        "median_step_ms": slowest(statistics.median(times)) * 1e3,
        "wrong": count_wrong(checked),
    }


def goals(sweep: list[dict], many_small: list[dict]) -> dict:
    """Horovod against mpi4py at the largest size and in the many-small step."""
    largest = max(r["size"] for r in sweep)
    hvd_large, mpi_large = (next(r for r in sweep if r["size"] == largest and r["library"] == lib)
                            for lib in (Horovod.name, Mpi4py.name))
    hvd_small, mpi_small = (next(r for r in many_small if r["library"] == lib)
                            for lib in (Horovod.name, Mpi4py.name))
    bandwidth_ratio = hvd_large["busbw_GBps"] / mpi_large["busbw_GBps"]
    step_ratio = hvd_small["median_step_ms"] / mpi_small["median_step_ms"]
    return {
        "largest_size": largest,
        "large_bandwidth_ratio": bandwidth_ratio,
        "large_bandwidth_goal": LARGE_BANDWIDTH_GOAL,
        "large_bandwidth_met": bandwidth_ratio >= LARGE_BANDWIDTH_GOAL,
        "small_step_ratio": step_ratio,
        "small_step_goal": SMALL_STEP_GOAL,
        "small_step_met": step_ratio <= SMALL_STEP_GOAL,
    }


def goals_text(g: dict) -> list[str]:
    return [
        f"{g['largest_size']} B allreduce: horovod busbw / mpi4py busbw = "
        f"{g['large_bandwidth_ratio']:.2f} (goal >= {g['large_bandwidth_goal']}: "
        f"{'met' if g['large_bandwidth_met'] else 'NOT met'})",
        f"many small tensors: horovod step / mpi4py step = {g['small_step_ratio']:.2f} "
        f"(goal <= {g['small_step_goal']}: {'met' if g['small_step_met'] else 'NOT met'})",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-bytes", type=int, default=4)
    parser.add_argument("--max-bytes", type=int, default=64 << 20)
    parser.add_argument("--step-factor", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--small-tensors", type=int, default=200)
    parser.add_argument("--small-bytes", type=int, default=16 << 10)
    parser.add_argument("--small-steps", type=int, default=20)
    parser.add_argument("--json", help="write every row and the machine description here")
    parser.add_argument("--markdown", help="write a summary table here")
    args = parser.parse_args()

    hvd.init()
    if not hvd.mpi_enabled():
        sys.exit("mpi_allreduce_bench: Horovod is not using MPI (mpi_built() = %s); run under "
                 "mpirun or horovodrun --mpi with horovod-core built with MPI" % hvd.mpi_built())
    machine = report.machine(hvd.size())  # before the measurements load the machine
    machine["mpi"] = MPI.Get_library_version().splitlines()[0].strip()
    machine["mpi4py"] = mpi4py.__version__
    libs = [Horovod(), Mpi4py()]
    root = hvd.rank() == 0
    if root:
        print(report.header([lib.name for lib in libs]), flush=True)

    sweep = []
    size = args.min_bytes
    while size <= args.max_bytes:
        rows = [sweep_row(lib, size // 4, args.warmup, args.iters) for lib in libs]
        sweep.extend(rows)
        if root:
            print(report.line(rows), flush=True)
        size *= args.step_factor

    many_small = [many_small_row(lib, args.small_tensors, args.small_bytes // 4, 3,
                                 args.small_steps) for lib in libs]
    if root:
        for row in many_small:
            print(report.many_small_line(row), flush=True)
        results = {"machine": machine, "allreduce": sweep, "many_small": many_small,
                   "goals": goals(sweep, many_small)}
        for text in goals_text(results["goals"]):
            print("# " + text, flush=True)
        if args.json:
            report.write_json(args.json, results)
        if args.markdown:
            report.write_markdown(args.markdown, results)
            with open(args.markdown, "a") as f:
                f.write("\nmpi4py runs the many small allreduces blocking, one by one; "
                        f"MPI: {machine['mpi']}; mpi4py {machine['mpi4py']}.\n\nGoals:\n\n")
                f.write("".join(f"* {text}\n" for text in goals_text(results["goals"])))

    hvd.shutdown()


if __name__ == "__main__":
    main()
