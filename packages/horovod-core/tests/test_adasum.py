"""Adasum on CPU (spec core.md §6.10) against a numpy reference of the pairwise definition."""

import numpy as np
import pytest

from horovod_testing import run_ranks

ADASUM = 2


def combine(a, b):
    """(1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b, in float64, a zero-norm side keeping coefficient 1."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    dot, na, nb = a @ b, a @ a, b @ b
    tiny = np.sqrt(np.finfo(np.float64).tiny)
    ca = 1.0 if na < tiny else 1.0 - dot / (2 * na)
    cb = 1.0 if nb < tiny else 1.0 - dot / (2 * nb)
    return ca * a + cb * b


def reference(vectors):
    """Ranks 2i and 2i+1 combine first, then blocks of 2, 4, ...: a balanced tree in rank order."""
    if len(vectors) == 1:
        return vectors[0].astype(np.float64)
    half = len(vectors) // 2
    return combine(reference(vectors[:half]), reference(vectors[half:]))


def rank_vector(rank, n, dtype, salt):
    rng = np.random.default_rng([rank, n, salt])
    return rng.standard_normal(n).astype(dtype)


CASES = [(n, dtype) for n in (1, 7, 1000) for dtype in ("float16", "float32", "float64")]


def _adasum_cases():
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics
    basics = HorovodBasics()
    basics.init()
    rank, size = basics.rank(), basics.size()
    checked = 0
    for salt, (n, dtype) in enumerate(CASES):
        x = rank_vector(rank, n, dtype, salt)
        ops.wait(ops.allreduce_async([x], [x], [f"allreduce.adasum.{salt}"], ADASUM))
        expected = reference([rank_vector(r, n, dtype, salt) for r in range(size)])
        tolerance = {"float16": 2e-2, "float32": 1e-5, "float64": 1e-12}[dtype]
        np.testing.assert_allclose(x.astype(np.float64), expected, rtol=tolerance, atol=tolerance)
        checked += 1
    # Orthogonal vectors add up; equal vectors average.
    e = np.zeros(size * 2)
    e[rank] = 1.0
    ops.wait(ops.allreduce_async([e], [e], ["allreduce.adasum.orthogonal"], ADASUM))
    assert np.array_equal(e, np.r_[np.ones(size), np.zeros(size)]), e
    same = np.full(5, 3.0)
    ops.wait(ops.allreduce_async([same], [same], ["allreduce.adasum.same"], ADASUM))
    assert np.allclose(same, 3.0), same
    # Integer tensors are refused at once.
    try:
        ops.allreduce_async([np.ones(3, np.int32)], [np.ones(3, np.int32)], ["allreduce.i"], ADASUM)
        raise AssertionError("int32 Adasum was accepted")
    except ValueError as e:
        assert "float16, float32 and float64" in str(e)
    return checked + 2


@pytest.mark.parametrize("np_", [1, 2, 4])
def test_adasum_matches_reference(np_):
    assert run_ranks(np_, _adasum_cases, timeout=120) == [len(CASES) + 2] * np_


def _non_power_of_two():
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics
    from horovod.common.exceptions import HorovodInternalError
    basics = HorovodBasics()
    basics.init()
    x = np.ones(4, np.float32)
    try:
        ops.allreduce_async([x], [x], ["allreduce.adasum"], ADASUM)
    except HorovodInternalError as e:
        return str(e)
    return "accepted"


def test_adasum_needs_power_of_two_ranks():
    for message in run_ranks(3, _non_power_of_two):
        assert "power-of-two" in message, message
