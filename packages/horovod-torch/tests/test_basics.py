"""Basics, the exported surface, and the errors of horovod.torch."""

import os
import subprocess
import sys
import warnings

import pytest
import torch
from jobs import job_fixture

EXPORTED = """
Compression allgather_object broadcast_object broadcast_optimizer_state broadcast_parameters
allreduce allreduce_async allreduce_ allreduce_async_
grouped_allreduce grouped_allreduce_async grouped_allreduce_ grouped_allreduce_async_
allgather allgather_async broadcast broadcast_async broadcast_ broadcast_async_
poll synchronize init shutdown is_initialized start_timeline stop_timeline
size local_size cross_size rank local_rank cross_rank
mpi_threads_supported mpi_enabled mpi_built gloo_enabled gloo_built nccl_built ddl_built ccl_built
cuda_built rocm_built ProcessSet global_process_set add_process_set remove_process_set
alltoall alltoall_async reducescatter reducescatter_async grouped_reducescatter
grouped_reducescatter_async grouped_allgather grouped_allgather_async join barrier
Average Sum Adasum Min Max Product HorovodInternalError DistributedOptimizer mpi_ops
""".split()


def test_exported_names():
    import horovod.torch as hvd
    missing = [name for name in EXPORTED if not hasattr(hvd, name)]
    assert not missing
    assert [hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product] == list(range(6))
    assert issubclass(hvd.HorovodInternalError, RuntimeError)
    assert hvd.mpi_ops.is_homogeneous is not None
    assert hvd._check_has_gpu() == torch.cuda.is_available()


def test_import_pulls_in_no_other_framework():
    code = ('import sys, horovod.torch; '
            'print(sorted(m for m in ("tensorflow", "mxnet", "keras") if m in sys.modules))')
    out = subprocess.run([sys.executable, '-c', code], check=True, capture_output=True,
                         text=True, env=dict(os.environ)).stdout
    assert out.strip() == '[]'


def test_queries_before_init():
    import horovod.torch as hvd
    assert not hvd.is_initialized()
    with pytest.raises(ValueError, match='(?i)init'):
        hvd.rank()
    with pytest.raises(hvd.HorovodInternalError):
        hvd.allreduce(torch.ones(2))


def basics_worker():
    import horovod.torch as hvd
    hvd.init()
    hvd.init()  # idempotent
    info = dict(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(),
                local_size=hvd.local_size(), cross_rank=hvd.cross_rank(),
                cross_size=hvd.cross_size(), homogeneous=hvd.mpi_ops.is_homogeneous(),
                initialized=hvd.is_initialized(), gloo_built=hvd.gloo_built(),
                mpi_enabled=hvd.mpi_enabled(), nccl_built=hvd.nccl_built(),
                global_ranks=hvd.global_process_set.ranks)
    # Shutdown and init again, repeatedly; collectives work after each init and handles left
    # over from the previous run are dropped.
    for round_ in range(2):
        try:
            hvd.allreduce_async(torch.ones(3), name=f'left_over.{round_}')
        except hvd.HorovodInternalError as e:
            # Another rank may already have shut down, which shuts this rank's engine down too.
            assert 'shut down' in str(e)
        hvd.shutdown()
        assert not hvd.is_initialized()
        assert not hvd.mpi_ops._handle_map
        hvd.init()
        total = hvd.allreduce(torch.ones(3), op=hvd.Sum, name='after_reinit')
        assert total.tolist() == [float(hvd.size())] * 3
    return info


def test_topology_and_reinit(job):
    np_, results = job('basics')
    for rank, info in enumerate(results):
        assert info['rank'] == rank and info['size'] == np_
        assert info['local_rank'] == rank and info['local_size'] == np_
        assert info['cross_rank'] == 0 and info['cross_size'] == 1
        assert info['homogeneous'] and info['initialized'] and info['gloo_built']
        assert info['mpi_enabled'] is False and info['nccl_built'] == 0
        assert info['global_ranks'] == list(range(np_))


def errors_worker():
    import horovod.torch as hvd
    hvd.init()
    rank = hvd.rank()
    errors = {}

    def record(key, fn, *exceptions):
        try:
            fn()
            errors[key] = None
        except exceptions as e:
            errors[key] = (type(e).__name__, str(e))

    record('bool_allreduce', lambda: hvd.allreduce(torch.ones(2, dtype=torch.bool)), ValueError)
    record('int8_allreduce', lambda: hvd.allreduce_(torch.ones(2, dtype=torch.int8)), ValueError)
    record('complex_allgather', lambda: hvd.allgather(torch.ones(2, dtype=torch.complex64)),
           ValueError)
    record('non_contiguous', lambda: hvd.allreduce(torch.ones(4, 4).t()), ValueError)
    record('non_contiguous_broadcast', lambda: hvd.broadcast_(torch.ones(4, 4)[:, 1], 0),
           ValueError)
    record('device', lambda: hvd.allreduce(torch.ones(2, device='meta')), ValueError)
    record('sparse', lambda: hvd.allreduce(torch.ones(2, 2).to_sparse()), ValueError)
    record('not_tensor', lambda: hvd.allreduce([1.0, 2.0]), ValueError)
    record('op_and_average', lambda: hvd.allreduce(torch.ones(2), average=True, op=hvd.Sum),
           ValueError)
    record('unknown_op', lambda: hvd.allreduce(torch.ones(2), op=42), ValueError)
    record('adasum', lambda: hvd.allreduce(torch.ones(2), op=hvd.Adasum), NotImplementedError)
    record('empty_group', lambda: hvd.grouped_allreduce_([]), ValueError)
    record('root_not_int', lambda: hvd.broadcast(torch.ones(2), '0'), ValueError)
    record('root_outside', lambda: hvd.broadcast(torch.ones(2), hvd.size()), ValueError)
    record('poll_unknown', lambda: hvd.poll(123456), ValueError)
    errors['synchronize_unknown'] = hvd.synchronize(123456)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        summed = hvd.allreduce(torch.ones(2), average=False)
    errors['average_false'] = (summed.tolist(), [w.category.__name__ for w in caught])

    # Ranks that disagree fail on every rank, and Horovod stays usable.
    record('shape_mismatch',
           lambda: hvd.allreduce(torch.ones(rank + 1), name='mismatch.shape'),
           hvd.HorovodInternalError)
    record('dtype_mismatch',
           lambda: hvd.allreduce(torch.ones(2, dtype=torch.float32 if rank else torch.float64),
                                 name='mismatch.dtype'),
           hvd.HorovodInternalError)
    record('root_mismatch', lambda: hvd.broadcast(torch.ones(2), rank, name='mismatch.root'),
           hvd.HorovodInternalError)
    record('allgather_trailing_mismatch',
           lambda: hvd.allgather(torch.ones(2, rank + 1), name='mismatch.allgather'),
           hvd.HorovodInternalError)
    errors['after'] = hvd.allreduce(torch.ones(2), op=hvd.Sum, name='after').tolist()
    assert not hvd.mpi_ops._handle_map
    return errors


def test_errors(job):
    np_, results = job('errors')
    for errors in results:
        for key in ('bool_allreduce', 'int8_allreduce', 'complex_allgather', 'non_contiguous',
                    'non_contiguous_broadcast', 'device', 'sparse', 'not_tensor',
                    'op_and_average', 'unknown_op', 'empty_group', 'root_not_int',
                    'root_outside', 'poll_unknown'):
            assert errors[key] is not None and errors[key][0] == 'ValueError', key
        assert 'torch.BoolTensor' in errors['bool_allreduce'][1]
        assert 'torch.CharTensor' in errors['int8_allreduce'][1]
        assert 'supersedes' in errors['op_and_average'][1]
        assert 'contiguous' in errors['non_contiguous'][1]
        assert 'contiguous' in errors['non_contiguous_broadcast'][1]
        assert 'GPU' in errors['device'][1] and 'NCCL' in errors['device'][1]
        if np_ & (np_ - 1):
            assert errors['adasum'][0] == 'NotImplementedError', errors['adasum']
            assert 'power-of-2' in errors['adasum'][1]
        else:
            assert errors['adasum'] is None
        assert errors['synchronize_unknown'] is None
        for key in ('shape_mismatch', 'dtype_mismatch', 'root_mismatch',
                    'allgather_trailing_mismatch'):
            if np_ > 1:
                assert errors[key] is not None and errors[key][0] == 'HorovodInternalError', key
            else:
                assert errors[key] is None, 'one rank cannot disagree with itself'
        assert errors['average_false'] == ([float(np_)] * 2, ['DeprecationWarning'])
        assert errors['after'] == [float(np_)] * 2


# 'basics' runs last: it shuts Horovod down and initialises it again.
job = job_fixture({'errors': errors_worker, 'basics': basics_worker})


def test_compression_round_trip():
    from horovod.torch.compression import Compression, FP16Compressor, NoneCompressor
    assert Compression.none is NoneCompressor and Compression.fp16 is FP16Compressor
    x = torch.linspace(-2.0, 2.0, 9, dtype=torch.float64)
    same, ctx = Compression.none.compress(x)
    assert same is x and ctx is None and Compression.none.decompress(same, ctx) is x
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        compressed, ctx = Compression.fp16.compress(x.to(dtype))
        assert compressed.dtype == torch.float16 and ctx == dtype
        restored = Compression.fp16.decompress(compressed, ctx)
        assert restored.dtype == dtype
        torch.testing.assert_close(restored.double(), x, rtol=1e-2, atol=1e-2)
    ints = torch.arange(5)
    compressed, ctx = Compression.fp16.compress(ints)
    assert compressed is ints and ctx is None
    assert Compression.fp16.decompress(compressed, ctx) is ints


def test_bf16_compression_round_trip():
    from horovod.torch.compression import BF16Compressor, Compression
    assert Compression.bf16 is BF16Compressor
    # 3.0e38 is beyond float16's range but not bfloat16's.
    x = torch.tensor([-2.0, 0.1, 1.0 / 3.0, 3.0e38], dtype=torch.float64)
    for dtype in (torch.float16, torch.float32, torch.float64):
        source = x.to(dtype)
        compressed, ctx = Compression.bf16.compress(source)
        assert compressed.dtype == torch.bfloat16 and ctx == dtype
        restored = Compression.bf16.decompress(compressed, ctx)
        assert restored.dtype == dtype
        assert torch.equal(restored, source.to(torch.bfloat16).to(dtype))
    assert torch.isfinite(Compression.bf16.compress(x)[0]).all()
    ints = torch.arange(5)
    compressed, ctx = Compression.bf16.compress(ints)
    assert compressed is ints and ctx is None and Compression.bf16.decompress(compressed, ctx) is ints
