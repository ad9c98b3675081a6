"""Slurm (issue 39): the allocation horovod.runner.util.slurm reads, and horovodrun inside a real
Slurm allocation on the test bed, its ranks started by srun.

The bed's Slurm mode (``ci/testbed.sh slurm-up``, the ``slurm_testbed`` module fixture) runs a
real slurmctld at 198.18.0.254 and a real slurmd on hosts hvd-h1 and hvd-h2 (2 CPUs each), brought
up once for this module and stopped at its end. ``salloc`` and ``sbatch`` are run from the root
namespace like a login node; the launcher there reads the allocation and starts one srun step.
After every test, conftest checks that nothing of the job is left on the hosts.
"""

import contextlib
import json
import socket
import pathlib
import re
import subprocess
import sys
import textwrap
import time

import pytest

from horovod.runner import launch
from horovod.runner.util import slurm

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / "docs" / "examples"
HOROVODRUN = [sys.executable, "-m", "horovod.runner.launch"]
JOB_TIMEOUT_S = 240
JOB_END_S = 15

# Where each rank runs, its topology, and an allreduce across the nodes against numpy.
TOPOLOGY_WORKER = textwrap.dedent("""
    import json, os, socket
    import numpy as np
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics
    hvd = HorovodBasics()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    x = np.arange(1000, dtype=np.float64) * (rank + 1)
    ops.wait(ops.allreduce_async([x], [x], ["x"], hvd.Sum))
    expected = np.arange(1000, dtype=np.float64) * sum(r + 1 for r in range(size))
    print("RESULT " + json.dumps({
        "rank": rank, "size": size, "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
        "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(),
        "hostname": socket.gethostname(), "slurm_node": os.environ.get("SLURMD_NODENAME"),
        "slurm_job": os.environ.get("SLURM_JOB_ID"), "slurm_step": os.environ.get("SLURM_STEP_ID"),
        "iface": os.environ.get("HOROVOD_GLOO_IFACE"),
        "mpi": hvd.mpi_enabled(), "rendezvous": "%s:%s" % (os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"),
                                                           os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT")),
        "allreduce_ok": bool(np.array_equal(x, expected))}), flush=True)
    hvd.shutdown()
""")

# Allreduces in a loop; rank 3 kills itself with SIGKILL after a few steps.
KILLED_WORKER = textwrap.dedent("""
    import os, signal, time
    import numpy as np
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics
    hvd = HorovodBasics()
    hvd.init()
    step = 0
    while True:
        if hvd.rank() == 3 and step == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        x = np.ones(100)
        ops.wait(ops.allreduce_async([x], [x], ["step%d" % step], hvd.Sum))
        step += 1
        time.sleep(0.01)
""")

# Allocates in a loop until stopped; prints its PID first.
LOOPING_WORKER = textwrap.dedent("""
    import os, time
    import numpy as np
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics
    hvd = HorovodBasics()
    hvd.init()
    print("PID %d %d" % (hvd.rank(), os.getpid()), flush=True)
    step = 0
    while True:
        x = np.ones(100)
        ops.wait(ops.allreduce_async([x], [x], ["step%d" % step], hvd.Sum))
        step += 1
        time.sleep(0.01)
""")


# --- the allocation's variables, as Slurm documents them ---------------------------------------

@pytest.mark.parametrize("expr,hosts", [
    ("node1", ["node1"]),
    ("node1,node2", ["node1", "node2"]),
    ("n[01-03,07],g[1-2]", ["n01", "n02", "n03", "n07", "g1", "g2"]),
    ("tux[0-2]", ["tux0", "tux1", "tux2"]),
    ("lx[8-10]", ["lx8", "lx9", "lx10"]),
    ("lx[08-10]", ["lx08", "lx09", "lx10"]),
    ("rack[1-2]-node[1-2]", ["rack1-node1", "rack1-node2", "rack2-node1", "rack2-node2"]),
    ("a[1,3]b", ["a1b", "a3b"]),
    ("hvd-h[1-2]", ["hvd-h1", "hvd-h2"]),
    ("x[5]", ["x5"]),
])
def test_hostlist_forms(expr, hosts):
    assert slurm.parse_hostlist(expr) == hosts


@pytest.mark.parametrize("expr", ["n[1-2", "n1-2]", "n[2-1]", "n[a-b]", "n1,,n2", "n[[1]]", ""])
def test_hostlist_refuses_malformed(expr):
    with pytest.raises(ValueError):
        slurm.parse_hostlist(expr)


@pytest.mark.parametrize("value,counts", [
    ("2", [2]), ("2(x3),1", [2, 2, 2, 1]), ("1,2,3", [1, 2, 3]), ("4(x1)", [4]),
    ("2(x2),1(x2)", [2, 2, 1, 1]),
])
def test_tasks_per_node_forms(value, counts):
    assert slurm.parse_tasks_per_node(value) == counts


@pytest.mark.parametrize("value", ["2(x)", "x2", "2(3)", "2,,1", "-1"])
def test_tasks_per_node_refuses_malformed(value):
    with pytest.raises(ValueError):
        slurm.parse_tasks_per_node(value)


def test_allocation_from_the_job_variables():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[01-03,07],g[1-2]",
           "SLURM_TASKS_PER_NODE": "2(x3),1(x3)", "SLURM_NTASKS": "9"}
    allocation = slurm.allocation(env)
    assert allocation.hosts_argument() == "n01:2,n02:2,n03:2,n07:1,g1:1,g2:1"
    assert allocation.total_slots == 9
    assert "SLURM_JOB_NODELIST=n[01-03,07],g[1-2]" in allocation.describe()
    # Without a task count: one slot per CPU.
    env = {"SLURM_JOB_ID": "8", "SLURM_JOB_NODELIST": "a[1-2]", "SLURM_JOB_CPUS_PER_NODE": "4(x2)"}
    assert slurm.allocation(env).hosts_argument() == "a1:4,a2:4"
    with pytest.raises(RuntimeError, match="3 node.*2 count"):
        slurm.allocation({"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "a[1-3]",
                          "SLURM_TASKS_PER_NODE": "1(x2)"})
    assert not slurm.in_allocation({"SLURM_JOB_ID": "9"})


# --- on the bed's Slurm cluster ----------------------------------------------------------------

@pytest.fixture
def slurm_bed(slurm_testbed):
    yield slurm_testbed
    # A test's job that outlived it would hold the nodes for the next one; a job that ended is
    # listed (COMPLETING) until its nodes have cleaned up.
    deadline = time.monotonic() + JOB_END_S
    while True:
        jobs = subprocess.run(["squeue", "-h", "-o", "%i %T"], env=slurm_testbed.slurm_env(),
                              capture_output=True, text=True, timeout=30).stdout.splitlines()
        if not jobs or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if jobs:
        subprocess.run(["scancel", *[job.split()[0] for job in jobs]], env=slurm_testbed.slurm_env(),
                       timeout=30)
        pytest.fail("Slurm jobs left %d s after the test (cancelled now): %s" % (JOB_END_S, jobs))


def _run(bed, argv, cwd, timeout=JOB_TIMEOUT_S):
    return subprocess.run(argv, env=bed.slurm_env(), cwd=cwd, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


def _results(stdout):
    results = {}
    for line in stdout.splitlines():
        match = re.match(r"^\[(\d+)\]<stdout>:RESULT (.*)$", line)
        if match:
            results[int(match.group(1))] = json.loads(match.group(2))
    return results


def _bare_results(stdout):
    """RESULT lines of tasks that srun ran directly (no launcher prefix), by their rank."""
    results = [json.loads(line[len("RESULT "):]) for line in stdout.splitlines() if line.startswith("RESULT ")]
    return {r["rank"]: r for r in results}


def _wait_job(bed, job, cwd, timeout=JOB_TIMEOUT_S):
    """The final state of job ``job`` (polled with scontrol: sbatch --wait polls at 2, 8 then 32 s)."""
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        shown = _run(bed, ["scontrol", "-o", "show", "job", job], cwd, timeout=30).stdout
        state = re.search(r"JobState=(\S+)", shown).group(1) if "JobState=" in shown else "GONE"
        if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            break
        time.sleep(0.5)
    return state


def test_bed_runs_a_step_on_both_nodes(slurm_bed, tmp_path):
    run = _run(slurm_bed, ["srun", "-N2", "-n4", "sh", "-c", "echo $(hostname) $SLURM_PROCID"], tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert sorted(run.stdout.split("\n")[:-1]) == ["hvd-h1 0", "hvd-h1 1", "hvd-h2 2", "hvd-h2 3"], run.stdout


def test_horovodrun_in_salloc_places_ranks_on_the_allocated_nodes(slurm_bed, tmp_path):
    worker = tmp_path / "topology.py"
    worker.write_text(TOPOLOGY_WORKER)
    run = _run(slurm_bed, ["salloc", "-N2", "--ntasks-per-node=2", *HOROVODRUN, "--gloo", "--verbose",
                           "--output-filename", "logs", sys.executable, str(worker)], tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    # Each node wrote its ranks' raw output into the directory named relative to the launcher.
    for rank in range(4):
        assert (tmp_path / "logs" / ("rank.%d" % rank) / "stdout").read_text().startswith("RESULT "), rank
    assert re.search(r"Hosts from the Slurm allocation: Slurm job \d+ has 4 slot\(s\) on 2 node\(s\): "
                     r"hvd-h1:2,hvd-h2:2 \(from SLURM_JOB_NODELIST=hvd-h\[1-2\], "
                     r"SLURM_TASKS_PER_NODE=2\(x2\)\)", run.stdout), run.stdout
    assert "srun --nodes=2 --ntasks=4" in run.stdout and "ssh" not in run.stdout, run.stdout
    results = _results(run.stdout)
    assert sorted(results) == [0, 1, 2, 3], run.stdout
    for rank, r in results.items():
        node = 1 + rank // 2
        assert r["hostname"] == r["slurm_node"] == "hvd-h%d" % node, r
        assert (r["size"], r["local_size"], r["cross_size"]) == (4, 2, 2), r
        assert (r["local_rank"], r["cross_rank"]) == (rank % 2, node - 1), r
        assert r["slurm_step"] is not None and r["iface"] == "hvdbr0", r
        assert r["allreduce_ok"], r


def test_horovodrun_mpi_in_salloc_starts_mpirun_within_the_allocation(slurm_bed, tmp_path):
    if not launch.mpi_built():
        pytest.skip("horovod-core was built without MPI")
    worker = tmp_path / "topology.py"
    worker.write_text(TOPOLOGY_WORKER)
    run = _run(slurm_bed, ["salloc", "-N2", "--ntasks-per-node=2", *HOROVODRUN, "--mpi",
                           sys.executable, str(worker)], tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    # Open MPI's mpirun starts its daemons on the nodes with srun: the ranks run in a Slurm step.
    results = _results(re.sub(r"^\[1,(\d+)\]", r"[\1]", run.stdout, flags=re.M))
    assert sorted(results) == [0, 1, 2, 3], run.stdout
    for rank, r in results.items():
        assert r["hostname"] == "hvd-h%d" % (1 + rank // 2) and r["local_rank"] == rank % 2, r
        assert r["slurm_step"] is not None and r["allreduce_ok"], r


def test_fewer_ranks_than_slots_use_the_first_nodes(slurm_bed, tmp_path):
    worker = tmp_path / "topology.py"
    worker.write_text(TOPOLOGY_WORKER)
    run = _run(slurm_bed, ["salloc", "-N2", "--ntasks-per-node=2", *HOROVODRUN, "--gloo", "-np", "3",
                           sys.executable, str(worker)], tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    results = _results(run.stdout)
    assert [results[r]["hostname"] for r in range(3)] == ["hvd-h1", "hvd-h1", "hvd-h2"], run.stdout
    assert all(r["allreduce_ok"] and r["size"] == 3 for r in results.values()), run.stdout


def test_too_small_an_allocation_is_refused(slurm_bed, tmp_path):
    run = _run(slurm_bed, ["salloc", "-N1", "--ntasks-per-node=2", *HOROVODRUN, "-np", "4",
                           sys.executable, "-c", "print('ran')"], tmp_path)
    assert run.returncode != 0
    assert "ran" not in run.stdout
    assert re.search(r"-np 4 is more than the allocation holds: Slurm job \d+ has 2 slot\(s\) on 1 "
                     r"node\(s\): hvd-h\d:2", run.stderr), run.stderr


def test_killed_rank_ends_the_step_naming_rank_and_node(slurm_bed, tmp_path):
    worker = tmp_path / "killed.py"
    worker.write_text(KILLED_WORKER)
    start = time.monotonic()
    run = _run(slurm_bed, ["salloc", "-N2", "--ntasks-per-node=2", *HOROVODRUN, "--gloo",
                           sys.executable, str(worker)], tmp_path)
    assert run.returncode != 0, run.stdout + run.stderr
    assert "Process name: 3\nExit code: 137 (SIGKILL)\nHost: hvd-h2" in run.stderr, run.stderr
    assert time.monotonic() - start < 60, run.stderr


def test_digits_example_trains_in_an_sbatch_job(slurm_bed, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    script = tmp_path / "job.sh"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        #SBATCH --nodes=2 --ntasks-per-node=2 --output={tmp_path}/job.out
        exec {" ".join(HOROVODRUN)} --gloo {sys.executable} {EXAMPLES / "pytorch" / "pytorch_digits.py"} \\
            --checkpoint {tmp_path / "digits.pt"}
        """))
    submitted = _run(slurm_bed, ["sbatch", "--parsable", str(script)], tmp_path, timeout=30)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    state = _wait_job(slurm_bed, job, tmp_path)
    output = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert state == "COMPLETED", "job %s: %s\n%s" % (job, state, output)
    rank0 = [line[len("[0]<stdout>:"):] for line in output.splitlines() if line.startswith("[0]<stdout>:")]
    assert any("parameters identical on all 4 ranks" in line for line in rank0), output
    accuracy = float(re.fullmatch(r"test accuracy: (\d\.\d+)", rank0[-1]).group(1))
    assert accuracy >= 0.95, output


def test_explicit_hosts_win_over_the_allocation(slurm_bed, tmp_path):
    run = _run(slurm_bed, ["salloc", "-N1", *HOROVODRUN, "--gloo", "--verbose", "-np", "2", "-H", "localhost:2",
                           sys.executable, "-c", "import os; print('ON', os.uname().nodename, "
                           "os.environ.get('SLURM_STEP_ID'))"], tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Slurm allocation" not in run.stdout and "srun" not in run.stdout, run.stdout
    # Started by the launcher itself, outside any Slurm step.
    assert run.stdout.count("ON %s None" % socket.gethostname()) == 2, run.stdout


@contextlib.contextmanager
def _looping_job(bed, tmp_path, *salloc_args):
    """salloc ... horovodrun --gloo looping.py on 2 nodes x 2 ranks; yields (process, {rank: PID},
    output lines so far) once every rank printed its PID; kills salloc if it still runs at the end."""
    worker = tmp_path / "looping.py"
    worker.write_text(LOOPING_WORKER)
    proc = subprocess.Popen(["salloc", "-N2", "--ntasks-per-node=2", *salloc_args, *HOROVODRUN, "--gloo",
                             sys.executable, str(worker)],
                            env=bed.slurm_env(), cwd=tmp_path, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        pids, lines = {}, []
        for line in proc.stdout:
            lines.append(line)
            match = re.match(r"^\[\d+\]<stdout>:PID (\d+) (\d+)$", line.strip())
            if match:
                pids[int(match.group(1))] = int(match.group(2))
            if len(pids) == 4:
                break
        assert len(pids) == 4, "".join(lines)
        yield proc, pids, lines
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _assert_ranks_gone(pids, since, within_s=10):
    for rank, pid in pids.items():
        while pathlib.Path("/proc/%d" % pid).exists() and time.monotonic() - since < within_s:
            time.sleep(0.1)
        assert not pathlib.Path("/proc/%d" % pid).exists(), "rank %d (PID %d) still runs" % (rank, pid)


def test_scancel_stops_every_rank_on_every_node(slurm_bed, tmp_path):
    with _looping_job(slurm_bed, tmp_path) as (proc, pids, lines):
        jobs = _run(slurm_bed, ["squeue", "-h", "-o", "%i"], tmp_path, timeout=30).stdout.split()
        assert len(jobs) == 1, jobs
        cancelled = time.monotonic()
        assert _run(slurm_bed, ["scancel", jobs[0]], tmp_path, timeout=30).returncode == 0
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode != 0, "".join(lines) + rest
        _assert_ranks_gone(pids, cancelled)


def test_time_limit_stops_every_rank_on_every_node(slurm_bed, tmp_path):
    # Slurm counts time limits in minutes: the job runs for one, then Slurm signals its steps.
    started = time.monotonic()
    with _looping_job(slurm_bed, tmp_path, "--time=1") as (proc, pids, lines):
        rest, _ = proc.communicate(timeout=180)
        ended = time.monotonic()
        output = "".join(lines) + rest
        assert proc.returncode != 0, output
        assert "DUE TO TIME LIMIT" in output, output
        assert 55 < ended - started < 150, (ended - started, output)
        _assert_ranks_gone(pids, ended)


def test_function_mode_inside_an_allocation(slurm_bed, tmp_path):
    script = tmp_path / "func.py"
    script.write_text(textwrap.dedent("""
        import socket
        import horovod.runner

        def where():
            import os
            return (int(os.environ["HOROVOD_RANK"]), socket.gethostname(), os.environ.get("SLURM_STEP_ID"))

        print("RESULTS", horovod.runner.run(where, num_proc=4, use_gloo=True))
    """))
    run = _run(slurm_bed, ["salloc", "-N2", "--ntasks-per-node=2", sys.executable, str(script)], tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    line = [line for line in run.stdout.splitlines() if line.startswith("RESULTS ")][-1]
    results = eval(line[len("RESULTS "):])  # noqa: S307 - a list of tuples printed by the test's own script
    assert [(rank, host) for rank, host, _ in results] == [
        (0, "hvd-h1"), (1, "hvd-h1"), (2, "hvd-h2"), (3, "hvd-h2")], run.stdout
    assert all(step is not None for _, _, step in results), results


# --- srun with no launcher: hvd.init() reads the step ------------------------------------------

def _bare_env(bed, home, **extra):
    """The bed's client environment without any Horovod variable of this process, HOME=``home``."""
    env = {k: v for k, v in bed.slurm_env().items()
           if not k.startswith(("HOROVOD_", "_HOROVOD_")) or k.startswith("HOROVOD_TESTBED")}
    env["HOME"] = str(home)
    env.update(extra)
    return env


def _assert_bare_topology(results, output, mpi):
    assert sorted(results) == [0, 1, 2, 3], output
    for rank, r in results.items():
        node = 1 + rank // 2
        assert r["hostname"] == r["slurm_node"] == "hvd-h%d" % node, r
        assert (r["size"], r["local_size"], r["cross_size"]) == (4, 2, 2), r
        assert (r["local_rank"], r["cross_rank"]) == (rank % 2, node - 1), r
        assert r["mpi"] is mpi and r["allreduce_ok"], r


def test_bare_srun_meets_at_rank_0_on_the_first_node(slurm_bed, tmp_path):
    worker = tmp_path / "topology.py"
    worker.write_text(TOPOLOGY_WORKER)
    home = tmp_path / "home"
    home.mkdir()
    srun = ["srun", "-N2", "-n4", "--kill-on-bad-exit=1", sys.executable, str(worker)]

    # The secret: created by rank 0 in the (shared) home, private; the port: from job and step.
    run = subprocess.run(srun, env=_bare_env(slurm_bed, home), cwd=tmp_path, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    assert run.returncode == 0, run.stdout + run.stderr
    results = _bare_results(run.stdout)
    _assert_bare_topology(results, run.stdout + run.stderr, mpi=False)
    job, step = int(results[0]["slurm_job"]), int(results[0]["slurm_step"])
    port = 21000 + (31 * job + step) % 9000
    for rank, r in results.items():
        assert r["rendezvous"] == ("127.0.0.1:%d" if rank < 2 else "198.18.0.1:%d") % port, r
    secret_file = home / ".horovod" / "slurm_secret"
    assert secret_file.stat().st_mode & 0o777 == 0o600
    assert re.fullmatch(r"[0-9a-f]{64}\n", secret_file.read_text())

    # The secret from the environment instead, and the port given.
    other_home = tmp_path / "other-home"
    other_home.mkdir()
    env = _bare_env(slurm_bed, other_home, _HOROVOD_SECRET_KEY="ab" * 32, HOROVOD_SLURM_RENDEZVOUS_PORT="23456")
    run = subprocess.run(srun, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=JOB_TIMEOUT_S)
    assert run.returncode == 0, run.stdout + run.stderr
    results = _bare_results(run.stdout)
    _assert_bare_topology(results, run.stdout + run.stderr, mpi=False)
    assert {r["rendezvous"].split(":")[1] for r in results.values()} == {"23456"}
    assert list(other_home.iterdir()) == []

    # A secret file others may read is refused on every rank, which all end at once. Without
    # --kill-on-bad-exit: with it, srun kills the other tasks as soon as the first one fails, and
    # how many got to their own refusal by then depends on the machine's load.
    secret_file.chmod(0o644)
    start = time.monotonic()
    run = subprocess.run([arg for arg in srun if arg != "--kill-on-bad-exit=1"], env=_bare_env(slurm_bed, home),
                         cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=JOB_TIMEOUT_S)
    assert run.returncode != 0
    assert run.stderr.count("may be read by others (mode 644): chmod 600 it") == 4, run.stderr
    assert time.monotonic() - start < 30


def test_bare_srun_with_pmix_runs_the_mpi_controller(slurm_bed, tmp_path):
    if not launch.mpi_built():
        pytest.skip("horovod-core was built without MPI")
    worker = tmp_path / "topology.py"
    worker.write_text(TOPOLOGY_WORKER)
    run = subprocess.run(["srun", "--mpi=pmix", "-N2", "-n4", "--kill-on-bad-exit=1", sys.executable, str(worker)],
                         env=_bare_env(slurm_bed, tmp_path), cwd=tmp_path, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    assert run.returncode == 0, run.stdout + run.stderr
    results = _bare_results(run.stdout)
    _assert_bare_topology(results, run.stdout + run.stderr, mpi=True)
    assert all(r["rendezvous"] == "None:None" for r in results.values()), results
    # Nothing of a rendezvous: no secret file either.
    assert not (tmp_path / ".horovod").exists()


def test_digits_example_trains_by_bare_srun_in_an_sbatch_job(slurm_bed, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    digits = EXAMPLES / "pytorch" / "pytorch_digits.py"
    lines = ["#!/bin/sh", "#SBATCH --nodes=2 --ntasks-per-node=2 --output=%s/job.out" % tmp_path,
             "export _HOROVOD_SECRET_KEY=$(%s -c 'import secrets; print(secrets.token_hex(32))')" % sys.executable,
             "srun --label %s %s --checkpoint %s/gloo.pt || exit 1" % (sys.executable, digits, tmp_path)]
    if launch.mpi_built():
        lines.append("srun --label --mpi=pmix %s %s --checkpoint %s/mpi.pt || exit 1"
                     % (sys.executable, digits, tmp_path))
    script = tmp_path / "job.sh"
    script.write_text("\n".join(lines) + "\n")
    submitted = _run(slurm_bed, ["sbatch", "--parsable", str(script)], tmp_path, timeout=30)
    assert submitted.returncode == 0, submitted.stderr
    state = _wait_job(slurm_bed, submitted.stdout.strip().split(";")[0], tmp_path)
    output = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert state == "COMPLETED", output
    # Each srun's task 0 (rank 0) says the parameters agree on 4 ranks and ends with the accuracy.
    rank0 = [line[len("0: "):] for line in output.splitlines() if line.startswith("0: ")]
    runs = [i for i, line in enumerate(rank0) if "parameters identical on all 4 ranks" in line]
    assert len(runs) == (2 if launch.mpi_built() else 1), output
    accuracies = [float(m.group(1)) for m in (re.fullmatch(r"test accuracy: (\d\.\d+)", line) for line in rank0) if m]
    assert len(accuracies) == len(runs) and min(accuracies) >= 0.95, output
    assert (tmp_path / "gloo.pt").exists()


# --- elastic inside an allocation -------------------------------------------------------------

def test_elastic_job_keeps_training_when_a_node_is_set_down(slurm_bed, tmp_path):
    pytest.importorskip("torch")
    train = pathlib.Path(__file__).resolve().parent / "elastic_scripts" / "torch_elastic_train.py"
    env = dict(slurm_bed.slurm_env(), STEP_SLEEP="0.2")
    # --no-kill: Slurm keeps the job when one of its nodes fails, and drops that node from it.
    proc = subprocess.Popen(["salloc", "--no-kill", "-N2", "--ntasks-per-node=2", *HOROVODRUN, "--gloo",
                             "--min-np", "2", "--max-np", "4", "--verbose", sys.executable, str(train), "3"],
                            env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        steps_at_4 = 0
        for line in proc.stdout:
            lines.append(line)
            if "STEP " in line and '"size": 4' in line:
                steps_at_4 += 1
            if steps_at_4 >= 12:  # three steps on each of the four ranks
                break
        assert steps_at_4 >= 12, "".join(lines)
        down = _run(slurm_bed, ["scontrol", "update", "nodename=hvd-h2", "state=down", "reason=horovod-test"],
                    tmp_path, timeout=30)
        assert down.returncode == 0, down.stderr
        rest, _ = proc.communicate(timeout=JOB_TIMEOUT_S)
        output = "".join(lines) + rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _run(slurm_bed, ["scontrol", "update", "nodename=hvd-h2", "state=resume"], tmp_path, timeout=30)
        deadline = time.monotonic() + 30
        while slurm_bed.slurm_nodes().get("hvd-h2") != "idle" and time.monotonic() < deadline:
            time.sleep(0.2)
    assert proc.returncode == 0, output
    assert "the Slurm step of worker hvd-h2[0] ended without its exit status: node hvd-h2 failed or was set DOWN" \
        in output or "hvd-h2[1] ended without its exit status" in output, output
    assert "blacklisting host hvd-h2" in output, output
    finals = [json.loads(line.split("FINAL ", 1)[1]) for line in output.splitlines() if "<stdout>:FINAL " in line]
    # The survivors, both on hvd-h1, finished the epochs at size 2 with the same parameters.
    assert sorted((f["rank"], f["size"], f["host"]) for f in finals) == [(0, 2, "hvd-h1"), (1, 2, "hvd-h1")], output
    assert finals[0]["params"] == finals[1]["params"]
    assert max(f["steps"] for f in finals) > 12
    assert slurm_bed.slurm_nodes().get("hvd-h2") == "idle"
