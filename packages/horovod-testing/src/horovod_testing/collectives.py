"""One collective test body, checked against numpy references, reused by every framework package
through a tensor adapter (STYLE.md: mpi4py's habit). Each ``check_*`` function runs on every rank
of a job (see ``run_ranks``), raises AssertionError on the first wrong result, and returns the
number of cases it checked.

Inputs are small integers (|x| <= 3), so sums and products are exact in every dtype and the
references can demand bit-identical results, including the scaling rules of spec core.md §6.2
(integers scaled in float64 and truncated, float16 in float32, float32 with a float32 factor).
bfloat16, which numpy lacks, is carried as float32 in the reference and compared with a tolerance.
"""

import functools

import numpy as np

AVERAGE, SUM, MIN, MAX, PRODUCT = 0, 1, 3, 4, 5
REDUCE_OPS = [AVERAGE, SUM, MIN, MAX, PRODUCT]
ALLREDUCE_DTYPES = ["uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"]
GATHER_DTYPES = ALLREDUCE_DTYPES + ["uint16", "bool"]
SHAPES = [(), (17,), (5, 3), (2, 3, 4)]


class NumpyAdapter:
    """Reaches the engine through horovod.common directly, with numpy arrays."""

    allreduce_dtypes = ALLREDUCE_DTYPES + ["uint16", "bool"]
    gather_dtypes = GATHER_DTYPES

    def __init__(self):
        from horovod.common import ops
        from horovod.common.basics import HorovodBasics
        self.ops = ops
        self.basics = HorovodBasics()

    def init(self):
        self.basics.init()

    def rank(self):
        return self.basics.rank()

    def size(self):
        return self.basics.size()

    def tensor(self, array, dtype):
        return np.array(array, dtype=dtype)

    def to_numpy(self, tensor):
        return np.asarray(tensor)

    def allreduce(self, tensor, op, prescale, postscale, name, inplace):
        output = tensor if inplace else np.empty_like(tensor)
        h = self.ops.new_handle()
        self.ops.allreduce_async(h, [tensor], [output], [f"allreduce.{name}"], op, prescale, postscale)
        self.ops.wait(h)
        return output

    def grouped_allreduce(self, tensors, op, name, inplace):
        outputs = tensors if inplace else [np.empty_like(t) for t in tensors]
        h = self.ops.new_handle()
        names = [f"grouped_allreduce.{name}_{i + 1}of{len(tensors)}" for i in range(len(tensors))]
        self.ops.allreduce_async(h, tensors, outputs, names, op)
        self.ops.wait(h)
        return outputs

    def allgather(self, tensor, name):
        h = self.ops.new_handle()
        self.ops.allgather_async(h, [tensor], [f"allgather.{name}"])
        return np.from_dlpack(self.ops.wait(h)[0])

    def broadcast(self, tensor, root_rank, name, inplace):
        target = tensor if inplace else tensor.copy()
        h = self.ops.new_handle()
        self.ops.broadcast_async(h, [target], [f"broadcast.{name}"], root_rank)
        self.ops.wait(h)
        return target


def _numpy_dtype(dtype):
    return np.dtype("float32") if dtype == "bfloat16" else np.dtype(dtype)


def rank_input(rank, dtype, shape, salt=0):
    """The deterministic input of `rank`: small integers, non-negative for unsigned types, 0/1 for
    bool. Any rank can compute any other rank's input, which is how references are built."""
    rng = np.random.default_rng([rank, salt, len(shape), *shape])
    dt = _numpy_dtype(dtype)
    if dt == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    low = 0 if dt.kind == "u" else -3
    return rng.integers(low, 4, size=shape).astype(dt)


def _scale(a, factor, dtype):
    if factor == 1.0:
        return a
    dt = _numpy_dtype(dtype)
    if dt.kind in "iu":
        return np.trunc(a.astype(np.float64) * factor).astype(dt)
    if dt == np.float16:
        return (a.astype(np.float32) * np.float32(factor)).astype(np.float16)
    if dt == np.float32:
        return (a * np.float32(factor)).astype(np.float32)
    return a * factor


def reference_allreduce(inputs, op, prescale, postscale, dtype):
    """postscale * REDUCE(prescale * x_r) with the engine's scaling rules; Average divides by the
    number of inputs through the postscale factor."""
    if _numpy_dtype(dtype) == np.bool_:
        combine = {SUM: np.logical_or, MAX: np.logical_or, MIN: np.logical_and, PRODUCT: np.logical_and}[op]
        return functools.reduce(combine, inputs)
    scaled = [_scale(x, prescale, dtype) for x in inputs]
    combine = {AVERAGE: np.add, SUM: np.add, MIN: np.minimum, MAX: np.maximum, PRODUCT: np.multiply}[op]
    reduced = functools.reduce(lambda a, b: combine(a, b).astype(a.dtype), scaled)
    post = postscale / len(inputs) if op == AVERAGE else postscale
    return _scale(reduced, post, dtype)


def assert_equal(actual, expected, dtype, what):
    actual = np.asarray(actual)
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: shape {actual.shape}, expected {expected.shape}")
    if dtype == "bfloat16":
        ok = np.allclose(actual.astype(np.float64), expected.astype(np.float64), rtol=1e-2, atol=1e-2)
    else:
        ok = actual.dtype == expected.dtype and np.array_equal(actual, expected)
    if not ok:
        raise AssertionError(f"{what}: got {actual!r} ({actual.dtype}), expected {expected!r} ({expected.dtype})")


def check_allreduce(adapter):
    rank, size = adapter.rank(), adapter.size()
    cases = 0
    for dtype in adapter.allreduce_dtypes:
        is_bool = _numpy_dtype(dtype) == np.bool_
        ops = [SUM, MIN, MAX, PRODUCT] if is_bool else REDUCE_OPS
        scales = [(1.0, 1.0)] if is_bool else [(1.0, 1.0), (2.0, 0.5)]
        for op in ops:
            for prescale, postscale in scales:
                for shape in SHAPES:
                    for inplace in (False, True):
                        name = f"{dtype}.{op}.{prescale}.{len(shape)}.{inplace}"
                        x = adapter.tensor(rank_input(rank, dtype, shape), dtype)
                        result = adapter.allreduce(x, op, prescale, postscale, name, inplace)
                        expected = reference_allreduce([rank_input(r, dtype, shape) for r in range(size)], op,
                                                       prescale, postscale, dtype)
                        assert_equal(adapter.to_numpy(result), expected, dtype, f"allreduce {name}")
                        if not inplace:
                            assert_equal(adapter.to_numpy(x), rank_input(rank, dtype, shape), dtype,
                                         f"allreduce {name} left its input unchanged")
                        cases += 1
    return cases


def check_grouped_allreduce(adapter):
    rank, size = adapter.rank(), adapter.size()
    cases = 0
    # Mixed dtypes and sizes in one group: fused where dtypes agree, results as if separate.
    members = [("float32", (3,)), ("float64", (4, 2)), ("int32", (5,)), ("float32", (1000,)), ("float32", ())]
    for op in (SUM, AVERAGE, MAX):
        for inplace in (False, True):
            tensors = [adapter.tensor(rank_input(rank, dt, shape, salt=i), dt) for i, (dt, shape) in enumerate(members)]
            results = adapter.grouped_allreduce(tensors, op, f"group.{op}.{inplace}", inplace)
            for i, ((dt, shape), result) in enumerate(zip(members, results, strict=True)):
                expected = reference_allreduce([rank_input(r, dt, shape, salt=i) for r in range(size)], op, 1.0,
                                               1.0, dt)
                assert_equal(adapter.to_numpy(result), expected, dt, f"grouped allreduce member {i}")
            cases += 1
    return cases


def check_allgather(adapter):
    rank, size = adapter.rank(), adapter.size()
    cases = 0
    for dtype in adapter.gather_dtypes:
        for tail in [(), (3,), (2, 2)]:
            # Every rank contributes a different number of rows, rank 0 none at all when size > 1.
            rows = [(r + 1) % 3 if size > 1 else 2 for r in range(size)]
            x = adapter.tensor(rank_input(rank, dtype, (rows[rank],) + tail), dtype)
            result = adapter.allgather(x, f"{dtype}.{len(tail)}")
            expected = np.concatenate([rank_input(r, dtype, (rows[r],) + tail) for r in range(size)])
            assert_equal(adapter.to_numpy(result), expected, dtype, f"allgather {dtype} {tail}")
            cases += 1
    return cases


def check_broadcast(adapter):
    rank, size = adapter.rank(), adapter.size()
    cases = 0
    for dtype in adapter.gather_dtypes:
        for root in range(size):
            for shape in [(), (7,), (3, 4)]:
                for inplace in (False, True):
                    x = adapter.tensor(rank_input(rank, dtype, shape), dtype)
                    result = adapter.broadcast(x, root, f"{dtype}.{root}.{len(shape)}.{inplace}", inplace)
                    assert_equal(adapter.to_numpy(result), rank_input(root, dtype, shape), dtype,
                                 f"broadcast {dtype} from {root}")
                    if not inplace or rank == root:
                        assert_equal(adapter.to_numpy(x), rank_input(rank, dtype, shape), dtype,
                                     f"broadcast {dtype} kept the input")
                    cases += 1
    return cases


def run_collective_suite(adapter_factory):
    """Runs every check on this rank; returns {check name: cases}."""
    adapter = adapter_factory()
    adapter.init()
    return {check.__name__: check(adapter)
            for check in (check_allreduce, check_grouped_allreduce, check_allgather, check_broadcast)}
