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
rounds. The two configurations alternate --repeats times (off, on, off, on, ...) so that both see
the same machine load; the figures are medians over all their steps. Each run also idles for
--idle-seconds and reports the cost of one idle cycle (the negotiation round alone, with nothing
to negotiate). Rank 0 prints a table and, with --json, writes the figures.
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


def run(basics, capacity, args, totals):
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
            handles.append(ops.allreduce_async([t], [t], [name], basics.Average))
        for h in handles:
            ops.wait(h)
        elapsed = time.perf_counter() - start
        after = _core.engine_stats()
        if step >= args.warmup:
            step_ms.append(elapsed * 1e3)
            negotiation_ms.append((after["negotiation_us"] - before["negotiation_us"]) / 1e3)
            rounds.append(after["coordinator_rounds"] - before["coordinator_rounds"])
            hits.append(after["cache_hits"] - before["cache_hits"])
    before = _core.engine_stats()
    time.sleep(args.idle_seconds)
    after = _core.engine_stats()
    basics.shutdown()
    idle_cycles = after["cycles"] - before["cycles"]
    t = totals.setdefault(capacity, {"step_ms": [], "negotiation_ms": [], "rounds": [], "hits": [], "idle_us": []})
    t["step_ms"] += step_ms
    t["negotiation_ms"] += negotiation_ms
    t["rounds"] += rounds
    t["hits"] += hits
    t["idle_us"].append((after["negotiation_us"] - before["negotiation_us"]) / max(idle_cycles, 1))


def summary(capacity, t):
    return {
        "cache_capacity": capacity,
        "step_ms_median": statistics.median(t["step_ms"]),
        "negotiation_ms_per_step_median": statistics.median(t["negotiation_ms"]),
        "coordinator_rounds_per_step_median": statistics.median(t["rounds"]),
        "cache_hits_per_step_median": statistics.median(t["hits"]),
        "idle_cycle_us_median": statistics.median(t["idle_us"]),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tensors", type=int, default=100, help="allreduces per step (default 100)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first (default 10)")
    parser.add_argument("--steps", type=int, default=100, help="timed steps (default 100)")
    parser.add_argument("--repeats", type=int, default=3, help="alternations of off and on (default 3)")
    parser.add_argument("--idle-seconds", type=float, default=1.0, help="idle time measured per run (default 1)")
    parser.add_argument("--json", help="write the results here (rank 0)")
    args = parser.parse_args()
    basics = HorovodBasics()
    totals = {}
    for _ in range(args.repeats):
        for capacity in (0, 1024):
            run(basics, capacity, args, totals)
    results = [summary(capacity, totals[capacity]) for capacity in (0, 1024)]
    if int(os.environ.get("HOROVOD_RANK", "0")) != 0:
        return
    size = int(os.environ.get("HOROVOD_SIZE", "1"))
    print(f"{args.tensors} allreduces per step, np={size}, median over {args.repeats} x {args.steps} steps")
    print(f"{'cache':>8} {'step (ms)':>10} {'negotiation (ms)':>17} {'coordinator rounds':>19} {'cache hits':>11} "
          f"{'idle cycle (us)':>16}")
    for r in results:
        print(f"{r['cache_capacity']:>8} {r['step_ms_median']:>10.2f} {r['negotiation_ms_per_step_median']:>17.2f} "
              f"{r['coordinator_rounds_per_step_median']:>19} {r['cache_hits_per_step_median']:>11} "
              f"{r['idle_cycle_us_median']:>16.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"host": socket.gethostname(), "np": size, "cpus": os.cpu_count(), "tensors": args.tensors,
                       "steps": args.steps, "repeats": args.repeats, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
