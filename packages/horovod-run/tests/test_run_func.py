"""horovod.runner.run (function mode): real worker processes running a pickled function."""

import warnings

import pytest

import horovod
from horovod.runner import run


def test_results_by_rank():
    offset = 10

    def fn(scale, shift=0):
        import os
        return int(os.environ["HOROVOD_RANK"]) * scale + shift + offset

    assert run(fn, args=(2,), kwargs={"shift": 1}, num_proc=3, use_gloo=True) == [11, 13, 15]


def test_horovod_run_is_runner_run():
    assert horovod.run is run


def test_failing_function_fails_the_job(capfd):
    def fn():
        import os
        if os.environ["HOROVOD_RANK"] == "1":
            raise KeyError("boom")
        return "ok"

    with pytest.raises(RuntimeError, match="one or more processes exited with non-zero status"):
        run(fn, num_proc=2, use_gloo=True)
    err = capfd.readouterr().err
    assert "[1]<stderr>:The function run by horovod.run raised KeyError: 'boom'" in err


def test_deprecated_np_alias():
    with pytest.warns(DeprecationWarning, match="num_proc"):
        assert run(lambda: 5, np=1) == [5]


def test_conflicting_arguments():
    with pytest.raises(ValueError, match="hosts or hostfile"):
        run(lambda: None, hosts="localhost:1", hostfile="hosts.txt")
    with pytest.raises(ValueError, match="use_gloo or use_mpi"):
        run(lambda: None, use_gloo=True, use_mpi=True)


def test_single_interface_is_not_deprecated():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert run(lambda: 1, num_proc=1, network_interface="lo") == [1]
