"""CPU cost of submitting (and of synchronizing) small in-place allreduces from PyTorch.

Measures, on the calling thread only (``time.thread_time``, so the engine's background thread and
other processes do not count), the CPU time of ``hvd.allreduce_async_`` on a small float32 tensor
and of ``hvd.synchronize`` on its handle, in batches of ``--batch`` tensors (submit the batch,
then synchronize it), as a training step does. Prints the median over ``--repeats`` batches of
microseconds per call. ``--profile FILE`` also writes a cProfile of one more run of the batches.

    python benchmarks/submit_cost_bench.py                   # np=1 (no launcher needed)
    horovodrun -np 2 -H localhost:2 python benchmarks/submit_cost_bench.py
"""

import argparse
import cProfile
import json
import statistics
import time

import torch

import horovod.torch as hvd


def run_batches(tensors, repeats):
    submit, sync = [], []
    for _ in range(repeats):
        t0 = time.thread_time_ns()
        handles = [hvd.allreduce_async_(t, op=hvd.Sum) for t in tensors]
        t1 = time.thread_time_ns()
        for h in handles:
            hvd.synchronize(h)
        t2 = time.thread_time_ns()
        submit.append((t1 - t0) / len(tensors) / 1e3)
        sync.append((t2 - t1) / len(tensors) / 1e3)
    return submit, sync


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=200, help="tensors submitted before synchronizing")
    parser.add_argument("--elements", type=int, default=16, help="float32 elements per tensor")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--profile", help="write a cProfile (pstats) of extra batches here")
    parser.add_argument("--json", help="append a JSON line with the medians here")
    args = parser.parse_args()
    hvd.init()
    tensors = [torch.zeros(args.elements) for _ in range(args.batch)]
    run_batches(tensors, 5)  # warm-up: fills the response cache
    submit, sync = run_batches(tensors, args.repeats)
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        run_batches(tensors, args.repeats)
        profiler.disable()
        profiler.dump_stats(f"{args.profile}.{hvd.rank()}")
    result = {"rank": hvd.rank(), "size": hvd.size(), "batch": args.batch, "elements": args.elements,
              "submit_us": statistics.median(submit), "synchronize_us": statistics.median(sync)}
    print(json.dumps(result), flush=True)
    if args.json and hvd.rank() == 0:
        with open(args.json, "a") as f:
            f.write(json.dumps(result) + "\n")
    hvd.shutdown()


if __name__ == "__main__":
    main()
