"""GPU support of the core: the build queries (run everywhere) and GPU tensors through
horovod.common (need a CUDA device, a build with NCCL and torch to make CUDA tensors; they skip
with the reason otherwise). The full collective suite on CUDA tensors is in
packages/horovod-torch/tests/test_gpu.py."""

import numpy as np
import pytest

from horovod.common import _core, util
from horovod.common.basics import HorovodBasics
from horovod_testing import run_ranks


def _torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _gpu_skip_reason():
    if not _core.cuda_built():
        return "this build has no NCCL (rebuild horovod-core with HOROVOD_GPU_OPERATIONS=NCCL)"
    if _torch_cuda() is None:
        return "no CUDA device visible (or torch missing: the GPU tests make CUDA tensors with torch)"
    return None


needs_gpu = pytest.mark.skipif(_gpu_skip_reason() is not None, reason=str(_gpu_skip_reason()))


def test_build_queries_agree():
    basics = HorovodBasics()
    code = basics.nccl_built()
    assert isinstance(code, int) and not isinstance(code, bool)
    assert code == util.nccl_built() == _core.nccl_built()
    assert basics.cuda_built() is util.cuda_built() is _core.cuda_built()
    assert basics.cuda_built() == (code != 0)
    if code:
        # NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch since 2.9 (upstream's tests compare with 2700).
        assert code >= 20900


def test_cpu_build_reports_no_gpu():
    if _core.cuda_built():
        pytest.skip("this build has NCCL")
    assert _core.nccl_built() == 0
    assert _core.cuda_built() is False
    assert "no NCCL support" in _core.gpu_error()
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in _core.gpu_error()
    assert util.gpu_available("torch") is False


def test_gpu_build_without_device_says_why():
    if not _core.cuda_built():
        pytest.skip("this build has no NCCL")
    if _torch_cuda() is not None:
        pytest.skip("a CUDA device is visible")
    # The plugin loads (or names the library it lacks); without a device CUDA says why.
    assert _core.gpu_error() != ""


def test_cpu_only_build_refuses_cuda_tensor():
    torch = _torch_cuda()
    if torch is None:
        pytest.skip("no CUDA device visible: a CUDA DLPack tensor cannot be made")
    if _core.cuda_built():
        pytest.skip("this build has NCCL: CUDA tensors are accepted")
    basics = HorovodBasics()
    basics.init()
    try:
        from horovod.common import ops
        x = torch.ones(4, device="cuda")
        with pytest.raises(ValueError, match="supports CPU tensors only"):
            ops.allreduce_async([x], [x], ["x"], 1)
    finally:
        basics.shutdown()


def _allreduce_every_dtype():
    import torch

    from horovod.common import ops
    basics = HorovodBasics()
    basics.init()
    try:
        rank, size = basics.rank(), basics.size()
        torch.cuda.set_device(rank % torch.cuda.device_count())
        stream = torch.cuda.current_stream().cuda_stream
        checked = 0
        for dtype in ["float16", "float32", "float64", "int32", "int64"]:
            for op, scale in [(1, 1.0), (0, 1.0), (1, 0.5)]:
                host = (np.arange(12).reshape(3, 4) % 5 + rank).astype(dtype)
                x = torch.from_numpy(host).cuda()
                out = torch.empty_like(x)
                h = ops.allreduce_async([x], [out], [f"ar.{dtype}.{op}.{scale}"], op, scale, 1.0, 0, stream)
                ops.wait(h)
                expected = sum((np.arange(12).reshape(3, 4) % 5 + r).astype("float64") * scale for r in range(size))
                if op == 0:
                    expected = expected / size
                if dtype.startswith("int"):
                    expected = sum(np.trunc((np.arange(12).reshape(3, 4) % 5 + r) * scale) for r in range(size))
                    expected = np.trunc(expected / size) if op == 0 else expected
                np.testing.assert_allclose(out.cpu().numpy().astype("float64"), expected, rtol=1e-3)
                checked += 1
        # An engine-allocated output comes back on the input's device.
        h = ops.allgather_async([torch.full((2,), rank, device="cuda")], ["ag"], 0, stream)
        gathered = torch.from_dlpack(ops.wait(h)[0])
        assert gathered.is_cuda and gathered.device.index == torch.cuda.current_device()
        assert gathered.cpu().tolist() == [float(r) for r in range(size) for _ in range(2)]
        return checked
    finally:
        basics.shutdown()


@needs_gpu
@pytest.mark.parametrize("np_", [1, 2])
def test_gpu_allreduce_through_core(np_):
    if np_ > _torch_cuda().cuda.device_count():
        pytest.skip(f"np={np_} needs {np_} CUDA devices (NCCL refuses two ranks on one GPU)")
    results = run_ranks(np_, _allreduce_every_dtype, timeout=240)
    assert results == [15] * np_


def _mixed_devices():
    import torch

    from horovod.common import ops
    basics = HorovodBasics()
    basics.init()
    try:
        x = torch.ones(4, device="cuda") if basics.rank() == 1 else torch.ones(4)
        h = ops.allreduce_async([x], [x], ["mixed"], 1, 1.0, 1.0, 0,
                                torch.cuda.current_stream().cuda_stream if x.is_cuda else 0)
        try:
            ops.wait(h)
        except RuntimeError as e:
            return str(e)
        return "no error"
    finally:
        basics.shutdown()


@needs_gpu
def test_cpu_on_one_rank_gpu_on_another_fails_everywhere():
    results = run_ranks(2, _mixed_devices, timeout=120)
    for message in results:
        assert "Mismatched" in message and "CPU" in message and "GPU" in message, results

