#!/usr/bin/env python3
# Caller execution around GPU work at np=1 (init first: see gpu_check.py). CPU allreduces run their
# cycles on the waiting caller; once a GPU tensor has been submitted they no longer do (GPU
# executors stay on the background thread); every result, CPU and GPU, matches numpy.
from horovod.common.basics import HorovodBasics

basics = HorovodBasics()
basics.init()
import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402

from horovod.common import _core, ops  # noqa: E402


def cpu_allreduces(count, prefix):
    for i in range(count):
        x = np.arange(100, dtype=np.float32) * (i + 1)
        ops.wait(ops.allreduce_async([x], [x], [f"{prefix}.{i}"], 1))
        assert np.array_equal(x, np.arange(100, dtype=np.float32) * (i + 1)), (prefix, i)


def caller_cycles():
    return _core.engine_stats()["caller_cycles"]


cpu_allreduces(50, "cpu.before")
before_gpu = caller_cycles()
stream = cp.cuda.get_current_stream().ptr
for i in range(20):
    g = cp.arange(1000, dtype=cp.float32) * i
    ops.wait(ops.allreduce_async([g], [g], [f"gpu.{i}"], 1, 1.0, 1.0, 0, stream))
    assert np.array_equal(cp.asnumpy(g), np.arange(1000, dtype=np.float32) * i), i
after_gpu = caller_cycles()
cpu_allreduces(50, "cpu.after")
after_cpu = caller_cycles()
basics.shutdown()
print(f"caller cycles: {before_gpu} after 50 CPU allreduces, {after_gpu} after 20 GPU ones, "
      f"{after_cpu} after 50 more CPU ones")
assert before_gpu > 0 and after_cpu == after_gpu, (before_gpu, after_gpu, after_cpu)
print("CALLER EXECUTION CHECK OK")
