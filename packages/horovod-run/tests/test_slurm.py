"""Slurm (issue 39): the allocation horovod.runner.util.slurm reads, and horovodrun inside a real
Slurm allocation on the test bed, its ranks started by srun.

The bed's Slurm mode (``ci/testbed.sh slurm-up``, the ``slurm_testbed`` module fixture) runs a
real slurmctld at 198.18.0.254 and a real slurmd on hosts hvd-h1 and hvd-h2 (2 CPUs each), brought
up once for this module and stopped at its end. ``salloc`` and ``sbatch`` are run from the root
namespace like a login node; the launcher there reads the allocation and starts one srun step.
After every test, conftest checks that nothing of the job is left on the hosts.
"""

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
        "slurm_step": os.environ.get("SLURM_STEP_ID"), "iface": os.environ.get("HOROVOD_GLOO_IFACE"),
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
    # sbatch --wait polls at 2, 8 then 32 s: poll scontrol instead.
    deadline = time.monotonic() + JOB_TIMEOUT_S
    state = ""
    while time.monotonic() < deadline:
        shown = _run(slurm_bed, ["scontrol", "-o", "show", "job", job], tmp_path, timeout=30).stdout
        state = re.search(r"JobState=(\S+)", shown).group(1) if "JobState=" in shown else "GONE"
        if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            break
        time.sleep(0.5)
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


def test_scancel_stops_every_rank_on_every_node(slurm_bed, tmp_path):
    worker = tmp_path / "looping.py"
    worker.write_text(LOOPING_WORKER)
    proc = subprocess.Popen(["salloc", "-N2", "--ntasks-per-node=2", *HOROVODRUN, "--gloo", sys.executable,
                             str(worker)],
                            env=slurm_bed.slurm_env(), cwd=tmp_path, stdin=subprocess.DEVNULL,
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
        jobs = _run(slurm_bed, ["squeue", "-h", "-o", "%i"], tmp_path, timeout=30).stdout.split()
        assert len(jobs) == 1, jobs
        cancelled = time.monotonic()
        assert _run(slurm_bed, ["scancel", jobs[0]], tmp_path, timeout=30).returncode == 0
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode != 0, "".join(lines) + rest
        for rank, pid in pids.items():
            while pathlib.Path("/proc/%d" % pid).exists() and time.monotonic() - cancelled < 10:
                time.sleep(0.1)
            assert not pathlib.Path("/proc/%d" % pid).exists(), "rank %d (PID %d) still runs" % (rank, pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


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
