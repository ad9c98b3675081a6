"""The MPI backend (spec core.md §7): processes started by mpirun use MPI for negotiation and
collectives. The shared collective, process-set and join suites run under `mpirun -np 2/3/4`
(oversubscribed on small machines), plus mpi4py interplay: hvd.init(comm=...), process sets from
communicators."""

import json
import os
import shutil
import subprocess
import sys

import pytest

JOB = os.path.join(os.path.dirname(__file__), "mpi_job.py")


def mpirun(np_, suite, tmp_path, env=None, timeout=300):
    """Runs mpi_job.py's `suite` on np_ ranks; returns the per-rank results (raises on errors)."""
    assert shutil.which("mpirun"), "mpirun not found: install Open MPI (ci/install-system-deps.sh does)"
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    child_env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                      "OMPI_MCA_btl_vader_single_copy_mechanism": "none", "PYTHONUNBUFFERED": "1"})
    child_env.update(env or {})
    cmd = ["mpirun", "-np", str(np_), "--oversubscribe", "--bind-to", "none", sys.executable, JOB, suite,
           str(tmp_path)]
    proc = subprocess.run(cmd, env=child_env, capture_output=True, text=True, timeout=timeout)
    results = []
    for rank in range(np_):
        path = tmp_path / f"rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote no result (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        outcome = json.loads(path.read_text())
        assert "ok" in outcome, f"rank {rank} failed:\n{outcome['error']}\n{proc.stderr[-3000:]}"
        results.append(outcome["ok"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return results


def test_mpi_is_built():
    from horovod.common import _core
    assert "mpi" in _core.built_backends(), _core.plugin_error("mpi")


@pytest.mark.parametrize("np_", [2, 3])
def test_topology_from_mpi(np_, tmp_path):
    results = mpirun(np_, "basics", tmp_path)
    for rank, r in enumerate(results):
        assert r == {"rank": rank, "size": np_, "local_rank": rank, "local_size": np_, "cross_rank": 0,
                     "cross_size": 1, "mpi_enabled": True, "mpi_built": True, "threads": True,
                     "gloo_enabled": False}, r


def test_mpi_threads_disable(tmp_path):
    results = mpirun(2, "basics", tmp_path, env={"HOROVOD_MPI_THREADS_DISABLE": "1"})
    assert [r["threads"] for r in results] == [False, False]


def test_gloo_can_be_forced_under_mpirun(tmp_path):
    # Without a rendezvous service Gloo can only run one process per job: np=1.
    results = mpirun(1, "basics", tmp_path, env={"HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo"})
    assert results[0]["gloo_enabled"] and not results[0]["mpi_enabled"]


@pytest.mark.parametrize("np_", [1, 2, 3, 4])
def test_collective_suite_over_mpi(np_, tmp_path):
    results = mpirun(np_, "collectives", tmp_path, timeout=400)
    for counts in results:
        assert counts == results[0]
        assert counts["check_allreduce"] >= 700 and counts["check_alltoall"] > 0, counts


@pytest.mark.parametrize("np_", [3, 4])
def test_process_sets_over_mpi(np_, tmp_path):
    results = mpirun(np_, "process_sets", tmp_path, env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"})
    for counts in results:
        assert counts["registry"] == 8 and counts["concurrent"] == 40, counts


def test_static_process_sets_over_mpi(tmp_path):
    for counts in mpirun(3, "static_process_sets", tmp_path):
        assert counts["registry"] == 6, counts


@pytest.mark.parametrize("np_", [2, 3])
def test_join_over_mpi(np_, tmp_path):
    results = mpirun(np_, "join", tmp_path)
    for rank, (last, cases, _) in enumerate(results):
        assert last == np_ - 1, results
        assert cases == 4 * 2 * rank + 1 + (5 if rank else 0), (rank, cases)
    assert len({second for _, _, second in results}) == 1 and results[0][2] in range(1, np_), results


def test_init_with_mpi4py_sub_communicators(tmp_path):
    results = mpirun(4, "split_comm", tmp_path)
    # Ranks 0, 2 form one job and 1, 3 the other; each sums its own world ranks.
    assert results == [{"size": 2, "rank": 0, "sum": 2.0}, {"size": 2, "rank": 0, "sum": 4.0},
                       {"size": 2, "rank": 1, "sum": 2.0}, {"size": 2, "rank": 1, "sum": 4.0}]


def test_init_with_a_list_of_ranks(tmp_path):
    results = mpirun(3, "rank_list", tmp_path)
    assert results[0] == {"size": 2, "rank": 0, "sum": 3.0} and results[1] == {"size": 2, "rank": 1, "sum": 3.0}
    assert "not one of those ranks" in results[2]["error"]


def test_process_set_from_mpi4py_communicator(tmp_path):
    results = mpirun(3, "comm_process_set", tmp_path)
    for rank, r in enumerate(results):
        assert r["ranks"] == [0, 2] and r["id"] == 1, r
        if rank % 2 == 0:
            assert r["sum"] == 2.0 and r["comm_id"] == 1, r


def test_mpi_requested_but_not_built(tmp_path):
    # A copy of the installed package without the MPI plugin stands for a build without MPI.
    import horovod.common
    source = os.path.dirname(os.path.dirname(horovod.common.__file__))
    shutil.copytree(source, tmp_path / "horovod", ignore=shutil.ignore_patterns("_mpi_backend*", "__pycache__"))
    # The libraries `auditwheel repair` vendored (Gloo...) lie beside the package, where the core's
    # RPATH ($ORIGIN/../../horovod_core.libs) looks for them.
    libs = os.path.join(os.path.dirname(source), "horovod_core.libs")
    if os.path.isdir(libs):
        shutil.copytree(libs, tmp_path / "horovod_core.libs")
    script = ("from horovod.common.basics import HorovodBasics\n"
              "hvd = HorovodBasics()\n"
              "print('mpi_built', hvd.mpi_built())\n"
              "hvd.init()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    env.update({"PYTHONPATH": str(tmp_path), "HOROVOD_CONTROLLER": "mpi", "HOROVOD_CPU_OPERATIONS": "mpi"})
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert proc.returncode != 0
    assert "mpi_built False" in proc.stdout, proc.stdout
    assert "MPI was requested" in proc.stderr and "no usable MPI backend" in proc.stderr, proc.stderr


def test_gloo_under_a_multi_process_mpirun_is_an_error(tmp_path):
    with pytest.raises(AssertionError) as info:
        mpirun(2, "basics", tmp_path, env={"HOROVOD_CPU_OPERATIONS": "gloo"})
    assert "horovodrun --gloo" in str(info.value), info.value


def test_hierarchical_over_mpi(tmp_path):
    # Two fake hosts (HOROVOD_HOSTNAME set from the MPI rank) of two ranks: the local and cross
    # communicators are MPI_Comm_split sub-communicators, with shared memory within each host.
    env = {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "HOROVOD_HIERARCHICAL_ALLGATHER": "1"}
    for result in mpirun(4, "hierarchical", tmp_path, env=env):
        stats = result["stats"]
        assert stats["hosts"] == 2 and stats["hierarchical"] and stats["hierarchical_shared_memory"]
        assert stats["hierarchical_allreduces"] == result["cases"] and stats["hierarchical_allgathers"] == 1
