"""Flat vs hierarchical allreduce on a job laid out as several hosts.

Run one process per rank under the launcher, with at least two host names:

    horovodrun -np 4 -H localhost:2,127.0.0.1:2 python benchmarks/hierarchical_bench.py --json out.json

(both names are this machine: horovodrun gives each its own HOROVOD_HOSTNAME, so the engine sees
two hosts of two ranks; see docs/hierarchical.md). The same processes initialise Horovod once per
configuration, alternating --repeats times so that every configuration sees the same machine load:

- ``flat``: HOROVOD_HIERARCHICAL_ALLREDUCE=0, one Gloo ring over all ranks;
- ``hierarchical``: HOROVOD_HIERARCHICAL_ALLREDUCE=1 (reduce within each host through shared
  memory, allreduce of each local rank's shard across hosts, allgather within each host);
- ``one host``: the same processes told they share one host (HOROVOD_HOSTNAME and
  HOROVOD_LOCAL_* rewritten), i.e. the one-host shared-memory transport, for reference.

For each float32 size (--sizes, in bytes), after --warmup allreduces, each allreduce (Sum, in
place) is timed from submission to completion on every rank; a rank reports the median, and rank 0
prints the maximum of the ranks' medians (the job is as slow as its slowest rank) and the
algorithm bandwidth (bytes / time). engine_stats checks that the hierarchical path really ran in
the ``hierarchical`` configuration and not in the others. Timings only describe this run's machine.
"""

import argparse
import json
import os
import platform
import socket
import statistics
import time

import numpy as np

from horovod.common import _core, ops
from horovod.common.basics import HorovodBasics

KIB, MIB = 1024, 1024 * 1024


def parse_size(text):
    text = text.strip().upper()
    for suffix, factor in (("KIB", KIB), ("MIB", MIB), ("K", KIB), ("M", MIB)):
        if text.endswith(suffix):
            return int(float(text[:-len(suffix)]) * factor)
    return int(text)


def iterations(nbytes, args):
    # Fewer repetitions of the large sizes: 64 MiB on an oversubscribed machine takes a while.
    if nbytes >= 16 * MIB:
        return args.iters_large
    if nbytes >= 256 * KIB:
        return args.iters_medium
    return args.iters_small


def run(basics, config, args, results):
    saved = {k: os.environ.get(k) for k in ("HOROVOD_HIERARCHICAL_ALLREDUCE", "HOROVOD_HOSTNAME",
                                            "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK",
                                            "HOROVOD_CROSS_SIZE")}
    os.environ["HOROVOD_HIERARCHICAL_ALLREDUCE"] = "1" if config == "hierarchical" else "0"
    if config == "one host":
        rank, size = int(os.environ["HOROVOD_RANK"]), int(os.environ["HOROVOD_SIZE"])
        os.environ.update({"HOROVOD_HOSTNAME": "localhost", "HOROVOD_LOCAL_RANK": str(rank),
                           "HOROVOD_LOCAL_SIZE": str(size), "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "1"})
    try:
        basics.init()
        stats = _core.engine_stats()
        for nbytes in args.sizes:
            x = np.ones(nbytes // 4, dtype=np.float32)
            times = []
            for i in range(args.warmup + iterations(nbytes, args)):
                x[:] = 1.0
                start = time.perf_counter()
                ops.wait(ops.allreduce_async([x], [x], [f"bench.{nbytes}"], basics.Sum))
                elapsed = time.perf_counter() - start
                if i >= args.warmup:
                    times.append(elapsed)
            assert x[0] == basics.size() and x[-1] == basics.size()
            results.setdefault(config, {}).setdefault(nbytes, []).extend(times)
        after = _core.engine_stats()
        ran_hierarchical = after["hierarchical_allreduces"] > 0
        assert ran_hierarchical == (config == "hierarchical"), (config, after)
        assert after["shared_memory"] == (config == "one host"), (config, after)
        return {"hosts": stats["hosts"], "hierarchical_shared_memory": stats["hierarchical_shared_memory"]}
    finally:
        basics.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="4KiB,1MiB,64MiB", help="comma-separated message sizes in bytes")
    parser.add_argument("--configs", default="flat,hierarchical,one host")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters-small", type=int, default=200)
    parser.add_argument("--iters-medium", type=int, default=30)
    parser.add_argument("--iters-large", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", help="write the figures (rank 0) to this file")
    args = parser.parse_args()
    args.sizes = [parse_size(s) for s in args.sizes.split(",")]
    configs = [c.strip() for c in args.configs.split(",")]
    basics = HorovodBasics()
    results, layout = {}, {}
    for _ in range(args.repeats):
        for config in configs:
            layout[config] = run(basics, config, args, results)
    # Every rank's medians, gathered through one more (flat) job: the slowest rank decides.
    os.environ["HOROVOD_HIERARCHICAL_ALLREDUCE"] = "0"
    basics.init()
    rank, size = basics.rank(), basics.size()
    medians = np.array([[statistics.median(results[c][n]) for n in args.sizes] for c in configs], dtype=np.float64)
    ops.wait(ops.allreduce_async([medians], [medians], ["bench.medians"], basics.Max))
    basics.shutdown()
    if rank != 0:
        return
    rows = []
    for ci, config in enumerate(configs):
        for ni, nbytes in enumerate(args.sizes):
            seconds = float(medians[ci, ni])
            rows.append({"config": config, "bytes": nbytes, "median_us": seconds * 1e6,
                         "algbw_gbps": nbytes / seconds / 1e9, "samples_per_rank": len(results[config][nbytes])})
    print(f"np={size}, hosts={layout[configs[0]]['hosts']}, {os.cpu_count()} CPUs on {socket.gethostname()}")
    print(f"{'config':14} {'size':>10} {'median (us)':>12} {'algbw (GB/s)':>13}")
    for row in rows:
        print(f"{row['config']:14} {row['bytes']:>10} {row['median_us']:>12.1f} {row['algbw_gbps']:>13.3f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"np": size, "layout": layout, "cpus": os.cpu_count(), "machine": platform.platform(),
                       "processor": platform.processor(), "rows": rows, "args": vars(args)}, f, indent=1)


if __name__ == "__main__":
    main()
