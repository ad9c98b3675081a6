"""The bfloat16 reference the framework packages' tests share: each rank's values, numpy's float32
reduction of them rounded once to bfloat16, and the check of a job's results against it.

The values have 8 significant bits and exponents within a few powers of two of each other, so
float32 holds every partial sum exactly (the reference does not depend on the order of the sum),
while bfloat16 does not: a reduction that rounded partial sums differs in many elements.

A framework's worker reduces ``values(count, rank)`` (as bfloat16 tensors) for every entry of
``CASES`` and ``COUNTS``, a fused group and a reducescatter, and returns the results as bfloat16
bit patterns (lists of uint16) under the keys ``check`` reads; ``check(results)`` compares every
rank's results with the reference, bit for bit."""

import numpy as np

COUNTS = (1, 7, 4099, 262147)
# The reducescatter's tensor: ROWS x COLUMNS, split by rows.
ROWS, COLUMNS = 1003, 3
# The fused group: two bfloat16 tensors and one float32 tensor of FUSED elements, averaged twice
# (the second time from the response cache).
FUSED = 1001


def values(count, rank, product=False):
    """Rank ``rank``'s float32 values (shape (count,)), each exactly a bfloat16 value. ``product``:
    values in [1, 2) with 3 significant bits, whose products over 4 ranks float32 holds exactly."""
    i = np.arange(count, dtype=np.int64)
    if product:
        return (1 + ((i * 5 + rank * 3) % 8) / 8).astype(np.float32)
    mantissa = 1 + ((i * 37 + rank * 59) % 128) / 128
    sign = np.where((i + rank) % 3 == 0, -1.0, 1.0)
    return (sign * np.ldexp(mantissa, ((i * 3 + rank) % 5 - 2).astype(np.int32))).astype(np.float32)


def bf16_bits(x):
    """float32 -> bfloat16 bit patterns (uint16 array), rounded to nearest, ties to even (no NaN
    here)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


# name -> (reduce, prescale, postscale, product values); reduce maps the ranks' stacked values
# (float32) to their float32 reduction; postscale None means Average (1 / size).
CASES = {
    "sum": (lambda v: v.sum(axis=0, dtype=np.float32), 1.0, 1.0, False),
    "average": (lambda v: v.sum(axis=0, dtype=np.float32), 1.0, None, False),
    "scaled": (lambda v: v.sum(axis=0, dtype=np.float32), 3.0, 0.1, False),
    "min": (lambda v: v.min(axis=0), 1.0, 1.0, False),
    "max": (lambda v: v.max(axis=0), 1.0, 0.3, False),
    "product": (lambda v: np.prod(v, axis=0, dtype=np.float32), 1.0, 1.0, True),
}


def check(results):
    """Asserts every rank's results equal the reference bit for bit.

    Args:
        results: one dict per rank, in rank order, with the keys ``f"{case}.{count}"`` (bit
            patterns of the allreduce of ``values(count, rank)`` for each case of ``CASES``, each
            count of ``COUNTS``), ``"fused.0"`` and ``"fused.1"`` (``[bits of a, float32 values
            of f, bits of b]`` for the averaged group ``values(FUSED, rank)`` as bfloat16,
            float32 and ``values(FUSED, rank + 7)`` as bfloat16), ``"reducescatter.sum"`` and
            ``"reducescatter.average"`` (bits of this rank's rows of the ROWS x COLUMNS tensor
            ``values(ROWS * COLUMNS, rank)``, flattened).

    Raises:
        AssertionError: naming the case, the count, the rank and how many elements differ.
    """
    size = len(results)
    ranks = range(size)
    for name, (reduce, prescale, postscale, product) in CASES.items():
        post = np.float32(1 / size) if postscale is None else np.float32(postscale)
        for count in COUNTS:
            stacked = np.stack([values(count, r, product) * np.float32(prescale) for r in ranks])
            expected = bf16_bits(reduce(stacked) * post)
            for rank, result in enumerate(results):
                got = np.asarray(result[f"{name}.{count}"], dtype=np.uint16)
                wrong = np.flatnonzero(got != expected)
                assert wrong.size == 0, (f"{name}, {count} elements, rank {rank} of {size}: {wrong.size} differ, "
                                         f"first at {wrong[0]}")
    average = np.float32(1 / size)
    want_a = bf16_bits(np.stack([values(FUSED, r) for r in ranks]).sum(axis=0, dtype=np.float32) * average)
    want_b = bf16_bits(np.stack([values(FUSED, r + 7) for r in ranks]).sum(axis=0, dtype=np.float32) * average)
    want_f = np.stack([values(FUSED, r) for r in ranks]).sum(axis=0, dtype=np.float32) * average
    for result in results:
        for round_ in range(2):
            a, f, b = result[f"fused.{round_}"]
            np.testing.assert_array_equal(np.asarray(a, dtype=np.uint16), want_a)
            np.testing.assert_array_equal(np.asarray(b, dtype=np.uint16), want_b)
            np.testing.assert_allclose(f, want_f, rtol=1e-6)
    total = np.stack([values(ROWS * COLUMNS, r) for r in ranks]).sum(axis=0, dtype=np.float32)
    start = 0
    for rank, result in enumerate(results):
        rows = ROWS // size + (rank < ROWS % size)
        block = total[start * COLUMNS:(start + rows) * COLUMNS]
        np.testing.assert_array_equal(np.asarray(result["reducescatter.sum"], dtype=np.uint16), bf16_bits(block))
        np.testing.assert_array_equal(np.asarray(result["reducescatter.average"], dtype=np.uint16),
                                      bf16_bits(block * average))
        start += rows
