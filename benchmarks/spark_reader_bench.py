"""Does the Estimators' Parquet reader keep up with training?

Writes Parquet shaped as ``horovod.spark.common.util.prepare_data`` writes it (a vector column as
an array of doubles, an array column, a scalar and an integer label; ``--files`` files of one row
group each) into a temporary folder under ``--dir``, then for one rank of ``--ranks``:

* reader alone: rows per second that ``BatchReader.epoch`` delivers (shuffled, one background
  thread), the training loop doing nothing with the batches;
* model alone: the step time of the estimator's model (forward, backward, SGD step with torch on
  one thread) on a batch already in memory, and the rows per second it could take;
* both: the training loop fed by the reader, and the seconds it waited for a batch.

The reader keeps up when its rows per second exceed the model's and the wait is a small part of
the epoch. Prints a Markdown table; ``--json`` writes the figures.

    python benchmarks/spark_reader_bench.py --rows 200000 --batch-size 128
"""

import argparse
import json
import os
import platform
import shutil
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.fs
import pyarrow.parquet as pq

from horovod.spark.common.reader import BatchReader, steps_per_epoch


def write_data(folder, rows, files, width):
    rng = np.random.default_rng(0)
    groups = []
    per_file = -(-rows // files)
    for i in range(files):
        n = min(per_file, rows - i * per_file)
        if n <= 0:
            break
        vec = rng.normal(size=(n, width))
        table = pa.table({
            "vec": pa.array(list(vec)), "arr": pa.array(list(rng.normal(size=(n, 3)))),
            "x": rng.normal(size=n), "label": (vec.sum(axis=1) > 0).astype(np.int64)})
        path = os.path.join(folder, "part-%05d.parquet" % i)
        pq.write_table(table, path, row_group_size=n)
        groups.append((path, 0, n))
    return groups


def model_and_step(width, hidden):
    # PyTorch makes its compile cache folder at the first optimizer step: under build/, not /tmp.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                                                  "build", "torchinductor"))
    import torch

    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(width + 4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                                torch.nn.ReLU(), torch.nn.Linear(hidden, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(batch):
        inputs = torch.cat([torch.from_numpy(batch["vec"].astype(np.float32)),
                            torch.from_numpy(batch["arr"].astype(np.float32)),
                            torch.from_numpy(batch["x"].astype(np.float32)).unsqueeze(1)], dim=1)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(inputs), torch.from_numpy(batch["label"]))
        loss.backward()
        optimizer.step()

    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200000)
    parser.add_argument("--files", type=int, default=40)
    parser.add_argument("--width", type=int, default=64, help="elements of the vector column")
    parser.add_argument("--hidden", type=int, default=256, help="hidden units of the model's two layers")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--ranks", type=int, default=2, help="the rank measured reads 1/ranks of the data")
    parser.add_argument("--shuffle-buffer", type=int, default=None,
                        help="rows shuffled together (the estimators' shuffle_buffer_size); default the whole shard")
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build"))
    parser.add_argument("--json")
    args = parser.parse_args()

    os.makedirs(args.dir, exist_ok=True)
    folder = tempfile.mkdtemp(prefix="spark-reader-bench-", dir=args.dir)
    try:
        groups = write_data(folder, args.rows, args.files, args.width)
        fs = pyarrow.fs.LocalFileSystem()
        kinds = {"vec": ("array", args.width), "arr": ("array", 3), "x": ("scalar", None), "label": ("scalar", None)}
        steps = steps_per_epoch(groups, args.ranks, args.batch_size)

        def reader():
            return BatchReader(groups, fs, list(kinds), kinds, args.batch_size, 0, args.ranks, steps=steps, seed=1,
                               shuffle_buffer_size=args.shuffle_buffer)

        r = reader()
        start = time.perf_counter()
        rows = sum(len(b["x"]) for b in r.epoch(0))
        reader_s = time.perf_counter() - start

        step = model_and_step(args.width, args.hidden)
        batch = next(iter(reader().epoch(0)))
        for _ in range(5):
            step(batch)
        n = min(steps, 200)
        start = time.perf_counter()
        for _ in range(n):
            step(batch)
        step_s = (time.perf_counter() - start) / n

        r = reader()
        start = time.perf_counter()
        for b in r.epoch(1):
            step(b)
        both_s = time.perf_counter() - start
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    result = {
        "machine": "%s, %d CPUs, Python %s" % (platform.platform(), os.cpu_count(), platform.python_version()),
        "rows_per_rank": rows, "batch_size": args.batch_size, "steps": steps, "hidden": args.hidden,
        "shuffle_buffer": args.shuffle_buffer,
        "reader_rows_per_s": rows / reader_s, "model_step_ms": step_s * 1e3,
        "model_rows_per_s": args.batch_size / step_s, "epoch_s": both_s, "epoch_wait_s": r.wait_s,
        "epoch_wait_fraction": r.wait_s / both_s,
    }
    print("| rows/rank | batch | hidden | shuffle buffer | reader alone (rows/s) | model step (ms) | model (rows/s) "
          "| epoch (s) | waited for data (s) | waited (%) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("| %d | %d | %d | %s | %.0f | %.2f | %.0f | %.2f | %.3f | %.1f |" % (
        rows, args.batch_size, args.hidden, args.shuffle_buffer or "shard", result["reader_rows_per_s"],
        result["model_step_ms"], result["model_rows_per_s"],
        both_s, r.wait_s, 100 * result["epoch_wait_fraction"]))
    print(result["machine"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
