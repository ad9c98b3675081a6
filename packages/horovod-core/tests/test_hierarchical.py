"""Hierarchical allreduce and allgather across hosts (csrc/backends/hierarchical/hierarchical.h; spec core.md §7,
HOROVOD_HIERARCHICAL_ALLREDUCE / HOROVOD_HIERARCHICAL_ALLGATHER).

Several hosts are faked on this machine: run_ranks(hosts=...) gives each group of ranks its own
HOROVOD_HOSTNAME (127.0.0.1, 127.0.0.2, ...) and the matching LOCAL_*/CROSS_* variables, and the
engine groups ranks into hosts by HOROVOD_HOSTNAME. Results are checked against numpy references
computed from every rank's deterministic input, for every dtype and reduce op, element counts that
do not divide among the local ranks, and layouts of 2x1, 2x2, 2x3 and 3x2 ranks; flat and
hierarchical jobs must agree (bitwise for integers, within rounding for floats); engine_stats
must say which path ran; a layout with different numbers of ranks per host falls back to the flat
path; and autotune tries both values of the switches. No test looks at timings."""


import numpy as np
import pytest

from horovod_testing import run_ranks
from horovod_testing.autotune import read_log

HIER = {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}
# (np, hosts): 2 hosts x 1, 2 x 2, 2 x 3, 3 x 2.
LAYOUTS = [(2, 2), (4, 2), (6, 2), (6, 3)]
LAYOUT_IDS = ["2x1", "2x2", "2x3", "3x2"]
DTYPES = ["uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "float32", "float64", "bool"]
# Counts that leave some local ranks with an empty shard (1), uneven shards (7, 1023), and a
# buffer of several MiB (past Gloo's small-allreduce path and the shared-memory slot).
COUNTS = [1, 7, 1023]
BIG = 1_000_003


def _init():
    from horovod.common import _core, ops
    from horovod.common.basics import HorovodBasics
    from horovod_testing.collectives import NumpyAdapter
    basics = HorovodBasics()
    basics.init()
    return basics, ops, NumpyAdapter(), _core


def _stats(core):
    return dict(core.engine_stats())


def _allreduce_suite():
    """Every dtype and op at the small counts, prescale/postscale, and the large count for a few
    dtypes; returns (cases, engine stats)."""
    from horovod_testing.collectives import (AVERAGE, MAX, MIN, PRODUCT, SUM, assert_equal, rank_input,
                                             reference_allreduce)
    basics, ops, adapter, core = _init()
    rank, size = basics.rank(), basics.size()
    cases = 0
    try:
        for dtype in DTYPES:
            ops_to_check = [SUM, MIN, MAX, PRODUCT] if dtype == "bool" else [AVERAGE, SUM, MIN, MAX, PRODUCT]
            for count in COUNTS + ([BIG] if dtype in ("int32", "float32", "uint8") else []):
                for op in ops_to_check if count != BIG else [SUM, MAX]:
                    scales = [(1.0, 1.0)] if dtype == "bool" or count == BIG else [(1.0, 1.0), (2.0, 0.5)]
                    for prescale, postscale in scales:
                        salt = op * 10 + int(prescale)
                        x = rank_input(rank, dtype, (count,), salt=salt)
                        result = adapter.allreduce(x, op, prescale, postscale, f"h.{dtype}.{count}.{op}.{prescale}",
                                                   inplace=cases % 2 == 0)
                        expected = reference_allreduce([rank_input(r, dtype, (count,), salt=salt) for r in range(size)],
                                                       op, prescale, postscale, dtype)
                        assert_equal(result, expected, dtype, f"allreduce {dtype} x{count} op {op} scale {prescale}")
                        cases += 1
        # Several tensors fused into one buffer, and a 2-D tensor.
        xs = [rank_input(rank, "float32", shape, salt=99) for shape in [(3,), (1000,), (5, 7)]]
        results = adapter.grouped_allreduce(xs, SUM, "h.group", inplace=False)
        for shape, result in zip([(3,), (1000,), (5, 7)], results, strict=True):
            expected = reference_allreduce([rank_input(r, "float32", shape, salt=99) for r in range(size)], SUM,
                                           1.0, 1.0, "float32")
            assert_equal(result, expected, "float32", f"grouped allreduce {shape}")
            cases += 1
        return cases, _stats(core)
    finally:
        basics.shutdown()


@pytest.mark.parametrize("np_,hosts", LAYOUTS, ids=LAYOUT_IDS)
def test_hierarchical_allreduce_matches_reference(np_, hosts):
    results = run_ranks(np_, _allreduce_suite, env=HIER, hosts=hosts, timeout=400)
    for cases, stats in results:
        assert cases == results[0][0]
        assert stats["hosts"] == hosts
        assert stats["hierarchical"] and stats["hierarchical_allreduce"]
        assert stats["shared_memory"] is False  # several hosts: no job-wide segment
        # Every allreduce went the hierarchical way (the grouped one is one fused allreduce).
        assert stats["hierarchical_allreduces"] == cases - 2
        assert stats["hierarchical_shared_memory"] is (np_ // hosts > 1)
        assert stats["hierarchical_allgathers"] == 0


def test_hierarchical_without_shared_memory():
    # HOROVOD_SHARED_MEMORY=0: the steps within a host run on a Gloo communicator of the host's
    # ranks (reduce-scatter, allgather) instead of the segment.
    env = {**HIER, "HOROVOD_HIERARCHICAL_ALLGATHER": "1", "HOROVOD_SHARED_MEMORY": "0"}
    results = run_ranks(6, _allreduce_suite, env=env, hosts=2, timeout=400)
    for cases, stats in results:
        assert stats["hierarchical"] and not stats["hierarchical_shared_memory"]
        assert stats["hierarchical_allreduces"] == cases - 2
    for cases, stats in run_ranks(6, _allgather_suite, env=env, hosts=3, timeout=300):
        assert not stats["hierarchical_shared_memory"] and stats["hierarchical_allgathers"] == cases


def _random_allreduces(seed_base):
    """Allreduces of random (non-integer) floats and random integers, and Adasum; returns the
    results for the test process to compare between jobs."""
    from horovod_testing.collectives import AVERAGE, MAX, PRODUCT, SUM
    basics, ops, adapter, core = _init()
    rank = basics.rank()
    out = {}
    try:
        for dtype in ["float16", "float32", "float64", "int8", "int32", "int64", "uint8"]:
            for count in [7, 1023, BIG]:
                rng = np.random.default_rng([seed_base, rank, count, len(dtype)])
                if dtype.startswith("float"):
                    x = rng.standard_normal(count).astype(dtype)
                    op_list = [SUM, AVERAGE]
                else:
                    x = rng.integers(-50 if dtype[0] == "i" else 0, 50, size=count).astype(dtype)
                    op_list = [SUM, PRODUCT, MAX]
                for op in op_list if count != BIG else op_list[:1]:
                    out[(dtype, count, op)] = adapter.allreduce(x.copy(), op, 1.0, 1.0, f"r.{dtype}.{count}.{op}",
                                                                inplace=True)
        # Adasum keeps its own path (the global backend's point-to-point) either way; on CPU it
        # needs a power-of-two number of ranks.
        if basics.size() & (basics.size() - 1) == 0:
            x = np.random.default_rng([seed_base, rank, 5]).standard_normal(4099).astype(np.float32)
            ops.wait(ops.allreduce_async([x], [x], ["r.adasum"], 2))
            out["adasum"] = x
        return out, _stats(core)
    finally:
        basics.shutdown()


@pytest.mark.parametrize("np_,hosts", [(4, 2), (6, 3)], ids=["2x2", "3x2"])
def test_flat_and_hierarchical_agree(np_, hosts):
    flat = run_ranks(np_, _random_allreduces, 7, hosts=hosts, timeout=300)
    hier = run_ranks(np_, _random_allreduces, 7, env=HIER, hosts=hosts, timeout=300)
    for (f, fstats), (h, hstats) in zip(flat, hier, strict=True):
        assert not fstats["hierarchical"] and fstats["hierarchical_allreduces"] == 0
        assert hstats["hierarchical_allreduce"] and hstats["hierarchical_allreduces"] > 0
        assert f.keys() == h.keys()
        for key in f:
            a, b = f[key], h[key]
            assert a.dtype == b.dtype and a.shape == b.shape, key
            if a.dtype.kind in "iu":
                np.testing.assert_array_equal(a, b, err_msg=str(key))
            else:
                # Sums in a different order: equal up to rounding.
                tol = {"float16": 2e-2, "float32": 1e-4, "float64": 1e-10}[str(a.dtype)]
                np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=tol,
                                           atol=tol * np_, err_msg=str(key))
    # Every rank of a job ends with the same values.
    for job in (flat, hier):
        for out, _ in job:
            for key in out:
                np.testing.assert_array_equal(out[key], job[0][0][key], err_msg=str(key))


def _small_job():
    """A few allreduces and allgathers, a process set, and the engine stats."""
    from horovod_testing.collectives import SUM, assert_equal, rank_input, reference_allreduce
    basics, ops, adapter, core = _init()
    rank, size = basics.rank(), basics.size()
    try:
        for count in [1, 7, 100_001]:
            x = rank_input(rank, "int32", (count,), salt=3)
            result = adapter.allreduce(x, SUM, 1.0, 1.0, f"s.{count}", inplace=False)
            expected = reference_allreduce([rank_input(r, "int32", (count,), salt=3) for r in range(size)], SUM,
                                           1.0, 1.0, "int32")
            assert_equal(result, expected, "int32", f"allreduce x{count}")
        rows = [(r * 5) % 3 + 1 for r in range(size)]
        gathered = adapter.allgather(rank_input(rank, "float64", (rows[rank], 3), salt=4), "s.gather")
        expected = np.concatenate([rank_input(r, "float64", (rows[r], 3), salt=4) for r in range(size)])
        assert_equal(gathered, expected, "float64", "allgather")
        # Process sets are created through the global backend (Split) and run flat.
        evens = adapter.add_process_set([r for r in range(size) if r % 2 == 0])
        if rank % 2 == 0:
            members = [r for r in range(size) if r % 2 == 0]
            x = rank_input(rank, "int64", (9,), salt=5)
            result = adapter.allreduce(x, SUM, 1.0, 1.0, "s.set", inplace=False, process_set=evens)
            expected = reference_allreduce([rank_input(r, "int64", (9,), salt=5) for r in members], SUM, 1.0, 1.0,
                                           "int64")
            assert_equal(result, expected, "int64", "process set allreduce")
        adapter.remove_process_set(evens)
        return _stats(core)
    finally:
        basics.shutdown()


def test_stats_say_which_path_ran():
    # Unset: two hosts, flat, and no hierarchical communicators built at all.
    for stats in run_ranks(4, _small_job, hosts=2, env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"}):
        assert stats["hosts"] == 2 and not stats["shared_memory"]
        assert not stats["hierarchical"] and not stats["hierarchical_allreduce"]
        assert stats["hierarchical_allreduces"] == 0 and stats["hierarchical_allgathers"] == 0
    # Allreduce only.
    for stats in run_ranks(4, _small_job, hosts=2, env={**HIER, "HOROVOD_DYNAMIC_PROCESS_SETS": "1"}):
        assert stats["hierarchical"] and stats["hierarchical_allreduce"] and not stats["hierarchical_allgather"]
        assert stats["hierarchical_allreduces"] == 3 and stats["hierarchical_allgathers"] == 0
    # Allgather only.
    env = {"HOROVOD_HIERARCHICAL_ALLGATHER": "1", "HOROVOD_DYNAMIC_PROCESS_SETS": "1"}
    for stats in run_ranks(4, _small_job, hosts=2, env=env):
        assert stats["hierarchical"] and not stats["hierarchical_allreduce"] and stats["hierarchical_allgather"]
        assert stats["hierarchical_allreduces"] == 0 and stats["hierarchical_allgathers"] == 1


def test_one_host_keeps_shared_memory():
    # The same HOROVOD_HOSTNAME everywhere (the harness's default): one host, the shared-memory
    # transport, and nothing hierarchical even when asked for.
    env = {**HIER, "HOROVOD_HIERARCHICAL_ALLGATHER": "1", "HOROVOD_DYNAMIC_PROCESS_SETS": "1"}
    for stats in run_ranks(3, _small_job, env=env):
        assert stats["hosts"] == 1 and stats["shared_memory"]
        assert not stats["hierarchical"] and stats["hierarchical_allreduces"] == 0


def test_non_homogeneous_layout_falls_back_to_flat():
    env = {**HIER, "HOROVOD_HIERARCHICAL_ALLGATHER": "1", "HOROVOD_DYNAMIC_PROCESS_SETS": "1"}
    for hosts in ([2, 1], [1, 3, 2]):
        np_ = sum(hosts)
        for stats in run_ranks(np_, _small_job, hosts=hosts, env=env):
            assert stats["hosts"] == len(hosts) and not stats["shared_memory"]
            assert not stats["hierarchical"] and stats["hierarchical_allreduces"] == 0


def _allgather_suite():
    from horovod_testing.collectives import assert_equal, rank_input
    basics, ops, adapter, core = _init()
    rank, size = basics.rank(), basics.size()
    cases = 0
    try:
        # Uneven first dimensions, one rank with none, rows of several shapes; one block of MiBs.
        for dtype in DTYPES:
            for row_shape in [(), (3,), (2, 5)]:
                rows = [(r * 7 + 3) % 5 for r in range(size)]  # includes 0 for some rank at np >= 2
                x = rank_input(rank, dtype, (rows[rank],) + row_shape, salt=cases)
                gathered = adapter.allgather(x, f"g.{dtype}.{len(row_shape)}")
                expected = np.concatenate([rank_input(r, dtype, (rows[r],) + row_shape, salt=cases)
                                           for r in range(size)])
                assert_equal(gathered, expected, dtype, f"allgather {dtype} rows {rows} x {row_shape}")
                cases += 1
        rows = [40_000 + 1001 * r for r in range(size)]
        x = rank_input(rank, "float32", (rows[rank], 7), salt=1)
        gathered = adapter.allgather(x, "g.big")
        expected = np.concatenate([rank_input(r, "float32", (rows[r], 7), salt=1) for r in range(size)])
        assert_equal(gathered, expected, "float32", "large allgather")
        cases += 1
        return cases, _stats(core)
    finally:
        basics.shutdown()


@pytest.mark.parametrize("np_,hosts", LAYOUTS, ids=LAYOUT_IDS)
def test_hierarchical_allgather_matches_reference(np_, hosts):
    env = {"HOROVOD_HIERARCHICAL_ALLGATHER": "1"}
    results = run_ranks(np_, _allgather_suite, env=env, hosts=hosts, timeout=300)
    for cases, stats in results:
        assert stats["hierarchical_allgather"] and not stats["hierarchical_allreduce"]
        assert stats["hierarchical_allgathers"] == cases


# Autotune: only the hierarchical stages are left to search (fusion, cycle time and the cache are
# fixed), on a short schedule.

def _train_until_tuned(max_steps=3000):
    from horovod.common import _core, ops
    from horovod.common.basics import HorovodBasics
    basics = HorovodBasics()
    basics.init()
    rank, size = basics.rank(), basics.size()
    try:
        for step in range(max_steps):
            outs = []
            for i, n in enumerate([5, 4000, 70_001]):
                x = np.full(n, rank + 1 + step % 3, dtype=np.float32)
                out = np.empty_like(x)
                outs.append((ops.allreduce_async([x], [out], [f"grad.{i}"], 1), out))
            for h, out in outs:
                ops.wait(h)
                np.testing.assert_array_equal(out, np.float32(size * (size + 1) / 2 + size * (step % 3)))
            flag = np.array([1 if _core.tuned_parameters()["tuning"] else 0], dtype=np.int32)
            ops.wait(ops.allreduce_async([flag], [flag], ["still_tuning"], 4))
            if flag[0] == 0:
                return dict(_core.tuned_parameters()), _stats(_core)
        raise AssertionError(f"autotune still running after {max_steps} steps")
    finally:
        basics.shutdown()


def _autotune_env(log, **fixed):
    env = {"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": log, "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "1",
           "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "2", "HOROVOD_FUSION_THRESHOLD": str(64 * 1024 * 1024),
           "HOROVOD_CYCLE_TIME": "1", "HOROVOD_CACHE_CAPACITY": "1024", "HOROVOD_LOG_LEVEL": "info"}
    env.update(fixed)
    return env


def test_autotune_tries_both_hierarchical_values(tmp_path):
    log = str(tmp_path / "autotune.csv")
    results = run_ranks(4, _train_until_tuned, env=_autotune_env(log), hosts=2, timeout=300)
    rows = read_log(log)
    # The initial configuration, hierarchical allreduce off and on, hierarchical allgather off and
    # on (from the better allreduce value), then the chosen configuration.
    assert len(rows) == 6, rows
    assert [r["flags"][0] for r in rows[1:3]] == [0, 1]
    assert [r["flags"][1] for r in rows[3:5]] == [0, 1]
    assert rows[3]["flags"][0] == rows[4]["flags"][0]
    *scored, final = rows
    params = [p for p, _ in results]
    for p, stats in results:
        assert p == params[0]  # every rank ends with the same parameters
        assert p["tuning"] is False
        assert [p["hierarchical_allreduce"], p["hierarchical_allgather"]] == [bool(v) for v in final["flags"][:2]]
        # The switches in force are the chosen ones, and the hierarchical path really ran.
        assert stats["hierarchical_allreduce"] == p["hierarchical_allreduce"]
        assert stats["hierarchical_allgather"] == p["hierarchical_allgather"]
        assert stats["hierarchical_allreduces"] > 0
    assert final["flags"][:2] in [r["flags"][:2] for r in scored]


def test_autotune_leaves_a_fixed_hierarchical_switch_alone(tmp_path):
    log = str(tmp_path / "autotune.csv")
    env = _autotune_env(log, HOROVOD_HIERARCHICAL_ALLREDUCE="1")
    results = run_ranks(4, _train_until_tuned, env=env, hosts=2, timeout=300)
    rows = read_log(log)
    assert len(rows) == 4, rows  # initial, allgather off and on, chosen
    assert all(r["flags"][0] == 1 for r in rows)
    assert [r["flags"][1] for r in rows[1:3]] == [0, 1]
    for p, stats in results:
        assert p["hierarchical_allreduce"] is True and stats["hierarchical_allreduce"]


def test_autotune_on_one_host_does_not_search_hierarchical(tmp_path):
    log = str(tmp_path / "autotune.csv")
    results = run_ranks(2, _train_until_tuned, env=_autotune_env(log), timeout=300)
    rows = read_log(log)
    assert all(r["flags"][:2] == [0, 0] for r in rows)
    for _, stats in results:
        assert not stats["hierarchical"]
