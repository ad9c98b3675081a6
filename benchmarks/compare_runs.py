"""Tables of paired runs of cpu_goals_bench.py: one row per run (label, JSON file), Horovod's median
time per size and its 200 x 16 KiB step, each with its ratio to raw MPI's (mpi4py) in the same run.

    python benchmarks/compare_runs.py old=a1.json new=b1.json old=a2.json new=b2.json > table.md

Sizes shown: 4 KiB, 64 KiB, 1 MiB, 16 MiB, 64 MiB, where the runs have them."""

import json
import statistics
import sys

KIB, MIB = 1 << 10, 1 << 20
SIZES = [4 * KIB, 64 * KIB, MIB, 16 * MIB, 64 * MIB]


def label_of(size: int) -> str:
    return f"{size // MIB} MiB" if size >= MIB else f"{size // KIB} KiB"


def load(path: str) -> dict:
    with open(path) as f:
        results = json.load(f)
    horovod = next(r["library"] for r in results["allreduce"] if r["library"].startswith("horovod"))
    times = {}
    for library, key in ((horovod, "horovod"), ("mpi4py", "mpi")):
        for r in results["allreduce"]:
            if r["library"] == library and r["size"] in SIZES:
                times[(key, r["size"])] = r["time_us"]
        step = next((r for r in results["many_small"] if r["library"] == library), None)
        if step:
            times[(key, "step")] = step["median_step_ms"]
    times["wrong"] = sum(r["wrong"] for r in results["allreduce"]) + sum(r["wrong"] for r in results["many_small"])
    times["machine"] = results["machine"]
    return times


def main() -> None:
    runs = [(arg.split("=", 1)[0], load(arg.split("=", 1)[1])) for arg in sys.argv[1:]]
    columns = [s for s in SIZES if all(("horovod", s) in t for _, t in runs)] + ["step"]
    names = [label_of(c) + " (us)" if c != "step" else "200 x 16 KiB step (ms)" for c in columns]
    print("| run | load avg | " + " | ".join(names) + " | #wrong |")
    print("|---|---:|" + "---:|" * len(columns) + "---:|")
    for label, t in runs:
        cells = [f"{t[('horovod', c)]:.1f} ({t[('horovod', c)] / t[('mpi', c)]:.2f}x)" if c != "step" else
                 f"{t[('horovod', c)]:.2f} ({t[('horovod', c)] / t[('mpi', c)]:.2f}x)" for c in columns]
        print(f"| {label} | {t['machine']['load_average']} | " + " | ".join(cells) + f" | {t['wrong']} |")
    print()
    print("Medians over the runs of each label (Horovod; in brackets the median of the per-run ratios to raw MPI):")
    print()
    print("| label | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(columns))
    for label in dict.fromkeys(label for label, _ in runs):
        mine = [t for lbl, t in runs if lbl == label]
        cells = []
        for c in columns:
            value = statistics.median(t[("horovod", c)] for t in mine)
            ratio = statistics.median(t[("horovod", c)] / t[("mpi", c)] for t in mine)
            cells.append(f"{value:.{2 if c == 'step' else 1}f} ({ratio:.2f}x)")
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
