"""Rows, bandwidths, the machine description and the output formats of the benchmarks.

Formulas (benchmarks/README.md explains them): algbw = bytes / time; for allreduce
busbw = algbw * 2 (n - 1) / n, as each rank sends 2 (n - 1) / n bytes per byte of tensor in a ring.
"""

import datetime
import json
import os
import platform

import torch

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


def machine(ranks: int) -> dict:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "horovod": horovod.__version__,
        "np": ranks,
        # Other processes competing for the cores slow both libraries: the 1-minute load average
        # when the run starts (on a quiet machine, near 0).
        "load_average": round(os.getloadavg()[0], 2),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def write_json(path: str, results: dict) -> None:
    with open(path, "w") as f:
        json.dump(results, f, indent=2)
        f.write("\n")


def write_markdown(path: str, results: dict) -> None:
    m = results["machine"]
    libraries = list(dict.fromkeys(r["library"] for r in results["allreduce"]))
    out = [
        f"# Allreduce, np={m['np']}",
        "",
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
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
