"""bfloat16 reductions through horovod.torch on every CPU path: Gloo with and without shared
memory, hierarchical, and MPI, at 2 to 4 ranks. Each result must equal numpy's float32 reduction of
the ranks' values rounded once to bfloat16 (to nearest, ties to even), bit for bit.

The values have 8 significant bits and exponents within a few powers of two of each other, so
float32 holds every partial sum exactly (the reference does not depend on the order of the sum),
while bfloat16 does not: a reduction that rounded partial sums differs in many elements."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from horovod_testing import run_ranks

COUNTS = (1, 7, 4099, 262147)
ROWS, COLUMNS = 1003, 3


def values(count, rank, product=False):
    """Rank `rank`'s float32 values, each exactly a bfloat16 value."""
    i = np.arange(count, dtype=np.int64)
    if product:
        return (1 + ((i * 5 + rank * 3) % 8) / 8).astype(np.float32)
    mantissa = 1 + ((i * 37 + rank * 59) % 128) / 128
    sign = np.where((i + rank) % 3 == 0, -1.0, 1.0)
    return (sign * np.ldexp(mantissa, ((i * 3 + rank) % 5 - 2).astype(np.int32))).astype(np.float32)


def bf16_bits(x):
    """float32 -> bfloat16 bit patterns (uint16), rounded to nearest, ties to even (no NaN here)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


# name -> (reduce, prescale, postscale, product values); reduce maps the ranks' stacked values
# (float32) to their float32 reduction.
CASES = {
    "sum": (lambda v: v.sum(axis=0, dtype=np.float32), 1.0, 1.0, False),
    "average": (lambda v: v.sum(axis=0, dtype=np.float32), 1.0, None, False),
    "scaled": (lambda v: v.sum(axis=0, dtype=np.float32), 3.0, 0.1, False),
    "min": (lambda v: v.min(axis=0), 1.0, 1.0, False),
    "max": (lambda v: v.max(axis=0), 1.0, 0.3, False),
    "product": (lambda v: np.prod(v, axis=0, dtype=np.float32), 1.0, 1.0, True),
}


def worker():
    import torch

    import horovod.torch as hvd
    hvd.init()
    rank = hvd.rank()

    def bf16(x):
        return torch.from_numpy(x).to(torch.bfloat16)

    def bits(t):
        return t.view(torch.int16).numpy().view(np.uint16).tolist()

    ops = {"sum": hvd.Sum, "average": hvd.Average, "scaled": hvd.Sum, "min": hvd.Min, "max": hvd.Max,
           "product": hvd.Product}
    out = {"backend": "mpi" if hvd.mpi_enabled() else "gloo"}
    for name, (_, prescale, postscale, product) in CASES.items():
        for count in COUNTS:
            x = bf16(values(count, rank, product))
            out[f"{name}.{count}"] = bits(hvd.allreduce(x, op=ops[name], prescale_factor=prescale,
                                                        postscale_factor=postscale or 1.0, name=f"{name}.{count}"))
    # bfloat16 fused with float32 (one group), twice: the second from the response cache.
    for round_ in range(2):
        a, f, b = bf16(values(1001, rank)), torch.from_numpy(values(1001, rank)), bf16(values(1001, rank + 7))
        ra, rf, rb = hvd.grouped_allreduce([a, f, b], op=hvd.Average, name="fused")
        out[f"fused.{round_}"] = [bits(ra), rf.numpy().tolist(), bits(rb)]
    x = bf16(values(ROWS * COLUMNS, rank)).reshape(ROWS, COLUMNS)
    out["reducescatter.sum"] = bits(hvd.reducescatter(x, op=hvd.Sum, name="rs.sum").reshape(-1))
    out["reducescatter.average"] = bits(hvd.reducescatter(x, op=hvd.Average, name="rs.average").reshape(-1))
    hvd.shutdown()
    return out


def check(results):
    size = len(results)
    ranks = range(size)
    for name, (reduce, prescale, postscale, product) in CASES.items():
        post = np.float32(1 / size) if postscale is None else np.float32(postscale)
        for count in COUNTS:
            stacked = np.stack([values(count, r, product) * np.float32(prescale) for r in ranks])
            expected = bf16_bits(reduce(stacked) * post)
            for rank, result in enumerate(results):
                got = np.asarray(result[f"{name}.{count}"], dtype=np.uint16)
                wrong = np.flatnonzero(got != expected)
                assert wrong.size == 0, (f"{name}, {count} elements, rank {rank} of {size}: {wrong.size} differ, "
                                         f"first at {wrong[0]}")
    average = np.float32(1 / size)
    want_a = bf16_bits(np.stack([values(1001, r) for r in ranks]).sum(axis=0, dtype=np.float32) * average)
    want_b = bf16_bits(np.stack([values(1001, r + 7) for r in ranks]).sum(axis=0, dtype=np.float32) * average)
    want_f = np.stack([values(1001, r) for r in ranks]).sum(axis=0, dtype=np.float32) * average
    for result in results:
        for round_ in range(2):
            a, f, b = result[f"fused.{round_}"]
            np.testing.assert_array_equal(np.asarray(a, dtype=np.uint16), want_a)
            np.testing.assert_array_equal(np.asarray(b, dtype=np.uint16), want_b)
            np.testing.assert_allclose(f, want_f, rtol=1e-6)
    total = np.stack([values(ROWS * COLUMNS, r) for r in ranks]).sum(axis=0, dtype=np.float32)
    start = 0
    for rank, result in enumerate(results):
        rows = ROWS // size + (rank < ROWS % size)
        block = total[start * COLUMNS:(start + rows) * COLUMNS]
        np.testing.assert_array_equal(np.asarray(result["reducescatter.sum"], dtype=np.uint16), bf16_bits(block))
        np.testing.assert_array_equal(np.asarray(result["reducescatter.average"], dtype=np.uint16),
                                      bf16_bits(block * average))
        start += rows


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_gloo_shared_memory(np_):
    results = run_ranks(np_, worker, timeout=180)
    assert {r["backend"] for r in results} == {"gloo"}
    check(results)


def test_gloo_without_shared_memory():
    check(run_ranks(3, worker, env={"HOROVOD_SHARED_MEMORY": "0"}, timeout=180))


def test_hierarchical():
    check(run_ranks(4, worker, env={"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}, hosts=2, timeout=180))


JOB = """
import json, sys
sys.path.insert(0, {tests!r})
import test_bfloat16
result = test_bfloat16.worker()
import os
with open(os.path.join({out!r}, "rank%s.json" % os.environ["OMPI_COMM_WORLD_RANK"]), "w") as f:
    json.dump(result, f)
"""


@pytest.mark.parametrize("np_", [3, 4])
def test_mpi(np_, tmp_path):
    assert shutil.which("mpirun"), "mpirun not found: install Open MPI (ci/install-system-deps.sh does)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "OMPI_MCA_btl_vader_single_copy_mechanism": "none", "TMPDIR": str(tmp_path)})
    script = tmp_path / "job.py"
    script.write_text(JOB.format(tests=os.path.dirname(os.path.abspath(__file__)), out=str(tmp_path)))
    proc = subprocess.run(["mpirun", "-np", str(np_), "--oversubscribe", "--bind-to", "none", sys.executable,
                           str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(np_)]
    assert {r["backend"] for r in results} == {"mpi"}
    check(results)
