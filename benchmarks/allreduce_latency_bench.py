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

With --mpi4py, launched by an MPI launcher (horovodrun --mpi), Horovod runs over Gloo (its
rendezvous set up by rank 0, as in multihost_bench.py) and each size is also timed with mpi4py's
in-place Allreduce, in the same processes right after Horovod; rank 0 adds mpi4py's percentiles
and the ratio of the two medians:

    horovodrun --mpi -np 2 -H host1:1,host2:1 --network-interfaces hvdbr0 \
        python benchmarks/allreduce_latency_bench.py --mpi4py --iface hvdbr0 --sizes 4,65536
"""

import argparse
import os
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
    parser.add_argument("--mpi4py", action="store_true",
                        help="also time mpi4py's Allreduce (needs an MPI launch; Horovod then runs over Gloo)")
    parser.add_argument("--iface", default="lo", help="with --mpi4py: the interface of Gloo's rendezvous")
    args = parser.parse_args()
    comm = server = None
    if args.mpi4py:
        from mpi4py import MPI

        from multihost_bench import host_rendezvous
        comm = MPI.COMM_WORLD
        server = host_rendezvous(comm, args.iface)
        os.environ.update({"HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo"})
    hvd.init()

    def percentiles(times):
        return " ".join(f"p{p}={np.percentile(times, p) * 1e6:.0f}" for p in (10, 25, 50, 75, 90))

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
        line = f"{size} B: cpu/op={cpu_us:.0f} us {percentiles(times)} (us)"
        if comm is not None:
            a = np.ones(max(1, size // 4), np.float32)
            for _ in range(args.warmup):
                comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)
            theirs = np.empty(args.iters)
            for i in range(args.iters):
                start = time.perf_counter()
                comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)
                theirs[i] = time.perf_counter() - start
            line += f"; mpi4py {percentiles(theirs)}; median ratio {np.median(times) / np.median(theirs):.2f}"
        if hvd.rank() == 0:
            print(line, flush=True)
    hvd.shutdown()
    if server is not None:
        server.stop()


if __name__ == "__main__":
    main()
