"""GPU allreduce of horovod.torch (NCCL) against torch.distributed's NCCL backend, in the same processes.

Run one process per GPU under the launcher (np=1 works too, on one GPU):

    horovodrun -np 2 -H localhost:2 python benchmarks/gpu_allreduce_bench.py --json out.json

For each size from --min-bytes (1 KiB) to --max-bytes (1 GiB), doubling, and each library: float32
sum allreduces in place on one CUDA tensor of the rank's GPU (``hvd.local_rank()``), --warmup calls,
then --iters calls timed together with CUDA events on the current stream, then one checked call.
Rank 0 prints nccl-tests' columns (benchmarks/README.md): size, count, type, redop, then per library
time (us, the slowest rank's mean per call), algbw = size / time and busbw = algbw * 2(n-1)/n
(GB/s, 10^9 bytes per second) and #wrong (elements of the checked call that differ, over the ranks).

Exits with status 2 and the reason when no CUDA device is visible or Horovod was built without NCCL.
"""

import argparse
import json
import sys

import torch


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-bytes", type=int, default=1 << 10, help="smallest tensor, bytes (1 KiB)")
    parser.add_argument("--max-bytes", type=int, default=1 << 30, help="largest tensor, bytes (1 GiB)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls per size")
    parser.add_argument("--iters", type=int, default=20, help="timed calls per size")
    parser.add_argument("--no-torch", action="store_true", help="skip torch.distributed (NCCL)")
    parser.add_argument("--json", help="write the rows to this file (rank 0)")
    args = parser.parse_args(argv)
    if args.min_bytes < 4 or args.max_bytes < args.min_bytes:
        parser.error("need 4 <= --min-bytes <= --max-bytes")
    return args


def gpu_problem(hvd):
    if not torch.cuda.is_available():
        return "no CUDA device visible (torch.cuda.is_available() is False)"
    if not hvd.cuda_built():
        return "this build of Horovod has no NCCL support (rebuild horovod-core with HOROVOD_GPU_OPERATIONS=NCCL)"
    return None


def time_calls(allreduce, tensor, warmup, iters):
    """Mean seconds per call, timed with CUDA events on the current stream."""
    for _ in range(warmup):
        allreduce(tensor)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        allreduce(tensor)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000.0 / iters


def main(argv=None):
    args = parse_args(argv)
    import horovod.torch as hvd

    problem = gpu_problem(hvd)
    if problem:
        print(f"gpu_allreduce_bench: cannot run: {problem}", file=sys.stderr)
        return 2
    hvd.init()
    torch.cuda.set_device(hvd.local_rank())
    n = hvd.size()
    libs = [("horovod", lambda t: hvd.allreduce_(t, op=hvd.Sum, name=f"bench.{t.numel()}"))]
    dist = None
    if not args.no_torch:
        import torch.distributed as dist
        from allreduce_bench import init_torch_distributed

        init_torch_distributed("nccl", device_id=torch.device("cuda", hvd.local_rank()))
        libs.append(("torch.distributed nccl", lambda t: dist.all_reduce(t)))

    def slowest(seconds):
        t = torch.tensor([seconds], dtype=torch.float64)
        return hvd.allreduce(t, op=hvd.Max, name="bench.slowest").item()

    def wrong_elements(t):
        expected = n * (n + 1) / 2
        w = torch.tensor([int((t != expected).sum().item())])
        return int(hvd.allreduce(w, op=hvd.Sum, name="bench.wrong").item())

    rows = []
    if hvd.rank() == 0:
        head = f"{'size (B)':>12} {'count':>11} {'type':>6} {'redop':>5}"
        for name, _ in libs:
            head += f" | {name}: {'time (us)':>10} {'algbw':>7} {'busbw':>7} {'#wrong':>6}"
        print(head, flush=True)
    size = args.min_bytes
    while size <= args.max_bytes:
        count = size // 4
        line = f"{count * 4:>12} {count:>11} {'float':>6} {'sum':>5}"
        for name, allreduce in libs:
            tensor = torch.ones(count, dtype=torch.float32, device="cuda")
            seconds = slowest(time_calls(allreduce, tensor, args.warmup, args.iters))
            tensor.fill_(hvd.rank() + 1)
            allreduce(tensor)
            wrong = wrong_elements(tensor)
            algbw = count * 4 / seconds / 1e9
            busbw = algbw * 2 * (n - 1) / n
            rows.append({"library": name, "size": count * 4, "count": count, "ranks": n, "time_us": seconds * 1e6,
                         "algbw": algbw, "busbw": busbw, "wrong": wrong})
            line += f" | {name}: {seconds * 1e6:>10.1f} {algbw:>7.2f} {busbw:>7.2f} {wrong:>6}"
            del tensor
        if hvd.rank() == 0:
            print(line, flush=True)
        size *= 2
    if hvd.rank() == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "ranks": n, "nccl_built": hvd.nccl_built(),
                       "rows": rows}, f, indent=1)
    if dist is not None:
        dist.destroy_process_group()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
