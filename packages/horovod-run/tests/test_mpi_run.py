"""The mpirun command horovodrun builds (runner.md §5.4) and the controller choice (§5.2).

No MPI is needed: ``mpirun --version``, ``os.execve`` and the shell are replaced by mocks.
"""

import os
import re
import sys
from unittest import mock

import pytest

from horovod.runner import launch, mpi_run as mpi_mod
from horovod.runner.common.util import config_parser, secret
from horovod.runner.common.util import settings as hvd_settings
from horovod.runner.mpi_run import (
    _IMPI_IMPL, _MISSING_IMPL, _MPICH_IMPL, _OMPI_IMPL, _SMPI_IMPL, _UNKNOWN_IMPL,
    _get_mpi_implementation, _get_mpi_implementation_flags, mpi_run)

OMPI_VERSION = "mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n"
MPICH_VERSION = "HYDRA build details:\n    Version:                                 4.0\n"
SMPI_VERSION = "mpirun (IBM Spectrum MPI) 10.4.0.0\n"
IMPI_VERSION = "Intel(R) MPI Library for Linux* OS, Version 2021.5 Build 20211102\n"

OMPI_BINDING = "-bind-to none -map-by slot"
OMPI_FLAGS = "-mca pml ob1 -mca btl ^openib"


def _settings(**kwargs):
    values = dict(verbose=0, num_proc=2, hosts="localhost:2", run_func_mode=True)
    values.update(kwargs)
    return hvd_settings.Settings(**values)


def _impl(version_output, rc=0):
    return mock.patch.object(mpi_mod.tiny_shell_exec, "execute",
                             return_value=(version_output, rc))


def _run_and_capture(settings, nics, env, command, version_output=OMPI_VERSION):
    """Run mpi_run in function mode with a fake MPI; return (command line, environment)."""
    with _impl(version_output), \
            mock.patch.object(mpi_mod.safe_shell_exec, "execute", return_value=0) as execute:
        mpi_run(settings, nics, env, command)
    execute.assert_called_once()
    return execute.call_args.args[0], execute.call_args.kwargs["env"]


@pytest.mark.parametrize("output, rc, expected", [
    (OMPI_VERSION, 0, _OMPI_IMPL),
    ("mpirun (OpenRTE) 2.1.1\n", 0, _OMPI_IMPL),
    (SMPI_VERSION, 0, _SMPI_IMPL),
    (MPICH_VERSION, 0, _MPICH_IMPL),
    ("MPICH Version: 3.3\n", 0, _MPICH_IMPL),
    (IMPI_VERSION, 0, _IMPI_IMPL),
    ("some other mpirun 1.0\n", 0, _UNKNOWN_IMPL),
    (OMPI_VERSION, 127, _MISSING_IMPL),
])
def test_implementation_detection(output, rc, expected, capsys):
    with _impl(output, rc):
        assert _get_mpi_implementation() == expected
        assert mpi_mod.mpi_available() == (expected not in (_UNKNOWN_IMPL, _MISSING_IMPL))
    if expected == _UNKNOWN_IMPL:
        assert "some other mpirun 1.0" in capsys.readouterr().err


def test_implementation_missing_when_shell_fails():
    with mock.patch.object(mpi_mod.tiny_shell_exec, "execute", return_value=None):
        assert _get_mpi_implementation() == _MISSING_IMPL
        assert _get_mpi_implementation_flags(False) == (None, None, None)


@pytest.mark.parametrize("output, tcp, expected", [
    (OMPI_VERSION, False, (["-mca pml ob1", "-mca btl ^openib"],
                           ["-bind-to none", "-map-by slot"], _OMPI_IMPL)),
    (SMPI_VERSION, False, ([], ["-bind-to socket", "-map-by socket", "-rank-by core"],
                           _SMPI_IMPL)),
    (SMPI_VERSION, True, (["-tcp"], ["-bind-to socket", "-map-by socket", "-rank-by core"],
                          _SMPI_IMPL)),
    (MPICH_VERSION, False, ([], ["-bind-to none", "-map-by slot"], _MPICH_IMPL)),
    (IMPI_VERSION, False, ([], [], _IMPI_IMPL)),
    ("who knows\n", False, (None, None, None)),
])
def test_implementation_flags(output, tcp, expected):
    with _impl(output):
        assert _get_mpi_implementation_flags(tcp) == expected


def test_open_mpi_minimal_command():
    command, _ = _run_and_capture(_settings(), None, {}, ["cmd"])
    assert command == ("mpirun --allow-run-as-root --tag-output -np 2 -H localhost:2 "
                       + OMPI_BINDING + " " + OMPI_FLAGS + "       cmd")


def test_mocked_implementation_flags_are_used_unchanged():
    # The compat tests patch _get_mpi_implementation_flags with fixed lists and no impl name.
    flags, binding = ["--mock-mpi-impl-flags"], ["--mock-mpi-binding-args"]
    with mock.patch.object(mpi_mod, "_get_mpi_implementation_flags",
                           return_value=(flags, binding, None)), \
            mock.patch.object(mpi_mod.safe_shell_exec, "execute", return_value=0) as execute:
        mpi_run(_settings(prefix_output_with_timestamp=True), None, {}, ["cmd"])
    assert execute.call_args.args[0] == (
        "mpirun --allow-run-as-root --tag-output -np 2 -H localhost:2 --mock-mpi-binding-args "
        "--mock-mpi-impl-flags --timestamp-output       cmd")
    assert flags == ["--mock-mpi-impl-flags"]


def test_open_mpi_full_command():
    settings = _settings(num_proc=4, hosts="host1:2,host2:2", ssh_port=1022,
                         ssh_identity_file="/id", output_filename="/out",
                         extra_mpi_args="-mca plm_base_verbose 5 --report-bindings",
                         binding_args="-bind-to core -map-by numa",
                         prefix_output_with_timestamp=True)
    env = {"HOROVOD_FUSION_THRESHOLD": "1048576", "A_VAR": "1", "OLDPWD": "/",
           "CUDA_VISIBLE_DEVICES": "0", "BASH_FUNC_f%%": "() { :; }",
           secret.HOROVOD_SECRET_KEY: "00"}
    command, _ = _run_and_capture(settings, ["eth0"], env, ["python", "train.py", "--lr", "0.1 2"])
    assert command == (
        "mpirun --allow-run-as-root --tag-output -np 4 -H host1:2,host2:2 "
        "-bind-to core -map-by numa " + OMPI_FLAGS + " --timestamp-output "
        '-mca plm_rsh_args "-p 1022 -i /id" -mca btl_tcp_if_include eth0 '
        "-x NCCL_SOCKET_IFNAME=eth0 --output-filename /out -x A_VAR -x HOROVOD_FUSION_THRESHOLD "
        "-mca plm_base_verbose 5 --report-bindings python train.py --lr '0.1 2'")


def test_open_mpi_large_cluster_and_oversubscription():
    hosts = ",".join("h%d:1" % i for i in range(64))
    command, _ = _run_and_capture(_settings(num_proc=64, hosts=hosts), None, {}, ["cmd"])
    assert (OMPI_FLAGS + " -mca plm_rsh_no_tree_spawn true -mca plm_rsh_num_concurrent 64 "
            in command)
    assert "--oversubscribe" not in command
    command, _ = _run_and_capture(_settings(num_proc=3, hosts="localhost:2"), None, {}, ["cmd"])
    assert " -np 3 -H localhost:2 " + OMPI_BINDING + " " + OMPI_FLAGS + " --oversubscribe " \
        in command


def test_mpich_command():
    settings = _settings(num_proc=4, hosts="host1:2,host2:2", ssh_port=1022,
                         output_filename="/out", extra_mpi_args="-v",
                         binding_args="-bind-to core", prefix_output_with_timestamp=True)
    command, run_env = _run_and_capture(settings, ["eth0"], {"A_VAR": "1"}, ["cmd"],
                                        version_output=MPICH_VERSION)
    # Hydra forwards the whole environment itself; user binding args are for Open MPI only.
    assert command == (
        "mpirun -l -np 4 -ppn 2 -hosts host1,host2 " + OMPI_BINDING + "  "
        '-bootstrap=ssh -bootstrap-exec-args "-p 1022"  -genv NCCL_SOCKET_IFNAME=eth0 '
        "-outfile-pattern /out  -v cmd")
    assert run_env["A_VAR"] == "1"


def test_intel_mpi_command_and_limits():
    command, _ = _run_and_capture(_settings(hosts="host1:1,host2:1"), ["ib0"], {}, ["cmd"],
                                  version_output=IMPI_VERSION)
    assert command == ("mpirun -l -np 2 -ppn 1 -hosts host1,host2    -iface ib0 "
                       "-genv NCCL_SOCKET_IFNAME=ib0    cmd")
    with pytest.raises(Exception, match="different slots"):
        _run_and_capture(_settings(num_proc=3, hosts="host1:1,host2:2"), None, {}, ["cmd"],
                         version_output=IMPI_VERSION)
    with pytest.raises(Exception, match="one network interface"):
        _run_and_capture(_settings(), ["ib0", "eth0"], {}, ["cmd"], version_output=IMPI_VERSION)


def test_spectrum_mpi_tcp_flag():
    command, _ = _run_and_capture(_settings(tcp_flag=True), None, {}, ["cmd"],
                                  version_output=SMPI_VERSION)
    assert command == ("mpirun --allow-run-as-root --tag-output -np 2 -H localhost:2 "
                       "-bind-to socket -map-by socket -rank-by core -tcp       cmd")


def test_env_must_be_a_dict():
    with pytest.raises(Exception, match="^env argument must be a dict, not <class 'os._Environ'>: "):
        mpi_run(_settings(), None, os.environ, ["cmd"])


def test_no_mpi_found():
    with _impl("", 127), pytest.raises(Exception, match="could not find a supported MPI"):
        mpi_run(_settings(), None, {}, ["cmd"])


def test_function_mode_failure_names_exit_code():
    with _impl(OMPI_VERSION), \
            mock.patch.object(mpi_mod.safe_shell_exec, "execute", return_value=1):
        with pytest.raises(RuntimeError, match="^mpirun failed with exit code 1$"):
            mpi_run(_settings(), None, {}, ["cmd"])


def test_command_mode_replaces_the_process(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/from/driver")
    with _impl(OMPI_VERSION), mock.patch.object(mpi_mod.os, "execve") as execve:
        mpi_run(_settings(run_func_mode=False, key=b"k" * 32), None,
                {"PATH": "/usr/bin", "A": "1"}, ["cmd"])
    path, argv, run_env = execve.call_args.args
    assert path == "/bin/sh" and argv[:2] == ["/bin/sh", "-c"]
    assert argv[2].startswith("mpirun --allow-run-as-root --tag-output -np 2 -H localhost:2 ")
    assert argv[2].endswith(" -x A -x PATH  cmd")
    assert run_env == {"PATH": "/usr/bin", "A": "1", "PYTHONPATH": "/from/driver"}


def test_verbose_prints_the_command(capsys):
    command, _ = _run_and_capture(_settings(verbose=2), None, {}, ["cmd"])
    assert capsys.readouterr().out == command + "\n"


# Controller choice (runner.md §5.2).

def _choose(use_gloo=False, use_mpi=False, use_jsrun=False, mpi=True, gloo=True, lsf=False,
            jsrun=False):
    chosen = []
    with mock.patch.object(launch, "mpi_built", return_value=mpi), \
            mock.patch.object(launch, "gloo_built", return_value=gloo), \
            mock.patch.object(launch, "is_jsrun_installed", return_value=jsrun), \
            mock.patch.dict(os.environ, {"LSB_JOBID": "1"} if lsf else {}):
        if not lsf:
            os.environ.pop("LSB_JOBID", None)
        launch.run_controller(use_gloo, lambda: chosen.append("gloo"), use_mpi,
                              lambda: chosen.append("mpi"), use_jsrun,
                              lambda: chosen.append("jsrun"), 0)
        gloo_used = launch.is_gloo_used(use_gloo, use_mpi, use_jsrun)
    return chosen, gloo_used


def test_controller_defaults_to_mpi_when_built():
    assert _choose() == (["mpi"], False)
    assert _choose(mpi=False) == (["gloo"], True)
    assert _choose(lsf=True, jsrun=True) == (["jsrun"], False)
    assert _choose(use_gloo=True) == (["gloo"], True)
    assert _choose(use_mpi=True) == (["mpi"], False)


@pytest.mark.parametrize("kwargs, message", [
    (dict(use_mpi=True, mpi=False), r"^MPI support has not been built\.  If this is not expected"),
    (dict(use_jsrun=True, mpi=False), r"^MPI support has not been built\."),
    (dict(use_jsrun=True), r"^Horovod did not detect an LSF job\."),
    (dict(use_gloo=True, gloo=False), r"^Gloo support has not been built\.  If this is not"),
    (dict(mpi=False, gloo=False), r"^Neither MPI nor Gloo support has been built\."),
])
def test_controller_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _choose(**kwargs)


def test_horovodrun_mpi_when_not_built_fails_clearly(monkeypatch, capsys):
    monkeypatch.setattr(launch, "mpi_built", lambda verbose=False: False)
    monkeypatch.setattr(sys, "argv", ["horovodrun", "-np", "2", "--mpi", "true"])
    with mock.patch.object(mpi_mod, "mpi_run") as mpi_run_mock, pytest.raises(SystemExit) as exit:
        launch.run_commandline()
    assert exit.value.code == 1
    mpi_run_mock.assert_not_called()
    err = capsys.readouterr().err
    assert re.search(r"horovodrun: error: MPI support has not been built\..*--gloo", err), err


def test_launch_job_gives_mpi_workers_the_mpi_controller(monkeypatch):
    monkeypatch.setattr(launch, "mpi_built", lambda verbose=False: True)
    monkeypatch.setenv("HOROVOD_CONTROLLER", "gloo")
    monkeypatch.setenv("HOROVOD_CPU_OPERATIONS", "gloo")
    args = launch.parse_args(["-np", "2", "--fusion-threshold-mb", "4", "--mpi-args=-v",
                              "--binding-args=-bind-to core", "python", "x.py"])
    args.hosts = "localhost:2"
    monkeypatch.setenv(secret.HOROVOD_SECRET_KEY, "00")
    settings = _settings(run_func_mode=False, extra_mpi_args=args.mpi_args,
                         binding_args=args.binding_args, key=b"k" * 32)
    with mock.patch.object(mpi_mod, "mpi_run") as mpi_run_mock:
        launch._launch_job(args, settings, ["lo"], "127.0.0.1", args.command)
    (called_settings, nics, env, command), _ = mpi_run_mock.call_args
    assert called_settings is settings and nics == ["lo"] and command == ["python", "x.py"]
    assert env["HOROVOD_CONTROLLER"] == "mpi"
    assert env["HOROVOD_CPU_OPERATIONS"] == "mpi"
    assert env[config_parser.HOROVOD_FUSION_THRESHOLD] == str(4 * 1024 * 1024)
    assert settings.extra_mpi_args == "-v" and settings.binding_args == "-bind-to core"
    assert secret.HOROVOD_SECRET_KEY not in env


@pytest.mark.parametrize("version, kept", [(OMPI_VERSION, False), (MPICH_VERSION, True)])
def test_python_output_buffering_under_open_mpi(version, kept):
    with _impl(version):
        env = launch._mpi_worker_env({"PYTHONUNBUFFERED": "1"}, _settings())
    assert ("PYTHONUNBUFFERED" in env) == kept


def test_function_mode_secret_travels_in_the_environment_only():
    key = secret.make_secret_key()
    env = launch._mpi_worker_env({"A": "1"}, _settings(key=key))
    assert env[secret.HOROVOD_SECRET_KEY] == key.hex()
    command, run_env = _run_and_capture(_settings(key=key), None, env, ["cmd"])
    assert run_env[secret.HOROVOD_SECRET_KEY] == key.hex()
    assert key.hex() not in command and secret.HOROVOD_SECRET_KEY not in command
