"""Every collective of horovod.torch, in every form and supported dtype, against numpy
references computed in the test process from the same seeded per-rank inputs."""

import numpy as np
import pytest
import torch
from horovod_testing import run_ranks

REDUCE_DTYPES = [torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
                 torch.float64]
MOVE_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
               torch.bfloat16, torch.float32, torch.float64, torch.bool]
# Tolerances of float results whose summation order is the engine's.
TOLERANCE = {torch.float16: 2e-2, torch.bfloat16: 5e-2, torch.float32: 1e-5,
             torch.float64: 1e-12}
SHAPES = [(), (17,), (4, 3, 5)]
OP_NAMES = ['Average', 'Sum', 'Min', 'Max', 'Product']
FORMS = ['allreduce', 'allreduce_', 'allreduce_async', 'allreduce_async_']


def rank_input(rank, dtype, shape, salt=0):
    """The tensor rank ``rank`` contributes; the same on the worker and in the test process."""
    rng = np.random.default_rng([rank, MOVE_DTYPES.index(dtype), len(shape), salt])
    if dtype == torch.bool:
        values = rng.integers(0, 2, shape).astype(bool)
    elif dtype == torch.uint8:
        values = rng.integers(0, 100, shape)
    elif dtype.is_floating_point:
        values = rng.uniform(-1.0, 1.0, shape)
    else:
        # Small magnitudes keep a Product over three ranks within int32.
        values = rng.integers(-9, 10, shape)
    return torch.from_numpy(np.asarray(values)).to(dtype)


def as_numpy(tensor):
    """A numpy copy; bfloat16 becomes float32, which holds every bfloat16 value exactly."""
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.numpy().copy()


def dtype_name(dtype):
    return str(dtype).removeprefix('torch.')


def reference_allreduce(size, dtype, shape, op_name, prescale=1.0, postscale=1.0, salt=0):
    inputs = np.stack([as_numpy(rank_input(r, dtype, shape, salt)).astype(np.float64)
                       for r in range(size)])
    integer = not dtype.is_floating_point

    def scale(x, factor):
        return np.trunc(x * factor) if integer else x * factor

    inputs = scale(inputs, prescale)
    reduced = {'Average': np.sum, 'Sum': np.sum, 'Min': np.min, 'Max': np.max,
               'Product': np.prod}[op_name](inputs, axis=0)
    if op_name == 'Average':
        postscale = postscale / size
    return scale(reduced, postscale)


def assert_matches(result, expected, dtype, what):
    if dtype.is_floating_point:
        tol = TOLERANCE[dtype]
        np.testing.assert_allclose(result, expected, rtol=tol, atol=tol, err_msg=what)
    else:
        np.testing.assert_array_equal(result, expected, err_msg=what)


def allreduce_worker():
    import horovod.torch as hvd
    hvd.init()
    rank = hvd.rank()
    results = {}
    for dtype in REDUCE_DTYPES:
        for op_name in OP_NAMES:
            shapes = SHAPES if op_name == 'Sum' else SHAPES[1:2]
            for shape in shapes:
                for form in FORMS:
                    tensor = rank_input(rank, dtype, shape)
                    before = tensor.clone()
                    op = getattr(hvd, op_name)
                    if form == 'allreduce':
                        out = hvd.allreduce(tensor, op=op)
                    elif form == 'allreduce_':
                        out = hvd.allreduce_(tensor, op=op, name=f'{dtype}.{op_name}.{shape}')
                        assert out is tensor
                    elif form == 'allreduce_async':
                        out = hvd.synchronize(hvd.allreduce_async(tensor, op=op))
                    else:
                        handle = hvd.allreduce_async_(tensor, op=op)
                        while not hvd.poll(handle):
                            pass
                        out = hvd.synchronize(handle)
                        assert out is tensor
                    if not form.endswith('_'):
                        assert torch.equal(tensor, before), 'out-of-place op modified its input'
                    assert out.dtype == dtype and out.shape == torch.Size(shape)
                    results[(dtype_name(dtype), op_name, shape, form)] = as_numpy(out)
    # Scale factors: integers (exactly representable products) and floats.
    for dtype in (torch.int32, torch.float32, torch.float64):
        out = hvd.allreduce(rank_input(rank, dtype, (17,)), op=hvd.Sum, prescale_factor=2.0,
                            postscale_factor=3.0)
        results[(dtype_name(dtype), 'scaled', (17,), 'allreduce')] = as_numpy(out)
    assert not hvd.mpi_ops._handle_map, 'synchronize left handles behind'
    return results


@pytest.mark.parametrize('np_', [1, 2, 3])
def test_allreduce_all_dtypes_ops_and_forms(np_):
    results = run_ranks(np_, allreduce_worker)
    for dtype in REDUCE_DTYPES:
        for op_name in OP_NAMES:
            shapes = SHAPES if op_name == 'Sum' else SHAPES[1:2]
            for shape in shapes:
                expected = reference_allreduce(np_, dtype, shape, op_name)
                for form in FORMS:
                    for rank, per_rank in enumerate(results):
                        what = f'{form} {op_name} {dtype} {shape} on rank {rank} of {np_}'
                        assert_matches(per_rank[(dtype_name(dtype), op_name, shape, form)],
                                       expected, dtype, what)
    for dtype in (torch.int32, torch.float32, torch.float64):
        expected = reference_allreduce(np_, dtype, (17,), 'Sum', prescale=2.0, postscale=3.0)
        for per_rank in results:
            assert_matches(per_rank[(dtype_name(dtype), 'scaled', (17,), 'allreduce')], expected,
                           dtype, f'scaled allreduce {dtype}')


GROUP_DTYPES = [torch.float32, torch.int64, torch.float64, torch.float16]
GROUP_FORMS = ['grouped_allreduce', 'grouped_allreduce_', 'grouped_allreduce_async',
               'grouped_allreduce_async_']


def grouped_worker():
    import horovod.torch as hvd
    hvd.init()
    rank = hvd.rank()
    results = {}
    for op_name in ('Average', 'Sum', 'Max'):
        for form in GROUP_FORMS:
            tensors = [rank_input(rank, dtype, (3, 4), salt=i)
                       for i, dtype in enumerate(GROUP_DTYPES)]
            op = getattr(hvd, op_name)
            fn = getattr(hvd, form)
            out = fn(tensors, op=op, name=f'{op_name}.{form}')
            if form.endswith('async') or form.endswith('async_'):
                out = hvd.synchronize(out)
            assert isinstance(out, list) and len(out) == len(tensors)
            if form.endswith('_'):
                assert all(o is t for o, t in zip(out, tensors, strict=True))
            results[(op_name, form)] = [as_numpy(o) for o in out]
    return results


@pytest.mark.parametrize('np_', [1, 3])
def test_grouped_allreduce(np_):
    results = run_ranks(np_, grouped_worker)
    for op_name in ('Average', 'Sum', 'Max'):
        expected = [reference_allreduce(np_, dtype, (3, 4), op_name, salt=i)
                    for i, dtype in enumerate(GROUP_DTYPES)]
        for form in GROUP_FORMS:
            for per_rank in results:
                for got, want, dtype in zip(per_rank[(op_name, form)], expected, GROUP_DTYPES,
                                            strict=True):
                    assert_matches(got, want, dtype, f'{form} {op_name} {dtype}')


def allgather_worker():
    import horovod.torch as hvd
    hvd.init()
    rank = hvd.rank()
    results = {}
    for dtype in MOVE_DTYPES:
        for trailing in [(), (3,), (2, 5)]:
            # Ranks contribute different numbers of rows: rank r sends r + 1.
            tensor = rank_input(rank, dtype, (rank + 1, *trailing))
            results[(dtype_name(dtype), trailing, 'allgather')] = as_numpy(hvd.allgather(tensor))
            handle = hvd.allgather_async(tensor, name=f'{dtype}.{trailing}')
            results[(dtype_name(dtype), trailing, 'allgather_async')] = as_numpy(
                hvd.synchronize(handle))
    return results


@pytest.mark.parametrize('np_', [1, 2, 3])
def test_allgather_all_dtypes(np_):
    results = run_ranks(np_, allgather_worker)
    for dtype in MOVE_DTYPES:
        for trailing in [(), (3,), (2, 5)]:
            expected = np.concatenate([as_numpy(rank_input(r, dtype, (r + 1, *trailing)))
                                       for r in range(np_)])
            for form in ('allgather', 'allgather_async'):
                for per_rank in results:
                    got = per_rank[(dtype_name(dtype), trailing, form)]
                    assert got.dtype == expected.dtype
                    np.testing.assert_array_equal(got, expected, err_msg=f'{form} {dtype}')


BROADCAST_FORMS = ['broadcast', 'broadcast_', 'broadcast_async', 'broadcast_async_']


def broadcast_worker():
    import horovod.torch as hvd
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    results = {}
    for dtype in MOVE_DTYPES:
        for root in sorted({0, size - 1}):
            for form in BROADCAST_FORMS:
                tensor = rank_input(rank, dtype, (4, 3))
                before = tensor.clone()
                fn = getattr(hvd, form)
                out = fn(tensor, root)
                if 'async' in form:
                    out = hvd.synchronize(out)
                if form.endswith('_'):
                    assert out is tensor
                else:
                    assert out is not tensor
                if not form.endswith('_') or rank == root:
                    assert torch.equal(tensor, before), f'{form} modified an input it must keep'
                results[(dtype_name(dtype), root, form)] = as_numpy(out)
    return results


@pytest.mark.parametrize('np_', [1, 2, 3])
def test_broadcast_all_dtypes(np_):
    results = run_ranks(np_, broadcast_worker)
    for dtype in MOVE_DTYPES:
        for root in sorted({0, np_ - 1}):
            expected = as_numpy(rank_input(root, dtype, (4, 3)))
            for form in BROADCAST_FORMS:
                for per_rank in results:
                    np.testing.assert_array_equal(per_rank[(dtype_name(dtype), root, form)],
                                                  expected, err_msg=f'{form} {dtype} root {root}')


def names_and_handles_worker():
    import horovod.torch as hvd
    hvd.init()
    # Handles come from one counter and unnamed ops get names from it, so ranks that submit in
    # the same order agree without names. Many ops in flight at once, then waited out of order.
    handles = [hvd.allreduce_async(torch.full((3,), float(hvd.rank() + i)), op=hvd.Sum)
               for i in range(20)]
    assert handles == sorted(handles) and len(set(handles)) == len(handles)
    sums = [hvd.synchronize(h)[0].item() for h in reversed(handles)]
    # Submitting a name that is still in flight is an error at submission.
    first = hvd.allreduce_async(torch.ones(2), name='twice')
    try:
        hvd.allreduce_async(torch.ones(2), name='twice')
        duplicate_error = None
    except ValueError as e:
        duplicate_error = str(e)
    hvd.synchronize(first)
    return sums, duplicate_error, hvd.synchronize(first)


def test_unnamed_ops_in_flight_and_duplicate_names():
    results = run_ranks(2, names_and_handles_worker)
    expected = [float(sum(r + i for r in range(2))) for i in reversed(range(20))]
    for sums, duplicate_error, second_sync in results:
        assert sums == expected
        assert duplicate_error is not None
        assert second_sync is None
