"""The variables the launcher writes for its workers: engine knobs, named after the engine's knob
table (horovod.common.knobs), or launcher variables that the docs describe; none spelled outside
horovod.runner.common.util.env_names; the same names without a loadable core."""

import ast
import json
import pathlib
import re
import subprocess
import sys
import types

import horovod.runner
from horovod.common import knobs
from horovod.runner import gloo_run, launch
from horovod.runner.common.util import config_parser, env_names
from horovod.runner.common.util.hosts import SlotInfo

REPO = pathlib.Path(__file__).resolve().parents[3]
SOURCES = pathlib.Path(horovod.runner.__file__).resolve().parents[1]  # the installed horovod/ of horovod-run

# Every tuning argument that set_env_from_args reads, set, and autotune and the timeline on.
ALL_TUNING = dict(
    fusion_threshold_mb=1, cycle_time_ms=2, cache_capacity=3, hierarchical_allreduce=True,
    hierarchical_allgather=False, torus_allreduce=True, autotune=True, autotune_log_file="a.csv",
    autotune_warmup_samples=1, autotune_steps_per_sample=2, autotune_bayes_opt_max_samples=3,
    autotune_gaussian_process_noise=0.5, timeline_filename="t.json", timeline_mark_cycles=True,
    no_stall_check=False, stall_check_warning_time_seconds=5, stall_check_shutdown_time_seconds=6,
    deadlock_timeout_seconds=2.5,
    mpi_threads_disable=True, num_nccl_streams=2, tcp_flag=True, thread_affinity=1,
    gloo_timeout_seconds=7, log_level="INFO", log_with_timestamp=False)


def _written_names():
    """name -> where: every variable the launcher's environment builders write."""
    written = {}
    tuning = config_parser.set_env_from_args({}, types.SimpleNamespace(**ALL_TUNING))
    written.update(dict.fromkeys(tuning, "config_parser.set_env_from_args"))
    slot = SlotInfo("host-a", 1, 0, 1, 2, 1, 2)
    run_vars = gloo_run.create_run_env_vars("198.18.0.254", ["hvdbr0", "lo"], 1234, elastic=True)
    worker = gloo_run.create_worker_env({}, slot, run_vars, **{env_names.ELASTIC_TIMEOUT: "600",
                                                              env_names.SECRET_KEY: "00"})
    written.update(dict.fromkeys(worker, "gloo_run.create_worker_env"))
    mpi = launch._mpi_worker_env({}, types.SimpleNamespace(run_func_mode=True, key=bytes(32)))
    written.update(dict.fromkeys(mpi, "launch._mpi_worker_env"))
    return written, tuning


def test_every_written_name_is_an_engine_knob_or_a_launcher_variable():
    assert env_names.CHECKED_AGAINST_ENGINE
    engine = knobs.table()
    written, tuning = _written_names()
    unknown = {name: where for name, where in written.items()
               if name not in engine and name not in env_names.LAUNCHER_VARIABLES}
    assert not unknown, f"written but neither an engine knob nor a launcher variable: {unknown}"
    # The launcher's own names are not the engine's, and the builders above cover the tuning names.
    assert not env_names.LAUNCHER_VARIABLES & set(engine)
    constants = {v for k, v in vars(config_parser).items() if k.isupper() and isinstance(v, str)
                 and k != "LOG_LEVELS"}
    assert constants <= set(tuning), constants - set(tuning)


def test_names_are_the_knob_tables_rows():
    engine = knobs.table()
    for attribute, name in vars(env_names).items():
        if attribute.isupper() and isinstance(name, str) and name not in env_names.LAUNCHER_VARIABLES:
            assert engine[name].name == name == f"HOROVOD_{attribute}"
    # Upstream's constants keep their values: each is its own name.
    for attribute in ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_LOG_HIDE_TIME"):
        assert getattr(config_parser, attribute) == attribute


def test_launcher_variables_are_documented():
    docs = "".join(p.read_text() for p in sorted((REPO / "docs").glob("*.md")))
    # Named in code style: `NAME` or `NAME=value`.
    undocumented = sorted(n for n in env_names.LAUNCHER_VARIABLES if not re.search(f"`{n}[`=]", docs))
    assert not undocumented, f"launcher variables missing from docs/*.md: {undocumented}"


def test_engine_knob_names_spelled_only_in_env_names():
    """No other module of horovod-run writes an engine knob's name as a string of its own."""
    engine = set(knobs.table())
    spelled = []
    for path in sorted(SOURCES.rglob("*.py")):
        if path.name == "env_names.py" or not any(p in path.parts for p in ("runner", "ray", "spark")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in engine:
                spelled.append(f"{path.relative_to(SOURCES)}:{node.lineno}: {node.value}")
            elif isinstance(node, ast.keyword) and node.arg in engine:
                spelled.append(f"{path.relative_to(SOURCES)}:{node.lineno}: {node.arg}=")
    assert not spelled, "engine knob names spelled outside env_names:\n" + "\n".join(spelled)


_WITHOUT_CORE = """
import json, sys, types
sys.modules["horovod.common._core"] = None  # importing it now raises ImportError, as without a core
from horovod.runner.common.util import config_parser, env_names
from horovod.runner import gloo_run
names = {k: v for k, v in vars(env_names).items() if k.isupper() and isinstance(v, str)}
tuning = config_parser.set_env_from_args({}, types.SimpleNamespace(**json.loads(sys.argv[1])))
print(json.dumps({"checked": env_names.CHECKED_AGAINST_ENGINE, "names": names, "tuning": tuning,
                  "core_loaded": sys.modules.get("horovod.common._core") is not None}))
"""


def test_launcher_without_a_loadable_core_writes_the_same_names():
    out = subprocess.run([sys.executable, "-c", _WITHOUT_CORE, json.dumps(ALL_TUNING)], check=True,
                         capture_output=True, text=True, timeout=120).stdout
    result = json.loads(out)
    assert result["checked"] is False and result["core_loaded"] is False
    checked = {k: v for k, v in vars(env_names).items() if k.isupper() and isinstance(v, str)}
    assert result["names"] == checked
    assert result["tuning"] == config_parser.set_env_from_args({}, types.SimpleNamespace(**ALL_TUNING))
