"""horovod.torch on CUDA tensors: the shared collective suite (every op against numpy references,
fused grouped allreduce, prescale/postscale) through a CUDA tensor adapter, and the stream
contract. Each rank uses GPU ``local_rank``. Skips, saying why, without a CUDA device or without
a build of horovod-core with NCCL."""

import numpy as np
import pytest
import torch
from horovod_testing import run_ranks
from horovod_testing.collectives import run_collective_suite
from test_collectives import TorchAdapter

import horovod.torch as hvd


def _skip_reason():
    if not hvd.cuda_built():
        return "this build has no NCCL (rebuild horovod-core with HOROVOD_GPU_OPERATIONS=NCCL)"
    if not torch.cuda.is_available():
        return "no CUDA device visible"
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))


def _devices_for(np_):
    if torch.cuda.device_count() < np_:
        pytest.skip(f"np={np_} needs {np_} CUDA devices (NCCL refuses two ranks on one GPU); "
                    f"{torch.cuda.device_count()} visible")


class CudaAdapter(TorchAdapter):
    """The CPU adapter's calls on tensors of GPU ``local_rank``; results are checked on the host."""

    # NCCL has no reduction of int16, uint16 or bool (they are refused with ValueError).
    allreduce_dtypes = ['int32', 'int64', 'float16', 'bfloat16', 'float32', 'float64']
    reducescatter_dtypes = allreduce_dtypes

    def init(self, process_sets=None):
        super().init(process_sets)
        torch.cuda.set_device(self.hvd.local_rank())

    def tensor(self, array, dtype):
        return super().tensor(array, dtype).cuda()

    def to_numpy(self, tensor):
        assert tensor.is_cuda, f'expected a CUDA result, got one on {tensor.device}'
        return super().to_numpy(tensor.cpu())

    def splits_to_numpy(self, received_splits):
        # spec torch.md: alltoall's received splits are an int32 CPU tensor, whatever the device.
        assert not received_splits.is_cuda and received_splits.dtype == torch.int32, \
            f'expected int32 CPU received splits, got {received_splits.dtype} on {received_splits.device}'
        return super().to_numpy(received_splits)


@pytest.mark.parametrize('np_', [1, 2])
def test_gpu_collective_suite(np_):
    _devices_for(np_)
    results = run_ranks(np_, run_collective_suite, CudaAdapter, timeout=600)
    for counts in results:
        assert counts == results[0]
        assert all(cases > 0 for cases in counts.values()), counts


def _stream_semantics():
    hvd.init()
    try:
        torch.cuda.set_device(hvd.local_rank())
        size = hvd.size()
        side = torch.cuda.Stream()
        checked = 0
        with torch.cuda.stream(side):
            for step in range(20):
                x = torch.zeros(1 << 20, device='cuda')
                # A long kernel queued before the fill: the core must wait for the fill on
                # `side` (its ready event), not read the zeros.
                torch.cuda._sleep(1_000_000)
                x.fill_(step + 1)
                y = hvd.allreduce(x, op=hvd.Sum, name=f'stream.{step}')
                # Used on `side` without any synchronisation of our own: `side` waits for the
                # collective's completion event.
                total = (y * 2).sum()
                expected = 2.0 * (step + 1) * size * (1 << 20)
                assert total.item() == expected, (step, total.item(), expected)
                checked += 1
            # Engine-allocated outputs are device memory of this rank's GPU.
            g = hvd.allgather(torch.full((3, 2), hvd.rank(), device='cuda', dtype=torch.float64))
            assert g.is_cuda and g.device.index == hvd.local_rank()
            assert g.cpu().numpy().tolist() == [[float(r)] * 2 for r in range(size) for _ in range(3)]
        return checked
    finally:
        hvd.shutdown()


@pytest.mark.parametrize('np_', [1, 2])
def test_stream_semantics(np_):
    _devices_for(np_)
    assert run_ranks(np_, _stream_semantics, timeout=240) == [20] * np_


def _fused_scaled():
    hvd.init()
    try:
        torch.cuda.set_device(hvd.local_rank())
        size, rank = hvd.size(), hvd.rank()
        tensors = [torch.full((n,), float(rank + 1), device='cuda', dtype=dt)
                   for n, dt in [(1, torch.float32), (7, torch.float32), (1000, torch.float32), (33, torch.float32)]]
        out = hvd.grouped_allreduce(tensors, op=hvd.Average, prescale_factor=2.0, postscale_factor=0.25)
        expected = 2.0 * sum(r + 1 for r in range(size)) / size * 0.25
        for t in out:
            assert t.is_cuda
            np.testing.assert_allclose(t.cpu().numpy(), expected, rtol=1e-6)
        return len(out)
    finally:
        hvd.shutdown()


@pytest.mark.parametrize('np_', [1, 2])
def test_fused_grouped_allreduce_with_scaling(np_):
    _devices_for(np_)
    assert run_ranks(np_, _fused_scaled, timeout=120) == [4] * np_
