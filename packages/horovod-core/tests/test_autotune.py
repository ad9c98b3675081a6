"""Autotune (spec core.md §12): rank 0 scores allreduce throughput, searches fusion threshold and
cycle time with Bayesian optimisation, then the response cache, broadcasts every choice, and ends
with the best configuration on every rank; the CSV log records each scored configuration, the last
row being the one chosen. Variables set by the user stay as set."""

import math
import os

import pytest

from horovod_testing import init_error, run_ranks
from horovod_testing.autotune import read_log as _read_log

# The joint stage's fixed first configurations (fusion MB, cycle ms), spec core.md §12.
TEST_POINTS = [(4.0, 5.0), (32.0, 50.0), (16.0, 25.0), (8.0, 10.0)]
MB = 1024 * 1024
# Gradient-like tensors of different sizes (elements), submitted one allreduce each, so that the
# fusion threshold decides how they are grouped.
SIZES = [3, 1000, 25_000, 7, 120_000, 640]


def _short_schedule(log_path, max_samples):
    return {"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": log_path, "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "1",
            "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "2", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": str(max_samples),
            "HOROVOD_LOG_LEVEL": "info"}


def _train_until_tuned(max_steps=2000):
    """Runs allreduce steps until no rank's engine reports tuning any more; checks every result.
    Returns (tuned parameters, steps)."""
    import numpy as np

    from horovod.common import _core, ops
    from horovod.common.basics import HorovodBasics

    basics = HorovodBasics()
    basics.init()
    rank, size = basics.rank(), basics.size()
    try:
        for step in range(max_steps):
            handles, outputs = [], []
            # Odd ranks submit in the opposite order: negotiation (and the response cache's held hits,
            # while the cache is switched off and on) must still line the tensors up.
            order = list(enumerate(SIZES))
            for i, n in (reversed(order) if rank % 2 else order):
                x = np.full(n, rank + 1 + step % 3, dtype=np.float32)
                out = np.empty_like(x)
                handles.append(ops.allreduce_async([x], [out], [f"grad.{i}"], 1))
                outputs.append(out)
            for h in handles:
                ops.wait(h)
            expected = size * (size + 1) / 2 + size * (step % 3)
            for out in outputs:
                np.testing.assert_array_equal(out, np.float32(expected))
            # Every rank reads its own engine's flag at its own moment; the Max makes them agree on
            # when to stop, so that no rank submits a step the others never run.
            flag = np.array([1 if _core.tuned_parameters()["tuning"] else 0], dtype=np.int32)
            ops.wait(ops.allreduce_async([flag], [flag], ["still_tuning"], 4))
            if flag[0] == 0:
                return _core.tuned_parameters(), step + 1
        raise AssertionError(f"autotune still running after {max_steps} steps: {_core.tuned_parameters()}")
    finally:
        basics.shutdown()


def _same_config(row, other):
    return (row["flags"] == other["flags"] and math.isclose(row["cycle"], other["cycle"], rel_tol=1e-5)
            and math.isclose(row["fusion"], other["fusion"], rel_tol=1e-5, abs_tol=1e-6))


def _best(rows):
    """The configuration with the highest mean score (a configuration may be scored more than once)
    and that mean."""
    groups = []
    for row in rows:
        for group in groups:
            if _same_config(group[0], row):
                group.append(row)
                break
        else:
            groups.append([row])
    means = [(group[0], sum(r["score"] for r in group) / len(group)) for group in groups]
    return max(means, key=lambda m: m[1])


def _check_final(rows, params_per_rank):
    *scored, final = rows
    best, mean = _best(scored)
    assert _same_config(final, best) and math.isclose(final["score"], mean, rel_tol=1e-4)
    for params in params_per_rank:
        assert params == params_per_rank[0], params_per_rank  # every rank ends with the same parameters
        assert params["tuning"] is False
        assert params["cache_enabled"] == bool(final["cache"])
        assert math.isclose(params["cycle_time_ms"], final["cycle"], rel_tol=1e-5)
        assert abs(params["fusion_threshold_bytes"] - final["fusion"] * MB) <= 1e-5 * final["fusion"] * MB + 1


@pytest.mark.parametrize("np_", [2, 3])
def test_autotune_runs_to_completion(tmp_path, np_):
    log = str(tmp_path / "autotune.csv")
    max_samples = 5  # the four test points, then one proposal of the Bayesian optimisation
    results = run_ranks(np_, _train_until_tuned, env=_short_schedule(log, max_samples), timeout=240)
    rows = _read_log(log)
    # The initial parameters, the joint stage, the cache off and on, then the chosen configuration.
    assert len(rows) == 1 + max_samples + 2 + 1
    initial, joint, cache = rows[0], rows[1:1 + max_samples], rows[1 + max_samples:3 + max_samples]
    assert (initial["fusion"], initial["cycle"], initial["cache"]) == (128.0, 1.0, 1)
    for row, (fusion, cycle) in zip(joint[:4], TEST_POINTS, strict=True):
        assert (row["fusion"], row["cycle"], row["cache"]) == (fusion, cycle, 1)
    proposal = joint[4]
    assert 0.0 <= proposal["fusion"] <= 64.0 and 1.0 <= proposal["cycle"] <= 100.0
    assert all(r["cache"] == 1 for r in joint)
    best_joint, _ = _best([initial] + joint)
    assert [r["cache"] for r in cache] == [0, 1]
    for row in cache:
        assert (row["fusion"], row["cycle"]) == (best_joint["fusion"], best_joint["cycle"])
    assert all(r["flags"][:3] == [0, 0, 0] for r in rows)
    _check_final(rows, [params for params, _ in results])
    steps = {s for _, s in results}
    assert len(steps) == 1


def test_fixed_variables_are_not_tuned(tmp_path):
    log = str(tmp_path / "autotune.csv")
    env = _short_schedule(log, 4)
    env.update({"HOROVOD_FUSION_THRESHOLD": str(3 * MB), "HOROVOD_CACHE_CAPACITY": "512"})
    results = run_ranks(2, _train_until_tuned, env=env, timeout=240)
    rows = _read_log(log)
    # Cycle time only: the initial one, the four test points' cycle times, then the choice.
    assert len(rows) == 1 + 4 + 1
    assert [r["cycle"] for r in rows[:5]] == [1.0] + [cycle for _, cycle in TEST_POINTS]
    assert all(r["fusion"] == 3.0 and r["cache"] == 1 for r in rows)
    _check_final(rows, [params for params, _ in results])
    assert results[0][0]["fusion_threshold_bytes"] == 3 * MB


def test_everything_fixed_tunes_nothing(tmp_path):
    log = str(tmp_path / "autotune.csv")
    env = _short_schedule(log, 4)
    env.update({"HOROVOD_FUSION_THRESHOLD": "65536", "HOROVOD_CYCLE_TIME": "2.5", "HOROVOD_CACHE_CAPACITY": "0"})
    results = run_ranks(2, _train_until_tuned, env=env, timeout=120)
    assert _read_log(log) == []
    for params, _ in results:
        assert params == {"fusion_threshold_bytes": 65536, "cycle_time_ms": 2.5, "cache_enabled": False,
                          "hierarchical_allreduce": False, "hierarchical_allgather": False,
                          "torus_allreduce": False, "tuning": False}


def _params_without_autotune():
    from horovod.common import _core
    from horovod.common.basics import HorovodBasics

    basics = HorovodBasics()
    basics.init()
    try:
        return _core.tuned_parameters()
    finally:
        basics.shutdown()


def test_parameters_without_autotune_are_the_configured_ones():
    results = run_ranks(1, _params_without_autotune, env={"HOROVOD_FUSION_THRESHOLD": "1000",
                                                          "HOROVOD_CYCLE_TIME": "7"})
    assert results[0] == {"fusion_threshold_bytes": 1000, "cycle_time_ms": 7.0, "cache_enabled": True,
                          "hierarchical_allreduce": False, "hierarchical_allgather": False,
                          "torus_allreduce": False, "tuning": False}


def test_unwritable_log_is_an_init_error(tmp_path):
    bad = str(tmp_path / "no-such-dir" / "autotune.csv")
    results = run_ranks(1, init_error, env={"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": bad,
                                            "HOROVOD_LOG_LEVEL": "error"})
    assert results[0] is not None
    assert not os.path.exists(bad)


def test_gaussian_process_noise_out_of_range():
    from horovod.common import _core

    with pytest.raises(ValueError, match="HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE"):
        _core.parse_config({"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "1.5"})
    with pytest.raises(ValueError, match="HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE"):
        _core.parse_config({"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "-0.1"})


# The optimiser on its own: Gaussian-process regression with expected improvement.

@pytest.mark.parametrize("noise", [0.01, 0.8])
def test_bayesian_optimization_finds_the_maximum_of_a_smooth_function(noise):
    from horovod.common import _core

    def f(x):
        return math.sin(x) + 0.1 * x  # on [0, 10]: a local maximum near 1.67, the global one near 7.95

    true_x = max((i / 1000 for i in range(10_001)), key=f)
    bo = _core.testing.BayesianOptimization([(0.0, 10.0)], noise)
    tried = [1.0, 5.0, 9.0]
    for x in tried:
        bo.add_sample([x], f(x))
    for _ in range(8):
        (x,) = bo.next_sample()
        assert 0.0 <= x <= 10.0
        tried.append(x)
        bo.add_sample([x], f(x))
    assert bo.num_samples == 11
    best = max(tried, key=f)
    assert abs(best - true_x) < 0.2, tried
    assert f(best) > f(true_x) - 0.01


def test_bayesian_optimization_two_dimensions():
    from horovod.common import _core

    def g(fusion, cycle):
        return -((fusion - 20) / 64) ** 2 - ((cycle - 10) / 100) ** 2

    bo = _core.testing.BayesianOptimization([(0.0, 64.0), (1.0, 100.0)], 0.8)
    tried = list(TEST_POINTS)
    for p in tried:
        bo.add_sample(list(p), g(*p))
    for _ in range(10):
        p = bo.next_sample()
        assert 0.0 <= p[0] <= 64.0 and 1.0 <= p[1] <= 100.0
        tried.append(tuple(p))
        bo.add_sample(p, g(*p))
    best = max(tried, key=lambda p: g(*p))
    # Better than every test point, and close to the optimum (20, 10).
    assert g(*best) > max(g(*p) for p in TEST_POINTS)
    assert abs(best[0] - 20) < 6 and abs(best[1] - 10) < 8, tried


def test_expected_improvement_is_zero_far_below_and_positive_near_the_best():
    from horovod.common import _core

    bo = _core.testing.BayesianOptimization([(0.0, 1.0)], 0.01)
    for x, y in [(0.1, 0.0), (0.5, 1.0), (0.9, 0.0)]:
        bo.add_sample([x], y)
    assert bo.expected_improvement([0.5]) < 1e-3  # sampled, no uncertainty left to exploit
    assert bo.expected_improvement([0.6]) > bo.expected_improvement([0.1])


def test_bayesian_optimization_rejects_bad_input():
    from horovod.common import _core

    with pytest.raises(ValueError, match="low < high"):
        _core.testing.BayesianOptimization([(1.0, 1.0)], 0.5)
    with pytest.raises(ValueError, match="no dimension"):
        _core.testing.BayesianOptimization([], 0.5)
    bo = _core.testing.BayesianOptimization([(0.0, 1.0)], 0.5)
    with pytest.raises(ValueError, match="wrong dimension"):
        bo.add_sample([0.1, 0.2], 1.0)
    assert bo.next_sample() == [0.5]  # no sample yet: the centre
