#!/usr/bin/env python3
# GPU collectives through horovod.common.ops at np=1 on cupy arrays (init before numpy/cupy are
# imported: the device image crashes otherwise). Checks every result against numpy.
from horovod.common.basics import HorovodBasics

basics = HorovodBasics()
basics.init()
import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402

from horovod.common import ops  # noqa: E402

stream = cp.cuda.get_current_stream().ptr
checked = []
for dtype in ["float16", "float32", "float64", "int32", "int64"]:
    host = (np.arange(24).reshape(4, 6) % 7).astype(dtype)
    # single tensor, Sum, in place
    x = cp.asarray(host)
    ops.wait(ops.allreduce_async([x], [x], [f"one.{dtype}"], 1, 1.0, 1.0, 0, stream))
    np.testing.assert_allclose(cp.asnumpy(x).astype("float64"), host.astype("float64"))
    # fused group of three, Average with prescale 2 and postscale 0.5 (fusion buffer, copy and scale kernels)
    xs = [cp.asarray(host[:k + 1]) for k in range(3)]
    outs = [cp.empty_like(t) for t in xs]
    ops.wait(ops.allreduce_async(xs, outs, [f"grp.{dtype}.{k}" for k in range(3)], 0, 2.0, 0.5, 0, stream))
    for k, o in enumerate(outs):
        expected = host[:k + 1].astype("float64") * 2.0
        expected = np.trunc(expected) * 0.5 if dtype.startswith("int") else expected * 0.5
        got = cp.asnumpy(o).astype("float64")
        np.testing.assert_allclose(got, np.trunc(expected) if dtype.startswith("int") else expected, rtol=1e-3)
    checked.append(dtype)
# allgather: engine-allocated output on the device
g = ops.wait(ops.allgather_async([cp.arange(6, dtype=cp.float32).reshape(3, 2)], ["ag"], 0, stream))[0]
g = cp.from_dlpack(g)
assert g.device.id == 0 and cp.asnumpy(g).tolist() == np.arange(6, dtype=np.float32).reshape(3, 2).tolist()
# broadcast in place
b = cp.full((5,), 3.0, dtype=cp.float64)
ops.wait(ops.broadcast_async([b], ["bc"], 0, 0, stream))
assert cp.asnumpy(b).tolist() == [3.0] * 5
# alltoall with splits, received splits on the host
a_out, splits = ops.wait(ops.alltoall_async(cp.arange(8, dtype=cp.int32), [8], "a2a", 0, stream))
assert cp.asnumpy(cp.from_dlpack(a_out)).tolist() == list(range(8)) and np.asarray(splits).tolist() == [8]
# reducescatter, Average
r = ops.wait(ops.reducescatter_async([cp.arange(10, dtype=cp.float32)], ["rs"], 0, 1.0, 1.0, 0, stream))[0]
assert cp.asnumpy(cp.from_dlpack(r)).tolist() == list(range(10))
# a reduction NCCL cannot do is refused at enqueue
try:
    ops.allreduce_async([cp.ones(3, dtype=cp.int16)], [cp.ones(3, dtype=cp.int16)], ["i16"], 1, 1.0, 1.0, 0, stream)
    raise SystemExit("int16 GPU allreduce was accepted")
except ValueError as e:
    assert "NCCL" in str(e), e
basics.shutdown()
print("GPU CHECK OK:", checked, "+ allgather, broadcast, alltoall, reducescatter, int16 refused")
