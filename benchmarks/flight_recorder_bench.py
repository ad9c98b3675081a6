"""What the flight recorder costs: the same workloads with it off and on, in the same processes.

Run one process per rank under the launcher:

    horovodrun --gloo -np 2 -H localhost:2 python benchmarks/flight_recorder_bench.py \\
        --markdown benchmarks/results/flight-recorder-np2.md

The processes alternate --repeats times between HOROVOD_FLIGHT_RECORDER_SIZE=0 (off) and the
default 1024 (on), re-initialising Horovod in between, so that both see the same machine load. Each
run measures, after --warmup untimed repetitions:

- the median latency of a synchronous 4 KiB float32 allreduce (microseconds);
- the median time of a training-like step: --tensors asynchronous 16 KiB allreduces, then waiting
  for all of them (milliseconds);
- the median submission cost in that step: the time spent in the allreduce_async calls, per call
  (microseconds of the calling thread).

Rank 0 prints the table and, with --json / --markdown, writes it.
"""

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np

from horovod.common import ops
from horovod.common.basics import HorovodBasics

SETTINGS = {"off": "0", "on": "1024"}


def run(basics, setting, args, totals):
    os.environ["HOROVOD_FLIGHT_RECORDER_SIZE"] = SETTINGS[setting]
    basics.init()
    small = np.ones(1024, np.float32)  # 4 KiB
    latency_us = []
    for i in range(args.warmup + args.iterations):
        start = time.perf_counter()
        ops.wait(ops.allreduce_async([small], [small], ["bench.small"], basics.Sum))
        if i >= args.warmup:
            latency_us.append((time.perf_counter() - start) * 1e6)
    tensors = [np.ones(4096, np.float32) for _ in range(args.tensors)]  # 16 KiB each
    names = [f"bench.grad{i}" for i in range(args.tensors)]
    step_ms, submit_us = [], []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        handles = [ops.allreduce_async([t], [t], [name], basics.Sum) for t, name in zip(tensors, names, strict=True)]
        submitted = time.perf_counter()
        for handle in handles:
            ops.wait(handle)
        if step >= args.warmup:
            step_ms.append((time.perf_counter() - start) * 1e3)
            submit_us.append((submitted - start) * 1e6 / args.tensors)
    basics.shutdown()
    t = totals.setdefault(setting, {"latency_us": [], "step_ms": [], "submit_us": []})
    t["latency_us"] += latency_us
    t["step_ms"] += step_ms
    t["submit_us"] += submit_us


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tensors", type=int, default=200, help="allreduces per step (default 200)")
    parser.add_argument("--iterations", type=int, default=500, help="timed 4 KiB allreduces per run (default 500)")
    parser.add_argument("--steps", type=int, default=50, help="timed steps per run (default 50)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed repetitions first (default 20)")
    parser.add_argument("--repeats", type=int, default=3, help="alternations of off and on (default 3)")
    parser.add_argument("--json", help="write the results here (rank 0)")
    parser.add_argument("--markdown", help="write a Markdown table here (rank 0)")
    args = parser.parse_args()
    basics = HorovodBasics()
    totals = {}
    for _ in range(args.repeats):
        for setting in SETTINGS:
            run(basics, setting, args, totals)
    if int(os.environ.get("HOROVOD_RANK", "0")) != 0:
        return
    size = int(os.environ.get("HOROVOD_SIZE", "1"))
    rows = [{"flight_recorder": setting, "size": SETTINGS[setting],
             "allreduce_4KiB_median_us": statistics.median(totals[setting]["latency_us"]),
             "step_median_ms": statistics.median(totals[setting]["step_ms"]),
             "submission_median_us": statistics.median(totals[setting]["submit_us"])} for setting in SETTINGS]
    lines = [
        f"# Flight recorder cost, np={size}",
        "",
        f"Written by benchmarks/flight_recorder_bench.py on {platform.node()} ({os.cpu_count()} CPUs), "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {args.repeats} alternations of off and on; medians "
        f"of {args.repeats} x {args.iterations} allreduces and {args.repeats} x {args.steps} steps of "
        f"{args.tensors} x 16 KiB.",
        "",
        "| flight recorder | HOROVOD_FLIGHT_RECORDER_SIZE | 4 KiB allreduce (us) | step (ms) "
        "| submission per call (us) |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['flight_recorder']} | {r['size']} | {r['allreduce_4KiB_median_us']:.1f} | "
                     f"{r['step_median_ms']:.2f} | {r['submission_median_us']:.2f} |")
    print("\n".join(lines))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"np": size, "args": vars(args), "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()
