"""Training-like allreduce throughput with the default parameters, while autotune searches, and
with the parameters autotune chose.

Run one process per rank under the launcher:

    horovodrun -np 2 -H localhost:2 python benchmarks/autotune_bench.py --markdown out.md

Each step submits one float32 Average allreduce per parameter tensor of a model (ResNet-18 for
ImageNet by default: 62 tensors, 11.7 M parameters, 46.8 MB; or ResNet-20 for CIFAR-10: 59
tensors, 0.27 M parameters), in reverse layer order as backpropagation produces gradients, then
waits for all of them: what DistributedOptimizer does every step, without the compute.

The same processes re-initialise Horovod for each phase:
1. autotune: HOROVOD_AUTOTUNE=1 with the schedule given by the --autotune-* options; steps run
   until the engine reports that tuning has finished (the ranks agree on the step with a Max
   allreduce of their flags). Reported: the steps and seconds the search took, the chosen
   parameters, and the CSV log (--autotune-log).
2. then --repeats alternations of "defaults" (no HOROVOD_* tuning variable set) and "tuned" (the
   chosen fusion threshold, cycle time and cache capacity set explicitly), each --warmup untimed
   steps and --steps timed steps, so that both see the same machine load.
Per configuration: the median step time over all timed steps (the slowest rank's), steps per
second and allreduced bytes per second (the tensor bytes of one step / step time), and the
spread of the per-repeat medians (min .. max). Every step's results are checked.
"""

import argparse
import os
import statistics
import time

import numpy as np

from horovod.common import _core, ops
from horovod.common.basics import HorovodBasics
from report import machine

TUNED_VARIABLES = ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY")


def resnet18_shapes():
    """Parameter shapes of torchvision's ResNet-18 (ImageNet, 1000 classes), in layer order."""
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    in_ch = 64
    for stage, ch in enumerate((64, 128, 256, 512)):
        for block in range(2):
            downsample = block == 0 and stage > 0
            shapes += [(ch, in_ch, 3, 3), (ch,), (ch,), (ch, ch, 3, 3), (ch,), (ch,)]
            if downsample:
                shapes += [(ch, in_ch, 1, 1), (ch,), (ch,)]
            in_ch = ch
    return shapes + [(1000, 512), (1000,)]


def resnet20_shapes():
    """Parameter shapes of ResNet-20 for CIFAR-10 (He et al. 2016, option A shortcuts)."""
    shapes = [(16, 3, 3, 3), (16,), (16,)]
    in_ch = 16
    for ch in (16, 32, 64):
        for _ in range(3):
            shapes += [(ch, in_ch, 3, 3), (ch,), (ch,), (ch, ch, 3, 3), (ch,), (ch,)]
            in_ch = ch
    return shapes + [(10, 64), (10,)]


MODELS = {"resnet18": resnet18_shapes, "resnet20": resnet20_shapes}


class Workload:
    def __init__(self, shapes):
        # Gradients arrive last layer first.
        self.names = [f"allreduce.param{i}.grad" for i in reversed(range(len(shapes)))]
        self.grads = [np.empty(s, np.float32) for s in reversed(shapes)]
        self.bytes = sum(g.nbytes for g in self.grads)

    def step(self, rank, size, value):
        """One step: every gradient filled with rank + value, averaged, and checked."""
        handles = []
        for g, name in zip(self.grads, self.names, strict=True):
            g.fill(rank + value)
            handles.append(ops.allreduce_async([g], [g], [name], 0))
        for h in handles:
            ops.wait(h)
        expected = np.float32((size - 1) / 2 + value)
        return sum(int(np.count_nonzero(g != expected)) for g in self.grads)


def slowest(seconds):
    t = np.array([seconds], np.float64)
    ops.wait(ops.allreduce_async([t], [t], ["bench.slowest"], 4))
    return float(t[0])


def set_env(values):
    for name in TUNED_VARIABLES + ("HOROVOD_AUTOTUNE", "HOROVOD_AUTOTUNE_LOG", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES",
                                   "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
                                   "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE"):
        os.environ.pop(name, None)
    os.environ.update({k: str(v) for k, v in values.items()})


def run_autotune(basics, work, args):
    set_env({"HOROVOD_AUTOTUNE": 1, "HOROVOD_AUTOTUNE_LOG": args.autotune_log,
             "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": args.autotune_warmup_samples,
             "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": args.autotune_steps_per_sample,
             "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": args.autotune_bayes_opt_max_samples,
             "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": args.autotune_gaussian_process_noise})
    basics.init()
    rank, size, backend = basics.rank(), basics.size(), _core.backend_name()
    start, steps, wrong = time.perf_counter(), 0, 0
    while True:
        wrong += work.step(rank, size, steps % 5)
        steps += 1
        flag = np.array([int(_core.tuned_parameters()["tuning"])], np.int32)
        ops.wait(ops.allreduce_async([flag], [flag], ["bench.tuning"], 4))
        if flag[0] == 0 or steps >= args.autotune_max_steps:
            break
    seconds = slowest(time.perf_counter() - start)
    params = _core.tuned_parameters()
    basics.shutdown()
    return {"steps": steps, "seconds": seconds, "params": params, "wrong": wrong, "finished": not params["tuning"],
            "rank": rank, "size": size, "backend": backend}


def run_fixed(basics, work, env, args):
    set_env(env)
    basics.init()
    rank, size = basics.rank(), basics.size()
    times, wrong = [], 0
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        wrong += work.step(rank, size, step % 5)
        elapsed = slowest(time.perf_counter() - start)
        if step >= args.warmup:
            times.append(elapsed)
    basics.shutdown()
    return times, wrong


def summarise(name, env, repeats, work):
    all_times = [t for times, _ in repeats for t in times]
    per_repeat = [statistics.median(times) for times, _ in repeats]
    median = statistics.median(all_times)
    return {"config": name, "env": env, "median_step_ms": median * 1e3,
            "steps_per_s": 1 / median, "bytes_per_s": work.bytes / median,
            "repeat_median_step_ms": [t * 1e3 for t in per_repeat],
            "wrong": sum(w for _, w in repeats)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="resnet18")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per run (default 5)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per run (default 30)")
    parser.add_argument("--repeats", type=int, default=3, help="alternations of defaults and tuned (default 3)")
    parser.add_argument("--autotune-log", default="autotune-bench.csv", help="CSV log of the search (rank 0)")
    parser.add_argument("--autotune-warmup-samples", type=int, default=1)
    parser.add_argument("--autotune-steps-per-sample", type=int, default=4)
    parser.add_argument("--autotune-bayes-opt-max-samples", type=int, default=12)
    parser.add_argument("--autotune-gaussian-process-noise", type=float, default=0.8)
    parser.add_argument("--autotune-max-steps", type=int, default=5000, help="give up the search after this many")
    parser.add_argument("--markdown", help="write the results here (rank 0)")
    args = parser.parse_args()

    basics = HorovodBasics()
    host = machine(int(os.environ.get("HOROVOD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))))
    work = Workload(MODELS[args.model]())
    tune = run_autotune(basics, work, args)
    p = tune["params"]
    tuned_env = {"HOROVOD_FUSION_THRESHOLD": p["fusion_threshold_bytes"], "HOROVOD_CYCLE_TIME": p["cycle_time_ms"],
                 "HOROVOD_CACHE_CAPACITY": 1024 if p["cache_enabled"] else 0}
    runs = {"defaults": [], "tuned": []}
    for _ in range(args.repeats):
        runs["defaults"].append(run_fixed(basics, work, {}, args))
        runs["tuned"].append(run_fixed(basics, work, tuned_env, args))
    results = [summarise("defaults", {}, runs["defaults"], work), summarise("tuned", tuned_env, runs["tuned"], work)]
    if tune["rank"] != 0:
        return
    host["np"] = tune["size"]
    lines = report(args, host, work, tune, results)
    print("\n".join(lines))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")


def report(args, m, work, tune, results):
    p = tune["params"]
    with open(args.autotune_log, encoding="utf-8") as f:
        log = f.read().strip()
    lines = [
        f"# Autotune, {args.model}, np={m['np']}",
        "",
        f"{m['cpu']}, {m['cores']} cores; {m['os']}; Python {m['python']}, horovod {m['horovod']}; {m['date']}; "
        f"load average {m['load_average']} at the start, {os.getloadavg()[0]:.2f} at the end (other work shares "
        "the cores).",
        "",
        f"{len(work.grads)} float32 allreduces per step, {work.bytes} bytes; backend {tune['backend']}.",
        "",
        f"Search: warm-up {args.autotune_warmup_samples}, steps per sample {args.autotune_steps_per_sample}, "
        f"Bayesian samples {args.autotune_bayes_opt_max_samples}, noise {args.autotune_gaussian_process_noise}: "
        f"{'finished' if tune['finished'] else 'NOT finished'} after {tune['steps']} steps, {tune['seconds']:.1f} s, "
        f"#wrong {tune['wrong']}. Chosen: fusion threshold {p['fusion_threshold_bytes']} B "
        f"({p['fusion_threshold_bytes'] / 2**20:.2f} MiB), cycle time {p['cycle_time_ms']:.3f} ms, "
        f"response cache {'on' if p['cache_enabled'] else 'off'}.",
        "",
        f"Then {args.repeats} alternations of defaults and tuned, each {args.warmup} warm-up + {args.steps} timed "
        "steps; step time of the slowest rank.",
        "",
        "| config | median step (ms) | steps/s | allreduced bytes/s (MB/s) | per-repeat medians (ms) | #wrong |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for r in results:
        spread = ", ".join(f"{t:.1f}" for t in r["repeat_median_step_ms"])
        lines.append(f"| {r['config']} | {r['median_step_ms']:.2f} | {r['steps_per_s']:.2f} | "
                     f"{r['bytes_per_s'] / 1e6:.1f} | {spread} | {r['wrong']} |")
    speedup = results[0]["median_step_ms"] / results[1]["median_step_ms"]
    lines += ["", f"Tuned vs defaults: {speedup:.2f}x steps/s (median).", "",
              "Autotune log (HOROVOD_AUTOTUNE_LOG; score in bytes/us, last row = chosen):", "", "```", log, "```"]
    return lines


if __name__ == "__main__":
    main()
