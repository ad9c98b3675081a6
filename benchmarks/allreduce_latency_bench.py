"""Distribution and CPU cost of Horovod's allreduce at a few sizes, for comparing two builds of
the engine (or two settings) in alternating runs on the same machine.

    horovodrun -np 2 -H host1:1,host2:1 python benchmarks/allreduce_latency_bench.py \
        --sizes 4,65536,262144,1048576,4194304

For each size (bytes of float32): --warmup in-place allreduces, then --iters timed ones, each timed
on its own. Rank 0 prints one line per size: the calling process's CPU time per allreduce (user +
system, all its threads: the engine's background thread included) and the 10th, 25th, 50th, 75th
and 90th percentiles of rank 0's wall time per allreduce, in microseconds. Unlike
allreduce_bench.py (medians, the largest over ranks, next to torch.distributed) it shows how wide
a size's distribution is and what the wait costs the CPU: on the shared 2-core machine single
calls move by 2x between runs, so builds are compared over several alternating runs.
"""

import argparse
import time

import numpy as np
import torch

import horovod.torch as hvd


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4,4096,65536,262144,1048576,4194304",
                        help="comma-separated sizes in bytes (float32 elements = size / 4)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--iters", type=int, default=300)
    args = parser.parse_args()
    hvd.init()
    for size in (int(s) for s in args.sizes.split(",")):
        x = torch.ones(max(1, size // 4))
        for _ in range(args.warmup):
            hvd.allreduce_(x, name=f"latency.{size}")
        times = np.empty(args.iters)
        cpu = time.process_time()
        for i in range(args.iters):
            start = time.perf_counter()
            hvd.allreduce_(x, name=f"latency.{size}")
            times[i] = time.perf_counter() - start
        cpu_us = (time.process_time() - cpu) / args.iters * 1e6
        if hvd.rank() == 0:
            pct = " ".join(f"p{p}={np.percentile(times, p) * 1e6:.0f}" for p in (10, 25, 50, 75, 90))
            print(f"{size} B: cpu/op={cpu_us:.0f} us {pct} (us)", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
