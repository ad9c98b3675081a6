"""horovodrun argument parsing, config file, validation and the env written from args."""

import warnings

import pytest

from horovod.runner import _HorovodArgs
from horovod.runner.common.util import config_parser
from horovod.runner.launch import parse_args

CONFIG = """\
controller: mpi
params:
  fusion_threshold_mb: 32
  cycle_time_ms: 10
  cache_capacity: 2048
  hierarchical_allreduce: true
  hierarchical_allgather: false
  torus_allreduce: true
autotune:
  enabled: true
  log_file: tune.csv
  warmup_samples: 1
  steps_per_sample: 5
  bayes_opt_max_samples: 10
  gaussian_process_noise: 0.2
timeline:
  filename: tl.json
  mark_cycles: true
stall_check:
  enabled: false
  warning_time_seconds: 120
  shutdown_time_seconds: 240
library_options:
  mpi_threads_disable: true
  num_nccl_streams: 2
  thread_affinity: 1
  gloo_timeout_seconds: 90
logging:
  level: DEBUG
  with_timestamp: true
"""


def test_defaults():
    args = parse_args(["-np", "2", "python", "train.py", "--lr", "0.1"])
    assert args.num_proc == 2
    assert args.command == ["python", "train.py", "--lr", "0.1"]
    assert args.run_func is None and args.executable is None
    for dest in ("fusion_threshold_mb", "cycle_time_ms", "hierarchical_allreduce", "autotune",
                 "no_stall_check", "log_level", "hosts", "nics", "min_num_proc", "cooldown_range"):
        assert getattr(args, dest) is None, dest
    assert args.use_gloo is False and args.use_mpi is False and args.use_jsrun is False
    assert args.prefix_output_with_timestamp is False


def test_every_flag_parses():
    args = parse_args([
        "-np", "4", "--disable-cache", "--start-timeout", "10", "--network-interfaces", "eth0,eth1",
        "--output-filename", "out", "--verbose", "-p", "2222", "-i", "key",
        "--fusion-threshold-mb", "10", "--cycle-time-ms", "20", "--cache-capacity", "100",
        "--hierarchical-allreduce", "--no-hierarchical-allgather", "--torus-allreduce",
        "--autotune", "--autotune-log-file", "a.csv", "--autotune-warmup-samples", "2",
        "--autotune-steps-per-sample", "3", "--autotune-bayes-opt-max-samples", "4",
        "--autotune-gaussian-process-noise", "0.5", "--min-np", "2", "--max-np", "8",
        "--slots-per-host", "4", "--elastic-timeout", "60", "--reset-limit", "3",
        "--blacklist-cooldown-range", "1", "10", "--timeline-filename", "t.json",
        "--timeline-mark-cycles", "--no-stall-check", "--stall-check-warning-time-seconds", "5",
        "--stall-check-shutdown-time-seconds", "9", "--mpi-threads-disable",
        "--mpi-args=-x FOO", "--tcp", "--binding-args", "-bind-to none",
        "--num-nccl-streams", "2", "--thread-affinity", "1", "--gloo-timeout-seconds", "30",
        "--log-level", "INFO", "--log-without-timestamp", "-H", "localhost:4", "--gloo",
        "python", "x.py"])
    assert args.nics == {"eth0", "eth1"}
    assert args.cooldown_range == [1, 10]
    assert args.min_num_proc == 2 and args.max_num_proc == 8 and args.slots == 4
    assert args.no_stall_check is True and args.log_with_timestamp is False
    assert args.tcp_flag is True and args.mpi_args == "-x FOO" and args.use_gloo is True
    assert args.ssh_port == 2222 and args.ssh_identity_file == "key"
    assert {"fusion_threshold_mb", "cycle_time_ms", "no_stall_check",
            "log_with_timestamp"} <= args.override_args


def test_network_interface_repeatable_and_deprecated_comma():
    args = parse_args(["-np", "1", "--network-interface", "eth0", "--network-interface", "ib0",
                       "cmd"])
    assert args.nics == {"eth0", "ib0"}
    with pytest.warns(DeprecationWarning):
        args = parse_args(["-np", "1", "--network-interface", "eth0,eth1", "cmd"])
    assert args.nics == {"eth0", "eth1"}


def test_deprecated_log_hide_timestamp():
    with pytest.warns(DeprecationWarning, match="--log-without-timestamp"):
        args = parse_args(["-np", "1", "--log-hide-timestamp", "cmd"])
    assert args.log_with_timestamp is False


@pytest.mark.parametrize("argv", [
    ["-np", "1", "--gloo", "--mpi", "cmd"],
    ["-np", "1", "-H", "a:1", "--hostfile", "f", "cmd"],
    ["-np", "1", "--hierarchical-allreduce", "--no-hierarchical-allreduce", "cmd"],
    ["-np", "1", "--log-with-timestamp", "--prefix-output-with-timestamp", "cmd"],
    ["-np", "1", "--log-level", "LOUD", "cmd"],
    ["python", "x.py"],
    ["-np", "1"],
    ["-np", "0", "cmd"],
    ["-np", "1", "-H", "badhost", "cmd"],
    ["-np", "1", "--cycle-time-ms", "-1", "cmd"],
])
def test_bad_arguments_exit_with_usage(argv, capsys):
    with pytest.raises(SystemExit) as excinfo:
        parse_args(argv)
    assert excinfo.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_set_env_from_args_spec_example():
    args = parse_args(["-np", "1", "--autotune", "--cache-capacity", "1024",
                       "--no-hierarchical-allgather", "cmd"])
    env = config_parser.set_env_from_args({}, args)
    assert env[config_parser.HOROVOD_CACHE_CAPACITY] == "1024"
    assert env[config_parser.HOROVOD_HIERARCHICAL_ALLGATHER] == "0"
    assert env[config_parser.HOROVOD_AUTOTUNE] == "1"
    for absent in (config_parser.HOROVOD_FUSION_THRESHOLD, config_parser.HOROVOD_CYCLE_TIME,
                   config_parser.HOROVOD_HIERARCHICAL_ALLREDUCE):
        assert absent not in env


def test_set_env_from_args_values_and_overwrite():
    args = parse_args(["-np", "1", "--fusion-threshold-mb", "10", "--cycle-time-ms", "20",
                       "--gloo-timeout-seconds", "7", "--log-level", "TRACE",
                       "--log-without-timestamp", "--tcp", "--no-stall-check",
                       "--timeline-filename", "t.json", "--no-timeline-mark-cycles",
                       "--autotune-log-file", "ignored.csv", "cmd"])
    env = config_parser.set_env_from_args({"HOROVOD_GLOO_TIMEOUT_SECONDS": "1800"}, args)
    assert env == {
        "HOROVOD_FUSION_THRESHOLD": "10485760",
        "HOROVOD_CYCLE_TIME": "20.0",
        "HOROVOD_GLOO_TIMEOUT_SECONDS": "7",
        "HOROVOD_LOG_LEVEL": "TRACE",
        "HOROVOD_LOG_HIDE_TIME": "1",
        "NCCL_IB_DISABLE": "1",
        "HOROVOD_STALL_CHECK_DISABLE": "1",
        "HOROVOD_TIMELINE": "t.json",
        "HOROVOD_TIMELINE_MARK_CYCLES": "0",
    }


def test_unset_args_leave_inherited_env_alone():
    env = config_parser.set_env_from_args({"HOROVOD_GLOO_TIMEOUT_SECONDS": "1800"},
                                          parse_args(["-np", "1", "cmd"]))
    assert env == {"HOROVOD_GLOO_TIMEOUT_SECONDS": "1800"}


def test_set_env_from_horovod_args_bag():
    hargs = _HorovodArgs()
    hargs.cache_capacity = 0
    assert config_parser.set_env_from_args({}, hargs) == {"HOROVOD_CACHE_CAPACITY": "0"}


def test_horovod_args_bag_has_every_parser_dest():
    # _HorovodArgs lists the dests by hand; a flag added to the parser must be added there too.
    from horovod.runner.launch import _make_parser
    dests = {action.dest for action in _make_parser()._actions} - {"help", "version"}
    assert dests <= set(vars(_HorovodArgs()))


def test_config_file_applies_every_section(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    args = parse_args(["-np", "1", "--config-file", str(path), "cmd"])
    assert args.use_mpi is True and args.use_gloo is False
    assert (args.fusion_threshold_mb, args.cycle_time_ms, args.cache_capacity) == (32, 10, 2048)
    assert args.hierarchical_allreduce is True and args.hierarchical_allgather is False
    assert args.autotune is True and args.autotune_log_file == "tune.csv"
    assert args.autotune_gaussian_process_noise == 0.2
    assert args.timeline_filename == "tl.json" and args.timeline_mark_cycles is True
    assert args.no_stall_check is True
    assert args.stall_check_warning_time_seconds == 120
    assert args.stall_check_shutdown_time_seconds == 240
    assert args.mpi_threads_disable is True and args.gloo_timeout_seconds == 90
    assert args.log_level == "DEBUG" and args.log_with_timestamp is True
    env = config_parser.set_env_from_args({}, args)
    assert env["HOROVOD_FUSION_THRESHOLD"] == str(32 * 1024 * 1024)
    assert env["HOROVOD_AUTOTUNE_LOG"] == "tune.csv"
    assert env["HOROVOD_TIMELINE_MARK_CYCLES"] == "1"
    assert env["HOROVOD_STALL_CHECK_DISABLE"] == "1"
    assert env["HOROVOD_LOG_HIDE_TIME"] == "0"


def test_command_line_wins_over_config_file_wherever_it_is(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    args = parse_args(["-np", "1", "--fusion-threshold-mb", "256", "--config-file", str(path),
                       "--cycle-time-ms", "20", "--gloo", "cmd"])
    assert args.fusion_threshold_mb == 256
    assert args.cycle_time_ms == 20
    assert args.cache_capacity == 2048
    assert args.use_gloo is True and args.use_mpi is False


def test_config_file_bad_controller(tmp_path, capsys):
    path = tmp_path / "config.yaml"
    path.write_text("controller: carrier-pigeon\n")
    with pytest.raises(SystemExit):
        parse_args(["-np", "1", "--config-file", str(path), "cmd"])
    assert "carrier-pigeon" in capsys.readouterr().err


def test_config_values_are_validated(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("params:\n  fusion_threshold_mb: -5\n")
    with pytest.raises(SystemExit):
        parse_args(["-np", "1", "--config-file", str(path), "cmd"])


@pytest.mark.parametrize("name", ["fusion_threshold_mb", "cycle_time_ms", "cache_capacity",
                                  "autotune_warmup_samples", "autotune_steps_per_sample",
                                  "autotune_bayes_opt_max_samples",
                                  "stall_check_warning_time_seconds",
                                  "stall_check_shutdown_time_seconds", "deadlock_timeout_seconds",
                                  "num_nccl_streams",
                                  "thread_affinity", "gloo_timeout_seconds"])
def test_validate_negative(name):
    args = _HorovodArgs()
    setattr(args, name, -1)
    with pytest.raises(ValueError, match="%s.*-1" % name):
        config_parser.validate_config_args(args)
    setattr(args, name, 0)
    config_parser.validate_config_args(args)


def test_validate_noise_and_hosts():
    args = _HorovodArgs()
    args.autotune_gaussian_process_noise = 1.5
    with pytest.raises(ValueError, match="autotune_gaussian_process_noise"):
        config_parser.validate_config_args(args)
    args.autotune_gaussian_process_noise = 1.0
    args.hosts = "host-1:2,host_2.example.com:4"
    config_parser.validate_config_args(args)
    args.hosts = "host-1:2,host2"
    with pytest.raises(ValueError, match="name:slots"):
        config_parser.validate_config_args(args)


def test_no_warning_for_plain_flags():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parse_args(["-np", "1", "--network-interfaces", "a,b", "cmd"])
