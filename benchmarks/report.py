"""Rows, bandwidths, the machine description and the output formats of the benchmarks.

Formulas (benchmarks/README.md explains them): algbw = bytes / time; for allreduce
busbw = algbw * 2 (n - 1) / n, as each rank sends 2 (n - 1) / n bytes per byte of tensor in a ring.
"""

import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import time

import horovod


def row(library: str, size: int, count: int, seconds: float, mean_seconds: float, wrong: int,
        ranks: int) -> dict:
    """One allreduce measurement: `size` bytes in `count` float32 elements; `seconds` is the median
    time of one call, from which the bandwidths are computed, and `mean_seconds` the mean."""
    algbw = size / seconds / 1e9
    return {
        "library": library,
        "size": size,
        "count": count,
        "type": "float",
        "redop": "sum",
        "time_us": seconds * 1e6,
        "mean_time_us": mean_seconds * 1e6,
        "algbw_GBps": algbw,
        "busbw_GBps": algbw * 2 * (ranks - 1) / ranks,
        "wrong": wrong,
    }


def header(libraries: list[str]) -> str:
    per_lib = f"{'time':>10} {'algbw':>7} {'busbw':>7} {'#wrong':>6}"
    units = f"{'(us)':>10} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}"
    names = "".join(f"  {name:^33}" for name in libraries)
    lines = [
        f"#{'':36}{names}",
        f"# {'size':>10} {'count':>10} {'type':>6} {'redop':>6}" + f"  {per_lib}" * len(libraries),
        f"# {'(B)':>10} {'(elements)':>10} {'':>6} {'':>6}" + f"  {units}" * len(libraries),
    ]
    return "\n".join(text.rstrip() for text in lines)


def line(rows: list[dict]) -> str:
    """One size, the libraries side by side in the order of `rows`."""
    first = rows[0]
    text = f"  {first['size']:>10} {first['count']:>10} {first['type']:>6} {first['redop']:>6}"
    for r in rows:
        text += (f"  {r['time_us']:>10.1f} {r['algbw_GBps']:>7.3f} {r['busbw_GBps']:>7.3f}"
                 f" {r['wrong']:>6}")
    return text


def many_small_line(r: dict) -> str:
    return (f"# {r['tensors']} x {r['bytes_per_tensor']} B async allreduces, {r['library']}: "
            f"median {r['median_step_ms']:.2f} ms per step, #wrong {r['wrong']}")


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        for text in f:
            if text.startswith("model name"):
                return text.split(":", 1)[1].strip()
    return platform.processor()


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine(ranks: int) -> dict:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "os": platform.platform(),
        "python": platform.python_version(),
        # Read from the package metadata, so that benchmarks without torch can describe the machine too.
        "torch": _version("torch"),
        "horovod": horovod.__version__,
        "np": ranks,
        # Other processes competing for the cores slow both libraries: the 1-minute load average
        # when the run starts (on a quiet machine, near 0).
        "load_average": round(os.getloadavg()[0], 2),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def shaping(iface: str) -> str:
    """The qdisc on `iface` of this host (the host's end of its link), as tc shows it."""
    try:
        shown = subprocess.run(["tc", "qdisc", "show", "dev", iface], capture_output=True, text=True,
                               check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        return f"unknown ({e})"
    return " ".join(shown.split()) or "none"


def write_json(path: str, results: dict) -> None:
    with open(path, "w") as f:
        json.dump(results, f, indent=2)
        f.write("\n")


def write_markdown(path: str, results: dict) -> None:
    out = [f"# Allreduce, np={results['machine']['np']}", ""] + markdown(results)
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def markdown(results: dict) -> list[str]:
    """The lines of write_markdown's file after its title: the machine, the sweep and the
    many-small step as tables."""
    m = results["machine"]
    libraries = list(dict.fromkeys(r["library"] for r in results["allreduce"]))
    out = [
        f"{m['cpu']}, {m['cores']} cores; {m['os']}; Python {m['python']}, torch {m['torch']}, "
        f"horovod {m['horovod']}; {m['date']}; load average {m['load_average']}. "
        "Columns: benchmarks/README.md.",
        "",
        "| size (B) | count | " + " | ".join(
            f"{lib} {c}" for lib in libraries
            for c in ("time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong")) + " |",
        "|---:|---:|" + "---:|" * 4 * len(libraries),
    ]
    by_size: dict[int, list[dict]] = {}
    for r in results["allreduce"]:
        by_size.setdefault(r["size"], []).append(r)
    for size, rows in by_size.items():
        cells = [str(size), str(rows[0]["count"])]
        for r in rows:
            cells += [f"{r['time_us']:.1f}", f"{r['algbw_GBps']:.3f}", f"{r['busbw_GBps']:.3f}",
                      str(r["wrong"])]
        out.append("| " + " | ".join(cells) + " |")
    out += ["", "Many small tensors (submitted asynchronously, then all waited on):", "",
            "| library | tensors | bytes each | median per step (ms) | #wrong |",
            "|---|---:|---:|---:|---:|"]
    for r in results["many_small"]:
        out.append(f"| {r['library']} | {r['tensors']} | {r['bytes_per_tensor']} | "
                   f"{r['median_step_ms']:.2f} | {r['wrong']} |")
    return out


def add_arguments(parser) -> None:
    """The options every allreduce benchmark takes: the size sweep and the many-small step."""
    parser.add_argument("--min-bytes", type=int, default=4)
    parser.add_argument("--max-bytes", type=int, default=64 << 20)
    parser.add_argument("--step-factor", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--small-tensors", type=int, default=200)
    parser.add_argument("--small-bytes", type=int, default=16 << 10)
    parser.add_argument("--small-steps", type=int, default=20)
    parser.add_argument("--json", help="write every row and the machine description here")
    parser.add_argument("--markdown", help="write a summary table here")


class Job:
    """What the measurements need from the job that runs them, supplied by each benchmark.

    Args:
        rank, size: this process's rank and the number of ranks.
        barrier: a callable that returns once every rank has called it.
        slowest: seconds -> the largest of every rank's value (a collective is done when its
            last rank is).
        count_wrong: list of buffers -> elements, over all ranks, that differ from the sum of the
            ranks' inputs (rank + 1 each).
    """

    def __init__(self, rank, size, barrier, slowest, count_wrong):
        self.rank, self.size = rank, size
        self.barrier, self.slowest, self.count_wrong = barrier, slowest, count_wrong


def sweep_row(lib, job: Job, count: int, warmup: int, iters: int) -> dict:
    """Median time of `iters` in-place sum allreduces of `count` float32 elements by `lib` (an
    object with name, buffer(count, value) and allreduce(buffer)), and one checked call."""
    # The timed calls reduce zeros in place, which stay zeros: repeated sums of other data would
    # grow by a factor of size each call and overflow.
    buffer = lib.buffer(count, 0.0)
    for _ in range(warmup):
        lib.allreduce(buffer)
    job.barrier()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        lib.allreduce(buffer)
        times.append(time.perf_counter() - start)
    checked = lib.buffer(count, float(job.rank + 1))
    lib.allreduce(checked)
    return row(lib.name, count * 4, count, job.slowest(statistics.median(times)),
               job.slowest(statistics.mean(times)), job.count_wrong([checked]), job.size)


def many_small_row(lib, job: Job, tensors: int, count: int, warmup: int, steps: int) -> dict:
    """Median time of one step of `tensors` allreduces of `count` elements through
    lib.allreduce_many(buffers), and one checked step."""
    batch = [lib.buffer(count, 0.0) for _ in range(tensors)]
    for _ in range(warmup):
        lib.allreduce_many(batch)
    times = []
    for _ in range(steps):
        job.barrier()
        start = time.perf_counter()
        lib.allreduce_many(batch)
        times.append(time.perf_counter() - start)
    checked = [lib.buffer(count, float(job.rank + 1)) for _ in range(tensors)]
    lib.allreduce_many(checked)
    return {
        "library": lib.name,
        "tensors": tensors,
        "bytes_per_tensor": count * 4,
        "median_step_ms": job.slowest(statistics.median(times)) * 1e3,
        "wrong": job.count_wrong(checked),
    }


def in_session(lib, measurement, *args):
    """measurement(lib, *args), inside lib.session() when the library has one: a context manager
    that sets the library up for one measurement (e.g. initialises Horovod in a configuration that
    is only read at initialisation) and takes it down again."""
    session = getattr(lib, "session", None)
    with session() if session else contextlib.nullcontext():
        return measurement(lib, *args)


def measure(libs: list, job: Job, args) -> tuple[list[dict], list[dict]]:
    """The size sweep and the many-small step for every library, side by side (each measurement
    in_session); rank 0 prints a line per size as it goes. Returns (sweep rows, many-small rows)."""
    root = job.rank == 0
    if root:
        print(header([lib.name for lib in libs]), flush=True)
    sweep = []
    size = args.min_bytes
    while size <= args.max_bytes:
        rows = [in_session(lib, sweep_row, job, size // 4, args.warmup, args.iters) for lib in libs]
        sweep.extend(rows)
        if root:
            print(line(rows), flush=True)
        size *= args.step_factor
    many_small = [in_session(lib, many_small_row, job, args.small_tensors, args.small_bytes // 4, 3,
                             args.small_steps) for lib in libs]
    if root:
        for r in many_small:
            print(many_small_line(r), flush=True)
    return sweep, many_small
