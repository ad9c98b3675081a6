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
import os
import time

import numpy as np

AVERAGE, SUM, MIN, MAX, PRODUCT = 0, 1, 3, 4, 5
REDUCE_OPS = [AVERAGE, SUM, MIN, MAX, PRODUCT]
ALLREDUCE_DTYPES = ["uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"]
GATHER_DTYPES = ALLREDUCE_DTYPES + ["uint16", "bool"]
REDUCESCATTER_DTYPES = ["int32", "int64", "float16", "float32", "float64"]
SHAPES = [(), (17,), (5, 3), (2, 3, 4)]


class NumpyAdapter:
    """Reaches the engine through horovod.common directly, with numpy arrays. ``process_set`` is
    None (the global set) or a ``horovod.common.process_sets.ProcessSet``."""

    allreduce_dtypes = ALLREDUCE_DTYPES + ["uint16", "bool"]
    gather_dtypes = GATHER_DTYPES
    alltoall_dtypes = GATHER_DTYPES
    reducescatter_dtypes = REDUCESCATTER_DTYPES

    def __init__(self):
        from horovod.common import ops
        from horovod.common import process_sets as process_sets_module
        from horovod.common.basics import HorovodBasics
        self.ops = ops
        self.process_sets = process_sets_module
        self.basics = HorovodBasics()

    def init(self, process_sets=None):
        self.basics.init(process_sets=process_sets)

    def shutdown(self):
        self.basics.shutdown()

    def rank(self):
        return self.basics.rank()

    def size(self):
        return self.basics.size()

    def add_process_set(self, ranks):
        return self.process_sets.add_process_set(ranks)

    def remove_process_set(self, process_set):
        return self.process_sets.remove_process_set(process_set)

    def tensor(self, array, dtype):
        return np.array(array, dtype=dtype)

    def to_numpy(self, tensor):
        return np.asarray(tensor)

    @staticmethod
    def _set_id(process_set):
        return 0 if process_set is None else process_set.process_set_id

    def allreduce(self, tensor, op, prescale, postscale, name, inplace, process_set=None):
        output = tensor if inplace else np.empty_like(tensor)
        h = self.ops.allreduce_async([tensor], [output], self.ops.op_names("allreduce", name), op, prescale, postscale,
                                     self._set_id(process_set))
        self.ops.wait(h)
        return output

    def grouped_allreduce(self, tensors, op, name, inplace, process_set=None):
        outputs = tensors if inplace else [np.empty_like(t) for t in tensors]
        names = self.ops.op_names("grouped_allreduce", name, count=len(tensors))
        h = self.ops.allreduce_async(tensors, outputs, names, op, process_set_id=self._set_id(process_set))
        self.ops.wait(h)
        return outputs

    def allgather(self, tensor, name, process_set=None):
        h = self.ops.allgather_async([tensor], self.ops.op_names("allgather", name), self._set_id(process_set))
        return np.asarray(self.ops.wait(h)[0])

    def grouped_allgather(self, tensors, name, process_set=None):
        h = self.ops.allgather_async(tensors, self.ops.op_names("grouped_allgather", name, count=len(tensors)),
                                     self._set_id(process_set))
        return [np.asarray(out) for out in self.ops.wait(h)]

    def broadcast(self, tensor, root_rank, name, inplace, process_set=None):
        target = tensor if inplace else tensor.copy()
        h = self.ops.broadcast_async([target], self.ops.op_names("broadcast", name), root_rank,
                                     self._set_id(process_set))
        self.ops.wait(h)
        return target

    def alltoall(self, tensor, splits, name, process_set=None):
        h = self.ops.alltoall_async(tensor, splits, self.ops.op_name("alltoall", name), self._set_id(process_set))
        output, received_splits = self.ops.wait(h)
        return np.asarray(output), np.asarray(received_splits)

    def reducescatter(self, tensor, op, name, process_set=None, prescale=1.0, postscale=1.0):
        h = self.ops.reducescatter_async([tensor], self.ops.op_names("reducescatter", name), op, prescale, postscale,
                                         self._set_id(process_set))
        return np.asarray(self.ops.wait(h)[0])

    def grouped_reducescatter(self, tensors, op, name, process_set=None):
        h = self.ops.reducescatter_async(tensors, self.ops.op_names("grouped_reducescatter", name, count=len(tensors)),
                                         op, process_set_id=self._set_id(process_set))
        return [np.asarray(out) for out in self.ops.wait(h)]

    def barrier(self, process_set=None):
        self.ops.barrier(self._set_id(process_set))

    def join(self):
        return self.ops.join()


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


def members(adapter, process_set=None):
    """Global ranks of the set, in set-rank order."""
    return list(range(adapter.size())) if process_set is None else list(process_set.ranks)


def row_counts(dim0, n):
    """Rows of each of ``n`` members after a reducescatter of ``dim0`` rows (core.md §6.7): the
    first ``dim0 % n`` members get one more."""
    return [dim0 // n + (1 if r < dim0 % n else 0) for r in range(n)]


def reference_reducescatter(inputs, op, prescale, postscale, dtype, index):
    """Member ``index``'s block of the reduction of ``inputs`` (one per member, in set-rank order)."""
    full = reference_allreduce(inputs, op, prescale, postscale, dtype)
    counts = row_counts(full.shape[0], len(inputs))
    offset = sum(counts[:index])
    return full[offset:offset + counts[index]]


def reference_alltoall(inputs, splits, index):
    """What member ``index`` receives: from each sender ``s`` (in set-rank order) the rows
    ``[sum(splits[s][:index]), sum(splits[s][:index + 1]))`` of ``inputs[s]``."""
    blocks = []
    for x, sent in zip(inputs, splits, strict=True):
        offset = sum(sent[:index])
        blocks.append(x[offset:offset + sent[index]])
    return np.concatenate(blocks), np.array([sent[index] for sent in splits], dtype=np.int32)


def _uneven_splits(sender, n):
    # Rows `sender` sends to each member: 0 to some member whenever n > 1 ((sender + k + 1) % 3 == 0).
    return [(sender + k + 1) % 3 for k in range(n)]


def check_alltoall(adapter, process_set=None, dtypes=None):
    """Equal splits (splits=None), uneven explicit splits whose sum may be below dim 0 (trailing
    rows stay), zero-size sends, empty inputs, and the received splits."""
    ranks = members(adapter, process_set)
    n, me = len(ranks), ranks.index(adapter.rank())
    dtypes = dtypes or getattr(adapter, "alltoall_dtypes", adapter.gather_dtypes)
    cases = 0
    for dtype in dtypes:
        for tail in [(), (3,), (2, 2)] if dtype == "float32" else [(3,)]:
            layouts = {
                "equal": (None, lambda r: [2] * n),
                # Odd senders keep one trailing row that is not sent.
                "uneven": ("given", lambda r: _uneven_splits(r, n)),
                "empty": (None, lambda r: [0] * n),
                "empty_given": ("given", lambda r: [0] * n),
            }
            for layout, (given, splits_of) in layouts.items():
                splits = [splits_of(r) for r in ranks]
                extra = [(r % 2 if layout == "uneven" else 0) for r in ranks]
                inputs = [rank_input(r, dtype, (sum(splits[i]) + extra[i],) + tail, salt=1)
                          for i, r in enumerate(ranks)]
                what = f"alltoall {dtype} {tail} {layout}"
                x = adapter.tensor(inputs[me], dtype)
                output, received = adapter.alltoall(x, splits[me] if given else None,
                                                    f"{dtype}.{len(tail)}.{layout}", process_set=process_set)
                expected, expected_received = reference_alltoall(inputs, splits, me)
                assert_equal(adapter.to_numpy(output), expected, dtype, what)
                # An adapter whose results live on a device says how the host-side splits convert.
                splits_to_numpy = getattr(adapter, "splits_to_numpy", adapter.to_numpy)
                received = np.asarray(splits_to_numpy(received)).astype(np.int64).tolist()
                if received != expected_received.tolist():
                    raise AssertionError(f"{what}: received splits {received}, expected {expected_received.tolist()}")
                cases += 1
    return cases


def _fusion_threshold():
    return int(os.environ.get("HOROVOD_FUSION_THRESHOLD", 64 * 1024 * 1024))


def check_reducescatter(adapter, process_set=None, dtypes=None):
    """Sum and Average (integer Average truncated toward zero, core.md §6.2), uneven dim 0 (the
    first dim0 % n members get a row more), dim 0 below the set size (some members get no rows),
    pre/postscale; and, when HOROVOD_FUSION_THRESHOLD is small, the prescale-over-threshold error."""
    from horovod.common.exceptions import HorovodInternalError
    ranks = members(adapter, process_set)
    n, me = len(ranks), ranks.index(adapter.rank())
    dtypes = dtypes or getattr(adapter, "reducescatter_dtypes", REDUCESCATTER_DTYPES)
    shapes = [(2 * n + 1, 3), (n,)] + ([(n - 1, 2)] if n > 1 else [])
    cases = 0
    for dtype in dtypes:
        for op in (SUM, AVERAGE):
            for shape in shapes:
                for prescale, postscale in [(1.0, 1.0), (2.0, 0.5)]:
                    nbytes = int(np.prod(shape)) * _numpy_dtype(dtype).itemsize
                    if prescale != 1.0 and nbytes > _fusion_threshold():
                        continue
                    inputs = [rank_input(r, dtype, shape, salt=2) for r in ranks]
                    what = f"reducescatter {dtype} op={op} {shape} scale={prescale},{postscale}"
                    result = adapter.reducescatter(adapter.tensor(inputs[me], dtype), op,
                                                   f"{dtype}.{op}.{shape}.{prescale}", process_set=process_set,
                                                   prescale=prescale, postscale=postscale)
                    expected = reference_reducescatter(inputs, op, prescale, postscale, dtype, me)
                    assert_equal(adapter.to_numpy(result), expected, dtype, what)
                    cases += 1
    shape = (4 * n + 1, 32)
    if _fusion_threshold() < 1024 and process_set is None:
        # core.md §6.7: a prescaled tensor larger than the fusion buffer fails at negotiation.
        x = adapter.tensor(rank_input(adapter.rank(), "float32", shape), "float32")
        try:
            adapter.reducescatter(x, SUM, "prescale_over_threshold", prescale=2.0)
        except HorovodInternalError as e:
            if "HOROVOD_FUSION_THRESHOLD" not in str(e):
                raise AssertionError(f"prescaled reducescatter over the threshold: message {e}") from e
        else:
            raise AssertionError("a prescaled reducescatter larger than HOROVOD_FUSION_THRESHOLD did not fail")
        cases += 1
    return cases


_GROUP = [("float32", (3,)), ("int32", (2, 2)), ("float64", (1000,)), ("float32", (4, 3)), ("int64", (1,))]


def check_grouped_allgather(adapter, process_set=None):
    """A group of mixed dtypes, tails and per-member row counts (some zero)."""
    ranks = members(adapter, process_set)
    me = ranks.index(adapter.rank())
    rows = [[(r + i) % 3 for r in ranks] for i in range(len(_GROUP))]
    tensors = [adapter.tensor(rank_input(ranks[me], dt, (rows[i][me],) + shape[1:], salt=3 + i), dt)
               for i, (dt, shape) in enumerate(_GROUP)]
    results = adapter.grouped_allgather(tensors, "group", process_set=process_set)
    if len(results) != len(_GROUP):
        raise AssertionError(f"grouped allgather returned {len(results)} tensors for {len(_GROUP)}")
    for i, ((dt, shape), result) in enumerate(zip(_GROUP, results, strict=True)):
        expected = np.concatenate([rank_input(r, dt, (rows[i][j],) + shape[1:], salt=3 + i)
                                   for j, r in enumerate(ranks)])
        assert_equal(adapter.to_numpy(result), expected, dt, f"grouped allgather member {i}")
    return 1


def check_grouped_reducescatter(adapter, process_set=None):
    """Sum and Average over a group of mixed dtypes and uneven first dimensions."""
    ranks = members(adapter, process_set)
    n, me = len(ranks), ranks.index(adapter.rank())
    group = [(dt, (shape[0] + n,) + shape[1:]) for dt, shape in _GROUP]
    cases = 0
    for op in (SUM, AVERAGE):
        tensors = [adapter.tensor(rank_input(ranks[me], dt, shape, salt=8 + i), dt)
                   for i, (dt, shape) in enumerate(group)]
        results = adapter.grouped_reducescatter(tensors, op, f"group.{op}", process_set=process_set)
        if len(results) != len(group):
            raise AssertionError(f"grouped reducescatter returned {len(results)} tensors for {len(group)}")
        for i, ((dt, shape), result) in enumerate(zip(group, results, strict=True)):
            inputs = [rank_input(r, dt, shape, salt=8 + i) for r in ranks]
            expected = reference_reducescatter(inputs, op, 1.0, 1.0, dt, me)
            assert_equal(adapter.to_numpy(result), expected, dt, f"grouped reducescatter op={op} member {i}")
        cases += 1
    return cases


def check_barrier(adapter, process_set=None):
    """Barriers complete, and one waits for a late member: the set's first member arrives 0.5 s
    late, and every other member must wait at least 0.2 s (a generous margin for busy machines)."""
    ranks = members(adapter, process_set)
    for _ in range(3):
        adapter.barrier(process_set=process_set)
    late = ranks[0]
    if adapter.rank() == late:
        time.sleep(0.5)
    start = time.monotonic()
    adapter.barrier(process_set=process_set)
    waited = time.monotonic() - start
    if adapter.rank() != late and waited < 0.2:
        raise AssertionError(f"barrier returned after {waited:.3f} s while rank {late} was 0.5 s late")
    return 4


def check_empty_tensors(adapter):
    """Zero-element tensors through allreduce (in and out of place), allgather and broadcast."""
    rank, size = adapter.rank(), adapter.size()
    cases = 0
    for dtype in ("float32", "int32"):
        for shape in [(0,), (0, 3), (3, 0)]:
            for op in (SUM, AVERAGE):
                for inplace in (False, True):
                    x = adapter.tensor(np.zeros(shape, _numpy_dtype(dtype)), dtype)
                    result = adapter.allreduce(x, op, 1.0, 1.0, f"empty.{dtype}.{shape}.{op}.{inplace}", inplace)
                    assert_equal(adapter.to_numpy(result), np.zeros(shape, _numpy_dtype(dtype)), dtype,
                                 f"allreduce of empty {dtype} {shape}")
                    cases += 1
            result = adapter.allgather(adapter.tensor(np.zeros(shape, _numpy_dtype(dtype)), dtype),
                                       f"empty.{dtype}.{shape}")
            expected = np.zeros((shape[0] * size,) + shape[1:], _numpy_dtype(dtype))
            assert_equal(adapter.to_numpy(result), expected, dtype, f"allgather of empty {dtype} {shape}")
            cases += 1
            result = adapter.broadcast(adapter.tensor(np.zeros(shape, _numpy_dtype(dtype)), dtype), size - 1,
                                       f"empty.{dtype}.{shape}", False)
            assert_equal(adapter.to_numpy(result), np.zeros(shape, _numpy_dtype(dtype)), dtype,
                         f"broadcast of empty {dtype} {shape}")
            cases += 1
    # Some ranks contribute rows, others none.
    rows = [2 * (r % 2) for r in range(size)]
    x = adapter.tensor(rank_input(rank, "float32", (rows[rank], 3)), "float32")
    result = adapter.allgather(x, "empty.mixed")
    expected = np.concatenate([rank_input(r, "float32", (rows[r], 3)) for r in range(size)])
    assert_equal(adapter.to_numpy(result), expected, "float32", "allgather where some ranks give no rows")
    return cases + 1


# Checks of the global set, each run only when the adapter has the methods it needs.
_GLOBAL_CHECKS = [
    (check_allreduce, ()),
    (check_grouped_allreduce, ()),
    (check_allgather, ()),
    (check_broadcast, ()),
    (check_empty_tensors, ()),
    (check_grouped_allgather, ("grouped_allgather",)),
    (check_alltoall, ("alltoall",)),
    (check_reducescatter, ("reducescatter",)),
    (check_grouped_reducescatter, ("grouped_reducescatter",)),
    (check_barrier, ("barrier",)),
]


def run_collective_suite(adapter_factory, checks=None):
    """Runs every global-set check the adapter supports on this rank; returns {check name: cases}.

    Args:
        adapter_factory: a callable returning the adapter.
        checks: names of the checks to run (default: all).
    """
    adapter = adapter_factory()
    adapter.init()
    return {check.__name__: check(adapter) for check, needs in _GLOBAL_CHECKS
            if all(hasattr(adapter, method) for method in needs) and (checks is None or check.__name__ in checks)}


def run_join_suite(adapter_factory):
    """Join (core.md §6.9) on every rank; returns (last rank of the first join, cases, last rank of
    the second join or None at size 1).

    Rank r joins after 2r steps of allreduces (rank 0 at once); each step's result must be the sum
    over the ranks that have not joined (Average still divides by the full size). Then, with rank
    0 joined, every other rank's allgather, broadcast, alltoall and reducescatter must fail with a
    HorovodInternalError that mentions join, while an allreduce still works."""
    from horovod.common.exceptions import HorovodInternalError
    adapter = adapter_factory()
    adapter.init()
    rank, size = adapter.rank(), adapter.size()
    cases = 0
    shape = (4, 3)
    # Names repeat across steps so that, with the response cache on, later steps are cache hits.
    kinds = [("float32", SUM), ("int32", AVERAGE), ("float64", AVERAGE), ("int64", SUM)]
    for step in range(2 * rank):
        for dtype, op in kinds:
            x = adapter.tensor(rank_input(rank, dtype, shape, salt=100 + step), dtype)
            result = adapter.allreduce(x, op, 1.0, 1.0, f"join.{dtype}.{op}", False)
            # Ranks r with 2r <= step have joined and contribute zeros.
            inputs = [rank_input(r, dtype, shape, salt=100 + step) if 2 * r > step
                      else np.zeros(shape, _numpy_dtype(dtype)) for r in range(size)]
            assert_equal(adapter.to_numpy(result), reference_allreduce(inputs, op, 1.0, 1.0, dtype), dtype,
                         f"allreduce {dtype} op={op} at step {step} with ranks < {step // 2 + 1} joined")
            cases += 1
    last = adapter.join()
    # The join state resets: everyone takes part again.
    x = adapter.tensor(rank_input(rank, "float32", (5,)), "float32")
    assert_equal(adapter.to_numpy(adapter.allgather(x, "after_join")),
                 np.concatenate([rank_input(r, "float32", (5,)) for r in range(size)]), "float32",
                 "allgather after everyone joined")
    cases += 1
    if size == 1:
        return last, cases, None
    if rank == 0:
        return last, cases, adapter.join()
    unsupported = {
        "allgather": lambda t: adapter.allgather(t, "while_joined"),
        "broadcast": lambda t: adapter.broadcast(t, 1, "while_joined", False),
        "alltoall": lambda t: adapter.alltoall(t, None, "while_joined"),
        "reducescatter": lambda t: adapter.reducescatter(t, SUM, "while_joined"),
    }
    for op_name, submit in unsupported.items():
        if not hasattr(adapter, op_name):
            continue
        try:
            submit(adapter.tensor(rank_input(rank, "float32", (2 * size, 3)), "float32"))
        except HorovodInternalError as e:
            if "join" not in str(e).lower():
                raise AssertionError(f"{op_name} while rank 0 is joined: the message does not mention join: {e}") from e
        else:
            raise AssertionError(f"{op_name} while rank 0 is joined did not fail")
        cases += 1
    x = adapter.tensor(rank_input(rank, "float32", shape, salt=200), "float32")
    inputs = [rank_input(r, "float32", shape, salt=200) if r else np.zeros(shape, np.float32) for r in range(size)]
    assert_equal(adapter.to_numpy(adapter.allreduce(x, SUM, 1.0, 1.0, "while_joined", False)),
                 reference_allreduce(inputs, SUM, 1.0, 1.0, "float32"), "float32",
                 "allreduce after the failed ops, rank 0 joined")
    cases += 1
    return last, cases, adapter.join()
