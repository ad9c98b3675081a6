"""bfloat16 reductions through horovod.torch on every CPU path: Gloo with and without shared
memory, hierarchical, and MPI, at 2 to 4 ranks. Each result must equal numpy's float32 reduction of
the ranks' values rounded once to bfloat16 (to nearest, ties to even), bit for bit
(horovod_testing.bfloat16 holds the values and the reference)."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from horovod_testing import run_ranks
from horovod_testing.bfloat16 import CASES, COLUMNS, COUNTS, FUSED, ROWS, check, values


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
        a, f, b = bf16(values(FUSED, rank)), torch.from_numpy(values(FUSED, rank)), bf16(values(FUSED, rank + 7))
        ra, rf, rb = hvd.grouped_allreduce([a, f, b], op=hvd.Average, name="fused")
        out[f"fused.{round_}"] = [bits(ra), rf.numpy().tolist(), bits(rb)]
    x = bf16(values(ROWS * COLUMNS, rank)).reshape(ROWS, COLUMNS)
    out["reducescatter.sum"] = bits(hvd.reducescatter(x, op=hvd.Sum, name="rs.sum").reshape(-1))
    out["reducescatter.average"] = bits(hvd.reducescatter(x, op=hvd.Average, name="rs.average").reshape(-1))
    from horovod.common import _core
    out["hierarchical_allreduces"] = dict(_core.engine_stats()).get("hierarchical_allreduces", 0)
    hvd.shutdown()
    return out


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_gloo_shared_memory(np_):
    results = run_ranks(np_, worker, timeout=180)
    assert {r["backend"] for r in results} == {"gloo"}
    check(results)


def test_gloo_without_shared_memory():
    check(run_ranks(3, worker, env={"HOROVOD_SHARED_MEMORY": "0"}, timeout=180))


def test_two_hosts():
    """Two fake hosts of 2 ranks: Gloo across them, recursive halving and doubling in float32
    then bfloat16, the first step between ranks of a host through cross-memory attach."""
    check(run_ranks(4, worker, hosts=2, timeout=180))


def test_gloo_without_shared_memory_four_ranks():
    """Gloo's TCP at 4 ranks: recursive halving and doubling without cross-memory attach (at 3
    ranks, above, a float32 ring reduce-scatter and a bfloat16 allgather)."""
    check(run_ranks(4, worker, env={"HOROVOD_SHARED_MEMORY": "0"}, timeout=180))


def test_hierarchical():
    results = run_ranks(4, worker, env={"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}, hosts=2, timeout=180)
    # Every allreduce took the hierarchical path: 6 cases x 4 counts, and per round of the fused
    # group one of its two bfloat16 tensors and one of its float32 tensor (28; before the bfloat16
    # hierarchical path, only the 2 float32 ones did).
    assert [r["hierarchical_allreduces"] for r in results] == [28] * 4
    check(results)


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
