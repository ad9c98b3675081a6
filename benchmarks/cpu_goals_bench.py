"""The CPU performance goals: Horovod, torch.distributed (Gloo) and raw MPI (mpi4py) side by side.

Run one process per rank under an MPI launcher, on one host, so that all three libraries can run
in the same processes:

    horovodrun --mpi -np 2 -H localhost:2 python benchmarks/cpu_goals_bench.py \\
        --json benchmarks/results/cpu-goals-np2.json --markdown benchmarks/results/cpu-goals-np2.md \\
        --plot benchmarks/results/cpu-goals-np2.png

Horovod runs with its defaults (under an MPI launcher: the MPI backend, and the shared-memory
transport between ranks of one host; set HOROVOD_SHARED_MEMORY=0 to measure without it).
torch.distributed joins a Gloo group on 127.0.0.1. The measurements are those of report.measure
(a float32 sum allreduce sweep, 4 B to 64 MiB by factors of 4, and a training-like step of 200
asynchronous 16 KiB allreduces), with the libraries taking turns at each size; columns and
formulas: benchmarks/README.md. At the end, rank 0 compares Horovod with the goals:

| workload | goal |
|---|---|
| allreduce 4 KiB, median latency | <= 0.1 ms |
| allreduce 1 MiB, algbw | >= 4 GB/s |
| allreduce 64 MiB, algbw | >= 0.9 x raw MPI |
| 200 x 16 KiB async allreduces, per step | <= 2 ms |
"""

import argparse
import sys

import mpi4py
import torch.distributed as dist
from mpi4py import MPI

import horovod.torch as hvd
import report
from allreduce_bench import Horovod, TorchGloo, init_torch_distributed
from mpi_allreduce_bench import Mpi4py, job

KIB, MIB = 1 << 10, 1 << 20


def horovod_label() -> str:
    from horovod.common import _core
    backend = "MPI" if hvd.mpi_enabled() else "Gloo"
    return f"horovod ({backend}{' + shared memory' if _core.engine_stats()['shared_memory'] else ''})"


def goals(sweep: list[dict], many_small: list[dict], horovod: str) -> list[dict]:
    def at(size: int, library: str) -> dict:
        return next(r for r in sweep if r["size"] == size and r["library"] == library)

    small = next(r for r in many_small if r["library"] == horovod)
    mpi_small = next(r for r in many_small if r["library"] == Mpi4py.name)
    large, mpi_large = at(64 * MIB, horovod), at(64 * MIB, Mpi4py.name)
    rows = [
        ("allreduce 4 KiB, median latency (ms)", at(4 * KIB, horovod)["time_us"] / 1e3, "<=", 0.1),
        ("allreduce 1 MiB, algbw (GB/s)", at(MIB, horovod)["algbw_GBps"], ">=", 4.0),
        ("allreduce 64 MiB, algbw / raw MPI's", large["algbw_GBps"] / mpi_large["algbw_GBps"], ">=", 0.9),
        ("200 x 16 KiB async allreduces, per step (ms)", small["median_step_ms"], "<=", 2.0),
        ("200 x 16 KiB step / raw MPI's (issue 5)", small["median_step_ms"] / mpi_small["median_step_ms"], "<=",
         2.0),
    ]
    return [{"workload": w, "value": v, "goal": f"{cmp} {g}", "met": v <= g if cmp == "<=" else v >= g}
            for w, v, cmp, g in rows]


def plot(path: str, results: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = results["machine"]
    fig, (sweep_ax, small_ax) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    libraries = list(dict.fromkeys(r["library"] for r in results["allreduce"]))
    for library in libraries:
        rows = [r for r in results["allreduce"] if r["library"] == library]
        sweep_ax.plot([r["size"] for r in rows], [r["algbw_GBps"] for r in rows], marker="o", label=library)
    sweep_ax.set_xscale("log", base=2)
    sweep_ax.set_yscale("log")
    sweep_ax.set_xlabel("bytes per rank")
    sweep_ax.set_ylabel("algbw (GB/s)")
    sweep_ax.set_title(f"float32 sum allreduce, np={m['np']}")
    sweep_ax.grid(True, which="both", alpha=0.3)
    sweep_ax.legend()
    names = [r["library"] for r in results["many_small"]]
    small_ax.bar(range(len(names)), [r["median_step_ms"] for r in results["many_small"]],
                 color=[f"C{libraries.index(n)}" for n in names])
    small_ax.set_xticks(range(len(names)), [n.replace(" (", "\n(") for n in names], fontsize=8)
    small_ax.set_yscale("log")
    small_ax.set_ylabel("median ms per step")
    first = results["many_small"][0]
    small_ax.set_title(f"{first['tensors']} x {first['bytes_per_tensor'] // KIB} KiB async allreduces")
    fig.suptitle(f"{m['cpu']}, {m['cores']} cores; {m['date']}; load average {m['load_average']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    report.add_arguments(parser)
    parser.add_argument("--plot", help="write a PNG of the sweep and the many-small step here")
    args = parser.parse_args()

    hvd.init()
    if not hvd.mpi_enabled() and MPI.COMM_WORLD.Get_size() != hvd.size():
        sys.exit("cpu_goals_bench: run under mpirun or horovodrun --mpi, so that mpi4py sees every rank")
    machine = report.machine(hvd.size())  # before the measurements load the machine
    machine["mpi"] = MPI.Get_library_version().replace("\0", "").splitlines()[0].strip()
    machine["mpi4py"] = mpi4py.__version__
    init_torch_distributed()
    horovod = Horovod()
    horovod.name = horovod_label()
    libs = [horovod, TorchGloo(), Mpi4py()]
    sweep, many_small = report.measure(libs, job(), args)
    if hvd.rank() == 0:
        results = {"machine": machine, "allreduce": sweep, "many_small": many_small}
        if args.min_bytes <= 4 * KIB and args.max_bytes >= 64 * MIB:
            results["goals"] = goals(sweep, many_small, horovod.name)
            for g in results["goals"]:
                print(f"# {g['workload']}: {g['value']:.3f} (goal {g['goal']}: {'met' if g['met'] else 'NOT met'})",
                      flush=True)
        if args.json:
            report.write_json(args.json, results)
        if args.markdown:
            report.write_markdown(args.markdown, results)
            with open(args.markdown, "a") as f:
                f.write("\ntorch.distributed runs the many small allreduces with async_op=True, mpi4py blocking, "
                        f"one by one. MPI: {machine['mpi']}; mpi4py {machine['mpi4py']}.\n")
                if "goals" in results:
                    f.write("\n| goal | horovod | target | met |\n|---|---:|---|---|\n")
                    f.write("".join(f"| {g['workload']} | {g['value']:.3f} | {g['goal']} | "
                                    f"{'yes' if g['met'] else 'no'} |\n" for g in results["goals"]))
        if args.plot:
            plot(args.plot, results)
    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
