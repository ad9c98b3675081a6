"""horovodrun --check-build against the installed horovod-core (needs horovod.common.util)."""

import subprocess
import sys

import horovod
from horovod.common import util


def _check_build(*flags):
    return subprocess.run([sys.executable, "-m", "horovod.runner.launch", *flags],
                          capture_output=True, text=True, timeout=60)


def _mark(value):
    return "X" if value else " "


def test_check_build_format():
    run = _check_build("--check-build")
    assert run.returncode == 0, run.stderr
    expected = "\n".join([
        "Horovod v%s:" % horovod.__version__,
        "",
        "Available Frameworks:",
        "    [%s] TensorFlow" % _mark(util.extension_available("tensorflow")),
        "    [%s] PyTorch" % _mark(util.extension_available("torch")),
        "    [%s] MXNet" % _mark(util.extension_available("mxnet")),
        "",
        "Available Controllers:",
        "    [%s] MPI" % _mark(util.mpi_built()),
        "    [%s] Gloo" % _mark(util.gloo_built()),
        "",
        "Available Tensor Operations:",
        "    [%s] NCCL" % _mark(util.nccl_built()),
        "    [%s] DDL" % _mark(util.ddl_built()),
        "    [%s] CCL" % _mark(util.ccl_built()),
        "    [%s] MPI" % _mark(util.mpi_built()),
        "    [%s] Gloo" % _mark(util.gloo_built()),
    ]) + "\n"
    assert run.stdout == expected


def test_short_flag_verbose_leading_blank_line():
    run = _check_build("-cb", "--verbose")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("\nHorovod v")


def test_version():
    run = _check_build("--version")
    assert run.returncode == 0
    assert run.stdout.strip() == horovod.__version__
