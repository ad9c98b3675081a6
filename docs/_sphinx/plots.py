"""The performance page's plots, drawn from the recorded benchmark results (benchmarks/results/*.json).

Each allreduce result file (the nccl-tests columns of benchmarks/README.md: one row per library and
message size) gives one figure of two panels: the time of one allreduce and the bus bandwidth,
against the message size, one line per library. Files are written only when their content
changes, so an unchanged result does not make Sphinx copy the image again.
"""

from __future__ import annotations

import io
import json
import pathlib

# Result file -> the figure's title. docs/performance.md shows them as
# _sphinx/plots/<result file's stem>.png (cpu_goals_bench.py draws its own: cpu-goals-np2.png).
ALLREDUCE_RESULTS = {
    "mpi-allreduce-np2.json": "Allreduce on 2 processes of one host over MPI",
    "allreduce-np2.json": "Allreduce on 2 processes of one host over Gloo",
}


def _figure(rows: list[dict], title: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    libraries: dict[str, list[dict]] = {}
    for row in rows:
        libraries.setdefault(row["library"], []).append(row)
    figure, (latency, bandwidth) = pyplot.subplots(1, 2, figsize=(10, 4), layout="constrained")
    for library, points in libraries.items():
        points.sort(key=lambda row: row["size"])
        sizes = [row["size"] for row in points]
        latency.plot(sizes, [row["time_us"] for row in points], marker="o", markersize=3, label=library)
        bandwidth.plot(sizes, [row["busbw_GBps"] for row in points], marker="o", markersize=3, label=library)
    for axes, label in ((latency, "time of one allreduce (µs)"), (bandwidth, "bus bandwidth (GB/s)")):
        axes.set_xscale("log", base=2)
        axes.set_yscale("log")
        axes.set_xlabel("message size (bytes)")
        axes.set_ylabel(label)
        axes.grid(True, which="major", alpha=0.3)
    bandwidth.legend(fontsize="small")
    figure.suptitle(title)
    buffer = io.BytesIO()
    # No creation date in the file: the same results give the same bytes.
    figure.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    pyplot.close(figure)
    return buffer.getvalue()


def draw_all(results: pathlib.Path, out: pathlib.Path) -> list[pathlib.Path]:
    """Draw every figure of ALLREDUCE_RESULTS into ``out``; returns the PNG files.

    Raises:
        FileNotFoundError: a result file is missing (renamed without updating this list).
        KeyError: a result file has no ``allreduce`` rows in the expected columns.
    """
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, title in ALLREDUCE_RESULTS.items():
        rows = json.loads((results / name).read_text())["allreduce"]
        png = _figure(rows, title)
        path = out / (pathlib.Path(name).stem + ".png")
        if not path.is_file() or path.read_bytes() != png:
            path.write_bytes(png)
        written.append(path)
    return written
