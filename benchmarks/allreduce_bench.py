"""Allreduce of horovod.torch against torch.distributed's Gloo backend, in the same processes.

Run one process per rank under the launcher, on one host:

    horovodrun -np 2 -H localhost:2 python benchmarks/allreduce_bench.py --json out.json

Two measurements, each for both libraries:
1. a sweep of float32 sum allreduces from --min-bytes to --max-bytes (x --step-factor), in place:
   the median of --iters timed calls after --warmup calls, and one checked call per size;
2. many small tensors: --small-tensors tensors of --small-bytes submitted asynchronously, then all
   waited on; the median over --small-steps steps.

Columns and formulas: benchmarks/README.md.
"""

import argparse
import socket
import statistics
import time

import torch
import torch.distributed as dist

import horovod.torch as hvd
import report


class Horovod:
    name = "horovod"

    def allreduce(self, tensor: torch.Tensor) -> None:
        hvd.allreduce_(tensor, op=hvd.Sum, name=f"bench.{tensor.numel()}")

    def allreduce_many(self, tensors: list[torch.Tensor]) -> None:
        handles = [
            hvd.allreduce_async_(t, op=hvd.Sum, name=f"bench.small.{i}")
            for i, t in enumerate(tensors)
        ]
        for handle in handles:
            hvd.synchronize(handle)


class TorchGloo:
    name = "torch.distributed gloo"

    def allreduce(self, tensor: torch.Tensor) -> None:
        dist.all_reduce(tensor)

    def allreduce_many(self, tensors: list[torch.Tensor]) -> None:
        works = [dist.all_reduce(t, async_op=True) for t in tensors]
        for work in works:
            work.wait()


def init_torch_distributed() -> None:
    """Joins torch.distributed's Gloo group on 127.0.0.1, at a port rank 0 picks and shares."""
    port = torch.zeros(1, dtype=torch.int64)
    if hvd.rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port[0] = s.getsockname()[1]
    hvd.broadcast_(port, root_rank=0, name="bench.port")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port.item()}", rank=hvd.rank(), world_size=hvd.size()
    )


def slowest(seconds: float) -> float:
    """The largest of every rank's `seconds`: a collective has finished when its last rank has."""
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def count_wrong(tensors: list[torch.Tensor]) -> int:
    """Elements, over all ranks, that differ from the sum of the ranks' inputs (rank + 1 each)."""
    expected = hvd.size() * (hvd.size() + 1) / 2
    wrong = torch.tensor([sum(int((t != expected).sum()) for t in tensors)])
    dist.all_reduce(wrong)
    return int(wrong.item())


def filled(count: int) -> torch.Tensor:
    return torch.full((count,), float(hvd.rank() + 1), dtype=torch.float32)


def sweep_row(lib, count: int, warmup: int, iters: int) -> dict:
    # The timed calls reduce zeros in place, which stay zeros: repeated sums of other data would
    # grow by a factor of size each call and overflow.
    tensor = torch.zeros(count, dtype=torch.float32)
    for _ in range(warmup):
        lib.allreduce(tensor)
    dist.barrier()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        lib.allreduce(tensor)
        times.append(time.perf_counter() - start)
    checked = filled(count)
    lib.allreduce(checked)
    return report.row(lib.name, count * 4, count, slowest(statistics.median(times)),
                      slowest(statistics.mean(times)), count_wrong([checked]), hvd.size())


def many_small_row(lib, tensors: int, count: int, warmup: int, steps: int) -> dict:
    batch = [torch.zeros(count, dtype=torch.float32) for _ in range(tensors)]
    for _ in range(warmup):
        lib.allreduce_many(batch)
    times = []
    for _ in range(steps):
        dist.barrier()
        start = time.perf_counter()
        lib.allreduce_many(batch)
        times.append(time.perf_counter() - start)
    checked = [filled(count) for _ in range(tensors)]
    lib.allreduce_many(checked)
    return {
        "library": lib.name,
        "tensors": tensors,
        "bytes_per_tensor": count * 4,
        "median_step_ms": slowest(statistics.median(times)) * 1e3,
        "wrong": count_wrong(checked),
    }


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
    machine = report.machine(hvd.size())  # before the measurements load the machine
    init_torch_distributed()
    libs = [Horovod(), TorchGloo()]
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

    many_small = [
        many_small_row(lib, args.small_tensors, args.small_bytes // 4, 3, args.small_steps)
        for lib in libs
    ]
    if root:
        for row in many_small:
            print(report.many_small_line(row), flush=True)
        results = {"machine": machine, "allreduce": sweep,
                   "many_small": many_small}
        if args.json:
            report.write_json(args.json, results)
        if args.markdown:
            report.write_markdown(args.markdown, results)

    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
