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
import sys

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


def job() -> report.Job:
    def slowest(seconds: float) -> float:
        return COMM.allreduce(seconds, op=MPI.MAX)

    def count_wrong(buffers) -> int:
        expected = COMM.Get_size() * (COMM.Get_size() + 1) / 2
        wrong = sum(int((np.asarray(b) != expected).sum()) for b in buffers)
        return COMM.allreduce(wrong, op=MPI.SUM)

    return report.Job(COMM.Get_rank(), COMM.Get_size(), COMM.Barrier, slowest, count_wrong)


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
    report.add_arguments(parser)
    args = parser.parse_args()

    hvd.init()
    if not hvd.mpi_enabled():
        sys.exit("mpi_allreduce_bench: Horovod is not using MPI (mpi_built() = %s); run under "
                 "mpirun or horovodrun --mpi with horovod-core built with MPI" % hvd.mpi_built())
    machine = report.machine(hvd.size())  # before the measurements load the machine
    machine["mpi"] = MPI.Get_library_version().replace("\0", "").splitlines()[0].strip()
    machine["mpi4py"] = mpi4py.__version__
    libs = [Horovod(), Mpi4py()]
    root = hvd.rank() == 0
    sweep, many_small = report.measure(libs, job(), args)
    if root:
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
