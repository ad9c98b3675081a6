"""The flight recorder (HOROVOD_FLIGHT_RECORDER_SIZE / _DIR, hvd.dump_flight_recorder, SIGUSR2;
docs/engine.md): each rank's last operations, written as JSON on a deadlock or mismatch error, a
stall shutdown, a lost peer or on demand, and the analyser (horovod.runner.flight_recorder) naming
the operation where the ranks diverged and who never submitted it."""

import json
import os
import signal
import time

import numpy as np
import pytest

from horovod_testing import run_ranks

FIELDS = {"seq", "process_set", "name", "collective", "dtype", "shape", "bytes", "enqueued_us", "negotiated_us",
          "started_us", "ended_us", "outcome"}


def _allreduce(ops, name, value, set_id=0):
    x = np.array(value, np.float32)
    ops.wait(ops.allreduce_async([x], [x], [name], 1, process_set_id=set_id))
    return x


def _diverging_job(scenario, warm_up_steps, on_subset):
    """Correct steps, then a mistake (``skip``: rank 0 allreduces a tensor the others skip;
    ``operation``: one name as two collectives), then a correct allreduce."""
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics
    from horovod.common.exceptions import HorovodInternalError
    from horovod.common.process_sets import ProcessSet
    basics = HorovodBasics()
    subset = ProcessSet([0, 1])
    basics.init(process_sets=[subset] if on_subset else None)
    rank = basics.rank()
    set_id = subset.process_set_id if on_subset else 0
    error = None
    if not on_subset or rank in (0, 1):
        for step in range(warm_up_steps):
            _allreduce(ops, f"allreduce.step{step}", [step, 1.0], set_id)
        try:
            if scenario == "skip":
                if rank == 0:
                    _allreduce(ops, "allreduce.extra", [1.0], set_id)
                _allreduce(ops, "allreduce.loss", [2.0], set_id)
            else:
                x = np.ones(3, np.float32)
                if rank == 0:
                    ops.wait(ops.allreduce_async([x], [x], ["allreduce.m"], 1, process_set_id=set_id))
                else:
                    ops.wait(ops.allgather_async([x], ["allgather.m"], process_set_id=set_id))
        except HorovodInternalError as e:
            error = str(e)
    after = _allreduce(ops, "allreduce.after", [rank + 1.0]).tolist()
    basics.shutdown()
    return error, after


def _read(directory, rank):
    with open(os.path.join(directory, f"flight_recorder_rank_{rank}.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("np_,on_subset", [(2, False), (3, False), (3, True)], ids=["np2", "np3", "np3-set"])
def test_deadlock_writes_every_rank_and_the_analyser_names_the_divergence(tmp_path, np_, on_subset):
    from horovod.runner import flight_recorder
    directory = tmp_path / "fr"
    env = {"HOROVOD_FLIGHT_RECORDER_DIR": str(directory), "HOROVOD_DEADLOCK_TIMEOUT_SECONDS": "1"}
    steps = 4
    results = run_ranks(np_, _diverging_job, "skip", steps, on_subset, env=env, timeout=120)
    members = [0, 1] if on_subset else list(range(np_))
    set_id = 1 if on_subset else 0
    for rank, (error, after) in enumerate(results):
        assert after == [float(sum(range(1, np_ + 1)))]
        assert (error is not None) == (rank in members), (rank, error)
    # Only the ranks whose operations failed wrote a file (on the error).
    assert sorted(os.listdir(directory)) == [f"flight_recorder_rank_{r}.json" for r in members]
    for rank in members:
        record = _read(directory, rank)
        assert record["format"] == "horovod-flight-recorder" and record["rank"] == rank and record["size"] == np_
        assert record["reason"].startswith("Deadlock"), record["reason"]
        assert record["process_sets"][str(set_id)] == members
        ops_ = [op for op in record["operations"] if op["process_set"] == set_id]
        assert all(FIELDS <= set(op) for op in ops_)
        names = [op["name"] for op in ops_]
        mistake = ["allreduce.extra"] if rank == 0 else ["allreduce.loss"]
        assert names == [f"allreduce.step{s}" for s in range(steps)] + mistake, names
        assert [op["seq"] for op in ops_] == list(range(steps + 1))
        for op in ops_[:steps]:
            assert op["outcome"] == "completed" and op["collective"] == "ALLREDUCE" and op["dtype"] == "float32"
            assert op["shape"] == [2] and op["bytes"] == 8
            assert op["enqueued_us"] <= op["negotiated_us"] <= op["started_us"] <= op["ended_us"]
        assert ops_[-1]["outcome"] == "failed" and ops_[-1]["error"].startswith("Deadlock")
        assert ops_[-1]["negotiated_us"] is not None  # the error response
    lines = flight_recorder.diagnose(flight_recorder.load(directory))
    text = "\n".join(lines)
    assert f"Process set {set_id} (ranks {', '.join(map(str, members))}): the ranks diverged at operation #{steps}" \
        in text, text
    assert "rank 0 (host " in text and "allreduce.extra (ALLREDUCE, float32 [1], failed)" in text, text
    others = members[1:]
    assert f"allreduce.extra was never submitted by rank{'s' if len(others) > 1 else ''} " \
           f"{', '.join(map(str, others))}" in text, text
    assert "allreduce.loss was never submitted by rank 0" in text, text
    if on_subset:
        assert "No file from rank 2" in text, text


def test_mismatch_of_collectives_is_diagnosed(tmp_path):
    from horovod.runner import flight_recorder
    directory = tmp_path / "fr"
    env = {"HOROVOD_FLIGHT_RECORDER_DIR": str(directory)}
    results = run_ranks(2, _diverging_job, "operation", 2, False, env=env, timeout=120)
    assert all(error and "Mismatched operations" in error for error, _ in results), results
    text = "\n".join(flight_recorder.diagnose(flight_recorder.load(directory)))
    assert "diverged at operation #2" in text, text
    assert "allreduce.m (ALLREDUCE, float32 [3], failed)" in text and "allgather.m (ALLGATHER" in text, text
    assert "allreduce.m was never submitted by rank 1" in text and "allgather.m was never submitted by rank 0" in text


def _on_demand(directory, size_env):
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics
    basics = HorovodBasics()
    basics.init()
    out = {}
    for step in range(10):
        _allreduce(ops, f"allreduce.s{step}", [1.0])
    out["path"] = basics.dump_flight_recorder(directory)
    try:
        basics.dump_flight_recorder()  # no HOROVOD_FLIGHT_RECORDER_DIR
        out["no_dir"] = None
    except ValueError as e:
        out["no_dir"] = str(e)
    basics.shutdown()
    return out


def test_on_demand_dump_keeps_the_last_operations(tmp_path):
    directory = tmp_path / "demand"
    results = run_ranks(2, _on_demand, str(directory), None, env={"HOROVOD_FLIGHT_RECORDER_SIZE": "4"}, timeout=120)
    for rank, out in enumerate(results):
        assert out["path"] == str(directory / f"flight_recorder_rank_{rank}.json")
        record = _read(directory, rank)
        assert record["reason"] == "on demand" and record["capacity"] == 4
        assert [op["name"] for op in record["operations"]] == [f"allreduce.s{s}" for s in range(6, 10)]
        assert [op["seq"] for op in record["operations"]] == [6, 7, 8, 9]
        assert all(op["outcome"] == "completed" for op in record["operations"])
        assert "HOROVOD_FLIGHT_RECORDER_DIR" in out["no_dir"]
    from horovod.runner import flight_recorder
    text = "\n".join(flight_recorder.diagnose(flight_recorder.load(directory)))
    assert "No divergence" in text, text


def _recorder_off():
    from horovod.common.basics import HorovodBasics
    basics = HorovodBasics()
    basics.init()
    try:
        basics.dump_flight_recorder(os.environ["TMPDIR"])
        return None
    except ValueError as e:
        return str(e)
    finally:
        basics.shutdown()


def test_size_zero_turns_it_off():
    results = run_ranks(1, _recorder_off, env={"HOROVOD_FLIGHT_RECORDER_SIZE": "0"}, timeout=60)
    assert "HOROVOD_FLIGHT_RECORDER_SIZE=0" in results[0]


def _signalled(directory):
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics
    basics = HorovodBasics()
    basics.init()
    _allreduce(ops, "allreduce.before_signal", [1.0])
    os.kill(os.getpid(), signal.SIGUSR2)
    path = os.path.join(directory, f"flight_recorder_rank_{basics.rank()}.json")
    deadline = time.monotonic() + 30
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)  # the handler runs in this (main) thread between bytecodes
    basics.shutdown()
    return path


def test_sigusr2_writes_it(tmp_path):
    directory = tmp_path / "sig"
    results = run_ranks(2, _signalled, str(directory), env={"HOROVOD_FLIGHT_RECORDER_DIR": str(directory)},
                        timeout=60)
    for rank, path in enumerate(results):
        record = _read(directory, rank)
        assert path.endswith(f"flight_recorder_rank_{rank}.json")
        assert record["reason"] == "signal SIGUSR2"
        assert [op["name"] for op in record["operations"]] == ["allreduce.before_signal"]


def _lose_a_peer():
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics
    from horovod.common.exceptions import HorovodInternalError
    basics = HorovodBasics()
    basics.init()
    _allreduce(ops, "allreduce.ok", [1.0])
    if basics.rank() == 1:
        os._exit(0)  # dies without shutting Horovod down
    try:
        for i in range(1000):
            _allreduce(ops, f"allreduce.more{i}", [1.0])
        return None
    except HorovodInternalError as e:
        return str(e)


def test_lost_peer_writes_it(tmp_path):
    directory = tmp_path / "lost"
    from horovod_testing import RanksFailed
    env = {"HOROVOD_FLIGHT_RECORDER_DIR": str(directory), "HOROVOD_GLOO_TIMEOUT_SECONDS": "10"}
    with pytest.raises(RanksFailed):  # rank 1 returns no result
        run_ranks(2, _lose_a_peer, env=env, timeout=120)
    record = _read(directory, 0)
    assert "lost" in record["reason"], record["reason"]
    assert record["operations"][0]["name"] == "allreduce.ok" and record["operations"][0]["outcome"] == "completed"
    assert record["operations"][-1]["outcome"] == "failed"
    from horovod.runner import flight_recorder
    text = "\n".join(flight_recorder.diagnose(flight_recorder.load(directory)))
    assert "No file from rank 1" in text, text


def _stalled():
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics
    from horovod.common.exceptions import HorovodInternalError
    basics = HorovodBasics()
    basics.init()
    _allreduce(ops, "allreduce.first", [1.0])
    if basics.rank() == 1:
        time.sleep(8)  # computing, never submitting what rank 0 waits on
        return None
    try:
        _allreduce(ops, "allreduce.stalled", [1.0])
        return None
    except HorovodInternalError as e:
        return str(e)


def test_stall_shutdown_writes_it(tmp_path):
    from horovod.runner import flight_recorder
    directory = tmp_path / "stall"
    env = {"HOROVOD_FLIGHT_RECORDER_DIR": str(directory), "HOROVOD_STALL_CHECK_TIME_SECONDS": "1",
           "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "2"}
    results = run_ranks(2, _stalled, env=env, timeout=120)
    assert "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS" in results[0]
    record = _read(directory, 0)
    assert "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS" in record["reason"], record["reason"]
    assert [(op["name"], op["outcome"]) for op in record["operations"]] == [
        ("allreduce.first", "completed"), ("allreduce.stalled", "failed")]
    text = "\n".join(flight_recorder.diagnose(flight_recorder.load(directory)))
    # Rank 1's engine stopped on the same verdict and wrote its record too.
    assert "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS" in _read(directory, 1)["reason"]
    assert "the ranks diverged at operation #1" in text, text
    assert "allreduce.stalled (ALLREDUCE, float32 [1], failed)" in text, text
    assert "submitted nothing as operation #1" in text and "allreduce.stalled was never submitted by rank 1" in text


def test_analyser_command_line(tmp_path, capsys):
    from horovod.runner import flight_recorder
    directory = tmp_path / "none"
    directory.mkdir()
    assert flight_recorder.main([str(directory)]) == 1
    assert "no files found" in capsys.readouterr().out
    assert flight_recorder.main([str(tmp_path / "missing")]) == 2
    (directory / "flight_recorder_rank_0.json").write_text("{}")
    assert flight_recorder.main([str(directory)]) == 2
    assert "not a Horovod flight recorder file" in capsys.readouterr().err


DIVERGING_SCRIPT = """
import numpy as np
from horovod.common import ops
from horovod.common.basics import HorovodBasics

hvd = HorovodBasics()
hvd.init()
x = np.ones(3, np.float32)
ops.wait(ops.allreduce_async([x], [x], ["allreduce.w"], hvd.Sum))
if hvd.rank() == 0:
    ops.wait(ops.allreduce_async([x], [x], ["allreduce.m"], hvd.Sum))
else:
    ops.wait(ops.allgather_async([x], ["allgather.m"]))
"""


def test_horovodrun_keeps_the_files_in_the_users_directory_and_prints_the_diagnosis(tmp_path):
    import subprocess
    import sys
    script = tmp_path / "diverge.py"
    script.write_text(DIVERGING_SCRIPT)
    directory = tmp_path / "kept"
    env = dict(os.environ, HOROVOD_FLIGHT_RECORDER_DIR=str(directory))
    run = subprocess.run([sys.executable, "-m", "horovod.runner.launch", "--gloo", "-np", "2", "-H", "localhost:2",
                          sys.executable, str(script)], capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode != 0, run.stdout + run.stderr
    assert f"its flight recorder (files in {directory}) says:" in run.stderr, run.stderr
    assert "diverged at operation #1" in run.stderr and "allgather.m was never submitted by rank 0" in run.stderr
    assert sorted(os.listdir(directory)) == ["flight_recorder_rank_0.json", "flight_recorder_rank_1.json"]


def test_horovodrun_succeeding_job_prints_nothing_and_leaves_nothing(tmp_path):
    import subprocess
    import sys
    script = tmp_path / "ok.py"
    script.write_text("from horovod.common.basics import HorovodBasics\nHorovodBasics().init()\n")
    before = set(os.listdir(tempfile_dir()))
    run = subprocess.run([sys.executable, "-m", "horovod.runner.launch", "--gloo", "-np", "2", "-H", "localhost:2",
                          sys.executable, str(script)], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "flight recorder" not in run.stderr
    assert set(os.listdir(tempfile_dir())) == before


def tempfile_dir():
    import tempfile
    return tempfile.gettempdir()
