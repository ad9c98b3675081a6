"""Every collective of horovod.torch, in every form and supported dtype, and the gradients of
the differentiable ones, against numpy references computed in the test process from the same
seeded per-rank inputs.

One job per world size runs every worker body below (starting ranks costs seconds, the
collectives milliseconds); each test then checks its part of the results.
"""

import numpy as np
import torch
from jobs import job_fixture

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
    # Integer scale factors (converted to float), in place; synchronize bumps the version counter
    # of the tensor the engine wrote behind autograd's back, single and grouped.
    tensor = rank_input(rank, torch.float64, (17,))
    version = tensor._version
    hvd.allreduce_(tensor, op=hvd.Sum, prescale_factor=2, postscale_factor=3)
    results[('float64', 'int-scaled', (17,), 'allreduce_')] = as_numpy(tensor)
    group = [rank_input(rank, torch.float64, (17,)), rank_input(rank, torch.float64, (17,))]
    group_versions = [t._version for t in group]
    hvd.grouped_allreduce_(group, op=hvd.Sum)
    results['versions bumped'] = (tensor._version > version,
                                  [t._version > v for t, v in zip(group, group_versions, strict=True)])
    assert not hvd.mpi_ops._handle_map, 'synchronize left handles behind'
    return results


def test_allreduce_all_dtypes_ops_and_forms(job):
    np_, results = job('allreduce')
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
    expected = reference_allreduce(np_, torch.float64, (17,), 'Sum', prescale=2.0, postscale=3.0)
    for rank, per_rank in enumerate(results):
        assert_matches(per_rank[('float64', 'int-scaled', (17,), 'allreduce_')], expected, torch.float64,
                       f'allreduce_ with integer scale factors on rank {rank}')
        assert per_rank['versions bumped'] == (True, [True, True]), f'rank {rank}'


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


def test_grouped_allreduce(job):
    np_, results = job('grouped')
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


def test_allgather_all_dtypes(job):
    np_, results = job('allgather')
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


def test_broadcast_all_dtypes(job):
    np_, results = job('broadcast')
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
    # Submitting a name that is still in flight is an error at submission. Rank 0 holds 'twice'
    # in flight by submitting it before any peer does (so this needs two or more ranks); the
    # peers submit it once rank 0 has tried the duplicate and broadcasts that it is done.
    duplicate_error = None
    if hvd.size() > 1:
        if hvd.rank() == 0:
            first = hvd.allreduce_async(torch.ones(2), name='twice')
            try:
                hvd.allreduce_async(torch.ones(2), name='twice')
            except ValueError as e:
                duplicate_error = str(e)
            hvd.broadcast_object('go', root_rank=0, name='duplicate_done')
        else:
            hvd.broadcast_object(None, root_rank=0, name='duplicate_done')
            first = hvd.allreduce_async(torch.ones(2), name='twice')
        hvd.synchronize(first)
        second_sync = hvd.synchronize(first)
    else:
        second_sync = hvd.synchronize(hvd.allreduce_async(torch.ones(2), name='once'))
    return sums, duplicate_error, second_sync


def test_unnamed_ops_in_flight_and_duplicate_names(job):
    np_, results = job('names')
    expected = [float(sum(r + i for r in range(np_))) for i in reversed(range(20))]
    for rank, (sums, duplicate_error, second_sync) in enumerate(results):
        assert sums == expected
        if np_ > 1 and rank == 0:
            assert 'twice' in duplicate_error
        else:
            assert duplicate_error is None
        # Synchronizing a handle a second time returns None (np > 1); at np=1, the result.
        assert second_sync is None if np_ > 1 else second_sync.tolist() == [1.0, 1.0]


# Gradients: rank r computes loss_r = sum(op(x_r) * w_r) with its own weights w_r and calls
# loss_r.backward(); the expected gradient of x_r follows from the backward rules of the spec.


def weights(rank, shape, salt):
    rng = np.random.default_rng([rank, salt])
    return torch.from_numpy(rng.uniform(-1.0, 1.0, shape))


def autograd_worker():
    import horovod.torch as hvd
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    root = size - 1
    grads = {}

    x = torch.ones(3, 4, dtype=torch.float64, requires_grad=True)
    for op_name in ('Sum', 'Average'):
        x.grad = None
        y = hvd.allreduce(x, op=getattr(hvd, op_name), prescale_factor=2.0)
        (y * weights(rank, (3, 4), 0)).sum().backward()
        grads[f'allreduce.{op_name}'] = x.grad.numpy().copy()

    a = torch.ones(2, dtype=torch.float64, requires_grad=True)
    b = torch.ones(3, 2, dtype=torch.float64, requires_grad=True)
    ya, yb = hvd.grouped_allreduce([a, b], op=hvd.Sum)
    ((ya * weights(rank, (2,), 1)).sum() + (yb * weights(rank, (3, 2), 2)).sum()).backward()
    grads['grouped.a'] = a.grad.numpy().copy()
    grads['grouped.b'] = b.grad.numpy().copy()

    # Rank r contributes r + 1 rows.
    g = torch.ones(rank + 1, 2, dtype=torch.float64, requires_grad=True)
    total_rows = size * (size + 1) // 2
    (hvd.allgather(g) * weights(rank, (total_rows, 2), 3)).sum().backward()
    grads['allgather'] = g.grad.numpy().copy()

    c = torch.ones(5, dtype=torch.float64, requires_grad=True)
    out = hvd.broadcast(c, root_rank=root)
    (out * weights(rank, (5,), 4)).sum().backward()
    grads['broadcast'] = c.grad.numpy().copy()

    # A gradient that arrives non-contiguous (an expanded view) still reduces.
    d = torch.ones(4, 3, dtype=torch.float64, requires_grad=True)
    hvd.allreduce(d, op=hvd.Sum).sum().backward()
    grads['expanded'] = d.grad.numpy().copy()
    return grads


def test_gradients(job):
    np_, results = job('autograd')

    def mean_weights(shape, salt):
        return np.mean([weights(r, shape, salt).numpy() for r in range(np_)], axis=0)

    def sum_weights(shape, salt):
        return np.sum([weights(r, shape, salt).numpy() for r in range(np_)], axis=0)

    offsets = np.cumsum([0] + [r + 1 for r in range(np_)])
    total_rows = offsets[-1]
    for rank, grads in enumerate(results):
        # d(postscale * sum(prescale * x))/dx, allreduced with the same settings.
        np.testing.assert_allclose(grads['allreduce.Sum'], 2.0 * sum_weights((3, 4), 0))
        np.testing.assert_allclose(grads['allreduce.Average'], 2.0 * mean_weights((3, 4), 0))
        np.testing.assert_allclose(grads['grouped.a'], sum_weights((2,), 1))
        np.testing.assert_allclose(grads['grouped.b'], sum_weights((3, 2), 2))
        rows = mean_weights((total_rows, 2), 3)[offsets[rank]:offsets[rank + 1]]
        np.testing.assert_allclose(grads['allgather'], rows)
        expected = mean_weights((5,), 4) if rank == np_ - 1 else np.zeros(5)
        np.testing.assert_allclose(grads['broadcast'], expected)
        np.testing.assert_allclose(grads['expanded'], np.full((4, 3), float(np_)))


def fp16_worker():
    import horovod.torch as hvd
    hvd.init()
    rng = np.random.default_rng(hvd.rank())
    x = torch.from_numpy(rng.uniform(-1.0, 1.0, (64,))).float()
    out = hvd.allreduce(x, op=hvd.Average, compression=hvd.Compression.fp16, name='fp16')
    grouped = hvd.grouped_allreduce([x, torch.arange(4)], op=hvd.Sum,
                                    compression=hvd.Compression.fp16)
    return out, grouped


def test_fp16_compression_allreduce(job):
    np_, results = job('fp16')
    inputs = [np.random.default_rng(r).uniform(-1.0, 1.0, (64,)).astype(np.float32)
              for r in range(np_)]
    for out, (g_float, g_int) in results:
        assert out.dtype == torch.float32 and g_float.dtype == torch.float32
        assert g_int.dtype == torch.int64
        np.testing.assert_allclose(out.numpy(), np.mean(inputs, axis=0), atol=2e-3)
        np.testing.assert_allclose(g_float.numpy(), np.sum(inputs, axis=0), atol=4e-3)
        np.testing.assert_array_equal(g_int.numpy(), np_ * np.arange(4))


def bf16_worker():
    import horovod.torch as hvd
    hvd.init()
    rng = np.random.default_rng(hvd.rank())
    x = torch.from_numpy(rng.uniform(-1.0, 1.0, (64,))).float()
    summed = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.bf16, name='bf16_sum')
    averaged = hvd.allreduce(x, op=hvd.Average, compression=hvd.Compression.bf16, name='bf16_average')
    grouped = hvd.grouped_allreduce([x, torch.arange(4)], op=hvd.Sum, compression=hvd.Compression.bf16)
    return summed, averaged, grouped


def test_bf16_compression_allreduce(job):
    """Compression.bf16: each rank's float32 values rounded to bfloat16 on the way out, summed in
    float32 and rounded to bfloat16 by the core, cast back to float32. At np <= 2 the one sum is
    rounded once: the result is exactly the rounded float32 sum of the rounded inputs. (At np 3
    the engine's reductions still round each partial sum: within one rounding per extra rank.)"""
    np_, results = job('bf16')

    def to_bf16(values):
        return torch.from_numpy(np.asarray(values, dtype=np.float32)).to(torch.bfloat16).float().numpy()

    inputs = [to_bf16(np.random.default_rng(r).uniform(-1.0, 1.0, (64,))) for r in range(np_)]
    once = to_bf16(np.sum(inputs, axis=0, dtype=np.float32))
    tolerance = 0.0 if np_ <= 2 else 2.0 ** -8 * (np_ - 1) * np.abs(once).max()
    for summed, averaged, (g_float, g_int) in results:
        assert summed.dtype == averaged.dtype == g_float.dtype == torch.float32
        assert g_int.dtype == torch.int64
        for got in (summed, g_float):
            np.testing.assert_allclose(got.numpy(), once, rtol=0, atol=tolerance)
        np.testing.assert_allclose(averaged.numpy(), to_bf16(once / np_), rtol=0,
                                   atol=tolerance / np_ + (0.0 if np_ in (1, 2) else 2.0 ** -8))
        np.testing.assert_array_equal(g_int.numpy(), np_ * np.arange(4))


# 'names' runs last: its rejected duplicate submission takes a handle on rank 0 only, after which
# the ranks' automatic names no longer line up.
WORKERS = {'allreduce': allreduce_worker, 'grouped': grouped_worker,
           'allgather': allgather_worker, 'broadcast': broadcast_worker,
           'autograd': autograd_worker, 'fp16': fp16_worker, 'bf16': bf16_worker,
           'names': names_and_handles_worker}


job = job_fixture(WORKERS)
