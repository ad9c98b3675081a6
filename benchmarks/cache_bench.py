"""Negotiation cost of a training-like step with the response cache off and on.

Run one process per rank under the launcher:

    horovodrun -np 2 -H localhost:2 python benchmarks/cache_bench.py --json out.json

Each step submits --tensors float32 allreduces (named like a model's gradients, sizes cycling
through 1 KiB .. 256 KiB) asynchronously, then waits for all of them: what DistributedOptimizer
does every step. The same processes run the loop twice, re-initialising Horovod in between:
first with HOROVOD_CACHE_CAPACITY=0 (every cycle negotiates through the coordinator), then with
the default capacity (1024: in the steady state one bitwise AND of a bit vector settles each
cycle). For each, after --warmup steps, --steps steps are timed; the engine's counters
(horovod.common._core.engine_stats) give the time spent negotiating and the number of coordinator
rounds. Rank 0 prints a table and, with --json, writes the figures.
"""

import argparse
import json
import os
import socket
import statistics
import time

import numpy as np

from horovod.common import _core, ops
from horovod.common.basics import HorovodBasics

SIZES = [256, 1024, 4096, 16384, 65536]  # float32 elements: 1 KiB .. 256 KiB


def run(basics, capacity, args):
    os.environ["HOROVOD_CACHE_CAPACITY"] = str(capacity)
    basics.init()
    tensors = [np.ones(SIZES[i % len(SIZES)], np.float32) for i in range(args.tensors)]
    names = [f"allreduce.layer{i}.weight.grad" for i in range(args.tensors)]
    step_ms, negotiation_ms, rounds, hits = [], [], [], []
    for step in range(args.warmup + args.steps):
        before = _core.engine_stats()
        start = time.perf_counter()
        handles = []
        for t, name in zip(tensors, names, strict=True):
            h = ops.new_handle()
            ops.allreduce_async(h, [t], [t], [name], basics.Average)
            handles.append(h)
        for h in handles:
            ops.wait(h)
        elapsed = time.perf_counter() - start
        after = _core.engine_stats()
        if step >= args.warmup:
            step_ms.append(elapsed * 1e3)
            negotiation_ms.append((after["negotiation_us"] - before["negotiation_us"]) / 1e3)
            rounds.append(after["coordinator_rounds"] - before["coordinator_rounds"])
            hits.append(after["cache_hits"] - before["cache_hits"])
    basics.shutdown()
    return {
        "cache_capacity": capacity,
        "step_ms_median": statistics.median(step_ms),
        "negotiation_ms_per_step_median": statistics.median(negotiation_ms),
        "coordinator_rounds_per_step_median": statistics.median(rounds),
        "cache_hits_per_step_median": statistics.median(hits),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tensors", type=int, default=100, help="allreduces per step (default 100)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first (default 10)")
    parser.add_argument("--steps", type=int, default=100, help="timed steps (default 100)")
    parser.add_argument("--json", help="write the results here (rank 0)")
    args = parser.parse_args()
    basics = HorovodBasics()
    results = [run(basics, 0, args), run(basics, 1024, args)]
    if int(os.environ.get("HOROVOD_RANK", "0")) != 0:
        return
    size = int(os.environ.get("HOROVOD_SIZE", "1"))
    print(f"{args.tensors} allreduces per step, np={size}, median over {args.steps} steps")
    print(f"{'cache':>8} {'step (ms)':>10} {'negotiation (ms)':>17} {'coordinator rounds':>19} {'cache hits':>11}")
    for r in results:
        print(f"{r['cache_capacity']:>8} {r['step_ms_median']:>10.2f} {r['negotiation_ms_per_step_median']:>17.2f} "
              f"{r['coordinator_rounds_per_step_median']:>19} {r['cache_hits_per_step_median']:>11}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"host": socket.gethostname(), "np": size, "cpus": os.cpu_count(), "tensors": args.tensors,
                       "steps": args.steps, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
