"""horovodrun --mpi end to end: a real mpirun starts the workers on the local host.

Tests that only need ``mpirun`` pretend the core was built with MPI (the launcher's decision
is all they exercise); the Horovod job tests need horovod-core's MPI backend and are skipped
without it.
"""

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

from horovod.runner import launch, mpi_run

LAUNCH_TIMEOUT_S = 180
EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / "docs" / "examples"

needs_mpirun = pytest.mark.skipif(
    mpi_run._get_mpi_implementation() not in (mpi_run._OMPI_IMPL, mpi_run._MPICH_IMPL),
    reason="needs Open MPI's or MPICH's mpirun on PATH")
needs_mpi_core = pytest.mark.skipif(
    not launch.mpi_built(), reason="needs horovod-core built with its MPI backend")

# horovodrun with the core's answer to "was MPI built?" replaced by True.
FAKE_MPI_BUILT = textwrap.dedent("""
    import sys
    from horovod.runner import launch
    launch.mpi_built = lambda verbose=False: True
    sys.argv[0] = "horovodrun"
    launch.run_commandline()
""")

ENV_WORKER = textwrap.dedent("""
    import json, os
    keys = ["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
            "HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS", "HOROVOD_FUSION_THRESHOLD",
            "HOROVOD_RANK", "FORWARDED_BY_NAME"]
    print("RESULT " + json.dumps({k: os.environ.get(k) for k in keys}), flush=True)
""")

FAILING_WORKER = textwrap.dedent("""
    import os, sys, time
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK")))
    if rank == 1:
        sys.exit(3)
    time.sleep(60)
""")

FUNCTION_MODE = textwrap.dedent("""
    import os
    from horovod.runner import launch, run
    launch.mpi_built = lambda verbose=False: True
    def fn():
        return int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK"))) * 10
    print("RESULTS", run(fn, num_proc=2, use_mpi=True))
    def failing():
        raise KeyError("boom")
    try:
        run(failing, num_proc=2, use_mpi=True)
    except RuntimeError as e:
        print("FAILED", e)
""")

HOROVOD_WORKER = textwrap.dedent("""
    import numpy as np
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics

    hvd = HorovodBasics()
    hvd.init()
    x = np.full(5, hvd.rank() + 1, dtype=np.float32)
    handle = ops.allreduce_async([x], [x], ["allreduce.x"], hvd.Sum)
    ops.wait(handle)
    print("rank %d size %d local %d/%d mpi %s gloo %s sum %s" % (
        hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.mpi_enabled(),
        hvd.gloo_enabled(), x.tolist()), flush=True)
    hvd.shutdown()
""")


def _script(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _run(argv, env=None, **kwargs):
    # PYTHONUNBUFFERED=1 is kept if the caller has it: horovodrun must drop it under Open MPI,
    # whose --tag-output would otherwise split every printed line in two.
    return subprocess.run(argv, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S,
                          env=env, **kwargs)


def _horovodrun_fake_mpi(tmp_path, args, **kwargs):
    return _run([sys.executable, _script(tmp_path, "horovodrun.py", FAKE_MPI_BUILT)] + args,
                **kwargs)


def _rank_lines(output):
    """``{rank: [line, ...]}`` from mpirun's tagged output (``[1,r]<stdout>:`` or ``[r]``)."""
    lines = {}
    for line in output.splitlines():
        match = re.match(r"\[(?:\d+,)?(\d+)\]<stdout>:\s?(.*)$", line)
        if match:
            lines.setdefault(int(match.group(1)), []).append(match.group(2))
    return lines


@needs_mpirun
def test_mpi_launch_environment(tmp_path):
    worker = _script(tmp_path, "w.py", ENV_WORKER)
    env = dict(os.environ, FORWARDED_BY_NAME="yes", HOROVOD_CONTROLLER="gloo",
               HOROVOD_CPU_OPERATIONS="gloo", PYTHONUNBUFFERED="1")
    run = _horovodrun_fake_mpi(tmp_path, ["-np", "2", "--mpi", "--fusion-threshold-mb", "2",
                                          sys.executable, worker], env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = _rank_lines(run.stdout)
    assert sorted(lines) == [0, 1], run.stdout
    for rank, rank_lines in lines.items():
        result = json.loads(rank_lines[0][len("RESULT "):])
        assert (result["OMPI_COMM_WORLD_RANK"] or result["PMI_RANK"]) == str(rank)
        assert result["HOROVOD_CONTROLLER"] == "mpi"
        assert result["HOROVOD_CPU_OPERATIONS"] == "mpi"
        assert result["HOROVOD_FUSION_THRESHOLD"] == str(2 * 1024 * 1024)
        assert result["FORWARDED_BY_NAME"] == "yes"
        assert result["HOROVOD_RANK"] is None


@needs_mpirun
def test_mpi_launch_is_the_default_when_mpi_is_built(tmp_path):
    worker = _script(tmp_path, "w.py", ENV_WORKER)
    run = _horovodrun_fake_mpi(tmp_path, ["-np", "2", "--verbose", sys.executable, worker])
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.search(r"^mpirun .* -np 2 -H localhost:2 ", run.stdout, re.MULTILINE), run.stdout
    assert sorted(_rank_lines(run.stdout)) == [0, 1]


@needs_mpirun
def test_failed_rank_fails_the_job(tmp_path):
    worker = _script(tmp_path, "w.py", FAILING_WORKER)
    run = _horovodrun_fake_mpi(tmp_path, ["-np", "2", "--mpi", sys.executable, worker])
    # mpirun stops the other rank (which would sleep 60 s) and exits non-zero.
    assert run.returncode != 0, run.stdout + run.stderr


@needs_mpirun
def test_mpi_args_reach_mpirun(tmp_path):
    run = _horovodrun_fake_mpi(tmp_path, ["-np", "1", "--mpi", "--mpi-args=--no-such-mpirun-flag",
                                          "true"])
    assert run.returncode != 0
    assert "no-such-mpirun-flag" in run.stdout + run.stderr


@needs_mpirun
def test_function_mode(tmp_path):
    run = _run([sys.executable, _script(tmp_path, "f.py", FUNCTION_MODE)], cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "RESULTS [0, 10]" in run.stdout, run.stdout + run.stderr
    assert "FAILED mpirun failed with exit code" in run.stdout, run.stdout + run.stderr


@needs_mpirun
@needs_mpi_core
@pytest.mark.parametrize("controller_flags", [["--mpi"], []])
def test_horovod_job_over_mpi(tmp_path, controller_flags):
    worker = _script(tmp_path, "w.py", HOROVOD_WORKER)
    run = _run([sys.executable, "-m", "horovod.runner.launch", "-np", "2"] + controller_flags
               + [sys.executable, worker])
    assert run.returncode == 0, run.stdout + run.stderr
    lines = _rank_lines(run.stdout)
    for rank in range(2):
        assert lines[rank] == ["rank %d size 2 local %d/2 mpi True gloo False sum %s"
                               % (rank, rank, [3.0] * 5)], run.stdout


# mpi4py first: MPI_Init under horovodrun's mpirun loads the system's libnl into the process before
# the core's own copy (vendored through Gloo's libibverbs) is loaded.
MPI4PY_FIRST_WORKER = textwrap.dedent("""
    from mpi4py import MPI
    import numpy as np
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics

    hvd = HorovodBasics()
    hvd.init()
    x = np.full(3, hvd.rank() + 1, dtype=np.float32)
    ops.wait(ops.allreduce_async([x], [x], ["allreduce.x"], hvd.Sum))
    print("rank %d horovod %s mpi4py %d" % (hvd.rank(), x.tolist(), MPI.COMM_WORLD.allreduce(hvd.rank() + 1)),
          flush=True)
    hvd.shutdown()
""")


@needs_mpirun
@needs_mpi_core
def test_job_importing_mpi4py_first_exits_cleanly(tmp_path):
    # It used to crash at exit (SIGSEGV in libnl's rtnl_tc_unregister, exit status 139) after the
    # work was done: ci/bind_vendored_libs.py.
    worker = _script(tmp_path, "w.py", MPI4PY_FIRST_WORKER)
    run = _run([sys.executable, "-m", "horovod.runner.launch", "--mpi", "-np", "2", sys.executable, worker])
    assert run.returncode == 0, run.stdout + run.stderr
    lines = _rank_lines(run.stdout)
    for rank in range(2):
        assert lines[rank] == [f"rank {rank} horovod [3.0, 3.0, 3.0] mpi4py 3"], run.stdout


@needs_mpirun
@needs_mpi_core
def test_digits_example_over_mpi(tmp_path):
    import sklearn  # noqa: F401  (the example's data; nox's horovod-run session installs it)
    import torch  # noqa: F401
    run = _run([sys.executable, "-m", "horovod.runner.launch", "--mpi", "-np", "2",
                sys.executable, str(EXAMPLES / "pytorch" / "pytorch_digits.py"), "--epochs", "3",
                "--checkpoint", str(tmp_path / "digits.pt")])
    assert run.returncode == 0, run.stdout + run.stderr
    rank0 = _rank_lines(run.stdout)[0]
    assert any("parameters identical on all 2 ranks" in line for line in rank0), run.stdout
    accuracy = float(re.fullmatch(r"test accuracy: (\d\.\d+)", rank0[-1]).group(1))
    # Three epochs (of the example's ten) reach about 0.9; the Gloo launch prints the same lines.
    assert accuracy >= 0.85, run.stdout
