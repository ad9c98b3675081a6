"""horovod.common.slurm: a bare Slurm step's variables as Slurm sets them, read into Horovod's
topology; the rendezvous port and secret. (hvd.init() inside real srun steps is tested on the
test bed's Slurm cluster, horovod-run's tests/test_slurm.py.)"""

import os
import stat
import threading

import pytest

from horovod.common import slurm


def step(node, procid, localid, nodelist="n[1-3]", tasks="2(x2),1", ntasks="5", **extra):
    env = {"SLURM_STEP_NODELIST": nodelist, "SLURM_STEP_TASKS_PER_NODE": tasks, "SLURM_STEP_NUM_TASKS": ntasks,
           "SLURM_PROCID": str(procid), "SLURM_LOCALID": str(localid), "SLURMD_NODENAME": node,
           "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "3"}
    env.update(extra)
    return env


@pytest.mark.parametrize("node,procid,localid,expected", [
    # 2 + 2 + 1 tasks, block distribution: (rank, local_rank, local_size, cross_rank, cross_size)
    ("n1", 0, 0, (0, 0, 2, 0, 3)),
    ("n1", 1, 1, (1, 1, 2, 0, 2)),
    ("n2", 2, 0, (2, 0, 2, 1, 3)),
    ("n2", 3, 1, (3, 1, 2, 1, 2)),
    ("n3", 4, 0, (4, 0, 1, 2, 3)),
])
def test_topology_of_an_uneven_step(node, procid, localid, expected):
    t = slurm.step_topology(step(node, procid, localid))
    assert (t["rank"], t["local_rank"], t["local_size"], t["cross_rank"], t["cross_size"]) == expected
    assert t["size"] == 5 and t["nodes"] == ["n1", "n2", "n3"]


def test_topology_refuses_inconsistent_steps():
    with pytest.raises(ValueError, match="this node, n9 .* is not among its nodes"):
        slurm.step_topology(step("n9", 0, 0))
    with pytest.raises(ValueError, match="3 node\\(s\\), 2 count\\(s\\)"):
        slurm.step_topology(step("n1", 0, 0, tasks="2,3"))
    with pytest.raises(ValueError, match="adding up to 5"):
        slurm.step_topology(step("n1", 0, 0, ntasks="6"))
    with pytest.raises(ValueError, match="SLURM_STEP_NODELIST"):
        env = step("n1", 0, 0)
        del env["SLURM_STEP_NODELIST"]
        slurm.step_topology(env)


def test_only_bare_steps_are_read():
    assert slurm.is_bare_step(step("n1", 0, 0))
    # A launcher described the job; a batch script (no step); srun --mpi=pmix with MPI built.
    assert not slurm.is_bare_step(step("n1", 0, 0, HOROVOD_RANK="0"))
    env = step("n1", 0, 0)
    del env["SLURM_STEP_NUM_TASKS"]
    assert not slurm.is_bare_step(env)
    assert not slurm.is_bare_step(step("n1", 0, 0, PMIX_RANK="0"), mpi_built=True)
    # ... but Gloo under a PMIx launch where MPI is not built, or where Gloo is asked for.
    assert slurm.is_bare_step(step("n1", 0, 0, PMIX_RANK="0"), mpi_built=False)
    assert slurm.is_bare_step(step("n1", 0, 0, PMIX_RANK="0", HOROVOD_CONTROLLER="gloo"), mpi_built=True)


def test_rendezvous_port_from_job_and_step():
    assert slurm.rendezvous_port(step("n1", 0, 0)) == 21000 + (31 * 77 + 3) % 9000
    assert slurm.rendezvous_port(step("n1", 0, 0, SLURM_STEP_ID="4")) == 21000 + (31 * 77 + 4) % 9000
    assert slurm.rendezvous_port(step("n1", 0, 0, HOROVOD_SLURM_RENDEZVOUS_PORT="4242")) == 4242
    for bad in ("0", "70000", "x"):
        with pytest.raises(ValueError, match="HOROVOD_SLURM_RENDEZVOUS_PORT must be a TCP port number"):
            slurm.rendezvous_port(step("n1", 0, 0, HOROVOD_SLURM_RENDEZVOUS_PORT=bad))


def test_secret_file_created_once_and_private(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    # Several hosts creating it at once (a shared home): one secret wins, every reader gets it.
    keys, errors = [], []

    def create():
        try:
            keys.append(slurm.job_secret({}, create=True, timeout_s=5))
        except Exception as e:  # noqa: BLE001 - collected for the assertion
            errors.append(e)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(keys)) == 1 and len(keys[0]) == 32
    path = tmp_path / ".horovod" / "slurm_secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(os.listdir(path.parent)) == ["slurm_secret"]
    assert slurm.job_secret({}, create=False, timeout_s=1) == keys[0]
    # The environment wins over the file.
    assert slurm.job_secret({"_HOROVOD_SECRET_KEY": "cd" * 32}, create=True, timeout_s=1) == b"\xcd" * 32
    path.chmod(0o640)
    with pytest.raises(ValueError, match="may be read by others \\(mode 640\\): chmod 600 it"):
        slurm.job_secret({}, create=False, timeout_s=1)


def test_missing_secret_file_times_out_with_advice(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ValueError, match="did not appear within 0 s.*shared by the nodes.*_HOROVOD_SECRET_KEY"):
        slurm.job_secret({}, create=False, timeout_s=0.3)


def test_single_task_step_needs_no_rendezvous(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    env = step("n1", 0, 0, nodelist="n1", tasks="1", ntasks="1")
    slurm.configure_step(env, timeout_s=1)
    assert (env["HOROVOD_RANK"], env["HOROVOD_SIZE"], env["HOROVOD_HOSTNAME"]) == ("0", "1", "n1")
    assert "HOROVOD_GLOO_RENDEZVOUS_ADDR" not in env and not (tmp_path / ".horovod").exists()
