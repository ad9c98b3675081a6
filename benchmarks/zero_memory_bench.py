"""Peak resident memory of data-parallel AdamW training: hvd.ZeroRedundancyOptimizer (optimizer state
sharded, ZeRO stage 1) against hvd.DistributedOptimizer (state on every rank), with PyTorch's own
pair beside them: DistributedDataParallel with AdamW, and with torch.distributed.optim.
ZeroRedundancyOptimizer (Gloo).

    python benchmarks/zero_memory_bench.py --np 2 4 --json benchmarks/results/zero-memory.json \\
        --markdown benchmarks/results/zero-memory.md

Each (np, optimizer, allocator setting) is its own ``horovodrun --gloo -np N`` job, because a process's
peak resident set (``getrusage().ru_maxrss``) only grows. Resident memory depends on glibc's malloc
as much as on what is allocated: by default its mmap threshold rises to the size of the largest
block freed (up to 32 MiB), after which blocks of a training step's sizes come from heaps that keep
freed memory, so temporary buffers raise the peak for good. Each job therefore runs twice, with
glibc's default and with ``MALLOC_MMAP_THRESHOLD_=1048576`` (blocks of 1 MiB and more are mapped and
unmapped each time; ``--mmap-thresholds``). Every rank builds the same model (``--layers`` float32
``Linear(--width, --width)`` layers), notes its resident memory, trains ``--steps`` AdamW steps on
its own random batch (``--batch`` rows) and reports:

| column | meaning |
|---|---|
| model (MiB) | parameters, float32 |
| state/rank (MiB) | bytes of the optimizer-state tensors this rank holds (the largest over ranks) |
| RSS before (MiB) | resident memory after building the model, before the optimizer (largest over ranks) |
| peak RSS (MiB) | the process's peak resident memory at the end (largest over ranks) |
| peak - before (MiB) | what training added: gradients, optimizer state, communication buffers |
| step (ms) | median wall time of a step on rank 0 (2 cores shared by all ranks: indicative only) |

Rank 0 prints one ``RESULT {json}`` line per job; this program collects them into a table.
"""

import argparse
import datetime
import json
import os
import platform
import re
import resource
import socket
import statistics
import subprocess
import sys
import time

KINDS = ["hvd-distributed", "hvd-zero", "torch-ddp", "torch-ddp-zero"]
LABELS = {
    "hvd-distributed": "hvd.DistributedOptimizer(AdamW)",
    "hvd-zero": "hvd.ZeroRedundancyOptimizer(AdamW)",
    "torch-ddp": "torch DDP + AdamW (gloo)",
    "torch-ddp-zero": "torch DDP + torch ZeroRedundancyOptimizer(AdamW) (gloo)",
}
MIB = 2**20


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker(args):
    import torch
    import torch.distributed as dist

    import horovod.torch as hvd

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(args.layers)])
    before = rss_bytes()
    if args.kind.startswith("torch"):
        port = torch.zeros(1, dtype=torch.int64)
        if hvd.rank() == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port[0] = s.getsockname()[1]
        hvd.broadcast_(port, root_rank=0, name="bench.port")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{int(port)}", rank=hvd.rank(),
                                world_size=hvd.size())
        net = torch.nn.parallel.DistributedDataParallel(model)
        if args.kind == "torch-ddp-zero":
            from torch.distributed.optim import ZeroRedundancyOptimizer
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-4)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    else:
        net = model
        if args.kind == "hvd-zero":
            opt = hvd.ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-4)
        else:
            opt = hvd.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-4),
                                           named_parameters=model.named_parameters())
    generator = torch.Generator().manual_seed(hvd.rank())
    x = torch.randn(args.batch, args.width, generator=generator)
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        opt.zero_grad()
        net(x).square().mean().backward()
        opt.step()
        times.append(time.perf_counter() - start)
    state = opt.optim.state if args.kind == "torch-ddp-zero" else opt.state
    state_bytes = sum(v.numel() * v.element_size() for s in state.values() for v in s.values() if torch.is_tensor(v))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    mine = {"rank": hvd.rank(), "before": before, "peak": peak, "state": state_bytes,
            "step_ms": 1000 * statistics.median(times[1:] or times), "checksum": checksum}
    everyone = hvd.allgather_object(mine, name="bench.results")
    if args.kind.startswith("torch"):
        dist.destroy_process_group()
    if hvd.rank() == 0:
        model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        print("RESULT " + json.dumps({"kind": args.kind, "np": hvd.size(), "model": model_bytes, "ranks": everyone}),
              flush=True)


def run_job(args, kind, np_, threshold):
    # Gloo, the transport torch.distributed uses here too.
    command = [sys.executable, "-m", "horovod.runner.launch", "--gloo", "-np", str(np_), "-H", f"localhost:{np_}",
               sys.executable, os.path.abspath(__file__), "--worker", "--kind", kind,
               "--layers", str(args.layers), "--width", str(args.width), "--batch", str(args.batch),
               "--steps", str(args.steps)]
    env = dict(os.environ)
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    if threshold != "default":
        env["MALLOC_MMAP_THRESHOLD_"] = threshold
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, env=env)
    for line in done.stdout.splitlines():
        match = re.match(r"^\[(?:\d+,)?0\]<stdout>:RESULT (.*)$", line)
        if match:
            return dict(json.loads(match.group(1)), malloc=threshold)
    raise RuntimeError(f"{kind} at np {np_} failed (exit status {done.returncode}):\n{done.stdout[-3000:]}"
                       f"\n{done.stderr[-3000:]}")


def machine():
    import importlib.metadata
    with open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    return {"cpu": cpu, "cores": os.cpu_count(), "os": platform.platform(), "python": platform.python_version(),
            "torch": importlib.metadata.version("torch"), "horovod-torch": importlib.metadata.version("horovod-torch"),
            "load_average": round(os.getloadavg()[0], 2),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")}


def row(result):
    ranks = result["ranks"]
    before = max(r["before"] for r in ranks)
    peak = max(r["peak"] for r in ranks)
    return {"optimizer": LABELS[result["kind"]], "np": result["np"], "malloc": result["malloc"],
            "model_mib": result["model"] / MIB,
            "state_mib": max(r["state"] for r in ranks) / MIB, "before_mib": before / MIB, "peak_mib": peak / MIB,
            "added_mib": max(r["peak"] - r["before"] for r in ranks) / MIB,
            "step_ms": next(r["step_ms"] for r in ranks if r["rank"] == 0)}


def markdown(results):
    m = results["machine"]
    out = [f"{m['cpu']}, {m['cores']} cores; {m['os']}; Python {m['python']}, torch {m['torch']}, "
           f"horovod-torch {m['horovod-torch']}; {m['date']}; load average {m['load_average']}. "
           f"Model: {results['layers']} x Linear({results['width']}, {results['width']}), float32; "
           f"batch {results['batch']} rows per rank; {results['steps']} steps. Columns: "
           "benchmarks/zero_memory_bench.py.", "",
           "| optimizer | np | malloc mmap threshold | model (MiB) | state/rank (MiB) | RSS before (MiB) | "
           "peak RSS (MiB) | peak - before (MiB) | step (ms) |",
           "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in results["rows"]:
        malloc = "glibc default" if r["malloc"] == "default" else f"{r['malloc']} B"
        out.append(f"| {r['optimizer']} | {r['np']} | {malloc} | {r['model_mib']:.0f} | {r['state_mib']:.0f} | "
                   f"{r['before_mib']:.0f} | {r['peak_mib']:.0f} | {r['added_mib']:.0f} | {r['step_ms']:.0f} |")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--np", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=KINDS)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--mmap-thresholds", nargs="+", default=["default", "1048576"],
                        help="MALLOC_MMAP_THRESHOLD_ values (bytes) to run each job with; 'default': unset")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per job")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kind", choices=KINDS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    results = {"machine": machine(), "layers": args.layers, "width": args.width, "batch": args.batch,
               "steps": args.steps, "jobs": []}
    for threshold in args.mmap_thresholds:
        for np_ in args.np:
            for kind in args.kinds:
                result = run_job(args, kind, np_, threshold)
                results["jobs"].append(result)
                print(json.dumps(row(result)), flush=True)
    results["rows"] = [row(r) for r in results["jobs"]]
    table = markdown(results)
    print("\n".join(table))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
            f.write("\n")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(["# Peak resident memory: ZeRO stage 1 against unsharded AdamW", ""] + table) + "\n")


if __name__ == "__main__":
    main()
