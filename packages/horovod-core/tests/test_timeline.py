"""The timeline (spec core.md §11): a Chrome trace JSON array written by global rank 0 only, valid
JSON after every record (also when rank 0 is killed), switched and closed by the dynamic API."""

import json
import os
import signal
import time

import numpy as np
import pytest

from horovod_testing import RanksFailed, run_ranks

TENSOR = "allreduce.test_allreduce"


def _setup():
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics
    basics = HorovodBasics()
    basics.init()
    return basics, ops


def _allreduce(ops, array, name):
    h = ops.allreduce_async([array], [array], [name], 1)
    ops.wait(h)
    return array


def _load(path):
    with open(path, encoding="utf-8") as f:
        records = json.loads(f.read())
    assert isinstance(records, list)
    return records


def _pids(records):
    """Tensor name -> pid, from the process_name metadata records of the tensors (pid > 0)."""
    return {r["args"]["name"]: r["pid"] for r in records
            if r.get("ph") == "M" and r.get("name") == "process_name" and r["pid"] > 0}


def _events(records, pid):
    return [r for r in records if r.get("pid") == pid and r.get("ph") in ("B", "E", "X")]


def _check_header(records):
    assert records[0]["name"] == "process_name" and records[0]["ph"] == "M" and records[0]["pid"] == 0
    assert records[0]["args"]["start_time_since_epoch_in_micros"] > 1_500_000_000 * 10**6
    assert records[1] == {"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}}


# (a) HOROVOD_TIMELINE=<path> with cycle marks, np=2.

def _named_allreduces():
    basics, ops = _setup()
    rank = basics.rank()
    for _ in range(3):
        x = _allreduce(ops, np.full((2, 3), rank + 1, np.float32), TENSOR)
        assert x.tolist() == [[3.0] * 3] * 2
    basics.shutdown()
    return rank


def test_timeline_file_from_environment(tmp_path):
    path = tmp_path / "timeline.json"
    env = {"HOROVOD_TIMELINE": str(path), "HOROVOD_TIMELINE_MARK_CYCLES": "1"}
    assert run_ranks(2, _named_allreduces, env=env, timeout=60) == [0, 1]
    assert sorted(os.listdir(tmp_path)) == ["timeline.json"]
    text = path.read_text(encoding="utf-8")
    for needle in (TENSOR, "start_time_since_epoch_in_micros", "NEGOTIATE_ALLREDUCE", "ALLREDUCE", "CYCLE_START"):
        assert needle in text
    records = json.loads(text)
    _check_header(records)
    pids = _pids(records)
    assert TENSOR in pids
    pid = pids[TENSOR]
    assert {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}} in records
    events = _events(records, pid)
    begins = [e["name"] for e in events if e["ph"] == "B"]
    assert "NEGOTIATE_ALLREDUCE" in begins and "ALLREDUCE" in begins
    assert begins.index("NEGOTIATE_ALLREDUCE") < begins.index("ALLREDUCE")
    ticks = [e for e in events if e["ph"] == "X"]
    assert {e["name"] for e in ticks} >= {"0", "1"}
    assert all(e["dur"] == 0 for e in ticks)
    ends = [e for e in events if e["ph"] == "E"]
    assert all("name" not in e for e in ends)
    assert {"dtype": "float32", "shape": "[2, 3]"} in [e.get("args") for e in ends]
    assert sum(e["ph"] == "B" for e in events) == len(ends)  # every bar was closed
    assert all(isinstance(e["ts"], int) and e["ts"] >= 0 for e in events)
    marks = [r for r in records if r.get("name") == "CYCLE_START"]
    assert marks and all(r["ph"] == "i" and r["s"] == "g" for r in marks)


# (b) HOROVOD_TIMELINE=DYNAMIC: start/stop switch files; only rank 0 writes.

def _dynamic(directory):
    basics, ops = _setup()
    rank = basics.rank()
    first = os.path.join(directory, f"first.{rank}.json")
    second = os.path.join(directory, f"second.{rank}.json")
    _allreduce(ops, np.ones(4, np.float32), "allreduce.before_start")
    basics.start_timeline(first, mark_cycles=True)
    _allreduce(ops, np.ones(4, np.float32), "allreduce.dyn_first")
    basics.start_timeline(first, mark_cycles=True)  # the current file: no-op, not truncated
    _allreduce(ops, np.ones((2, 3), np.float32), "allreduce.dyn_first_again")
    basics.stop_timeline()
    first_records = _load(first) if rank == 0 else None  # complete as soon as stop returns
    basics.start_timeline(second)
    _allreduce(ops, np.ones(4, np.float32), "allreduce.dyn_second")
    basics.stop_timeline()
    second_records = _load(second) if rank == 0 else None
    basics.stop_timeline()  # nothing recording: a no-op
    _allreduce(ops, np.ones(4, np.float32), "allreduce.after_stop")
    basics.shutdown()
    return rank, first_records, second_records


def test_dynamic_timeline_switches_files(tmp_path):
    results = run_ranks(2, _dynamic, str(tmp_path), env={"HOROVOD_TIMELINE": "DYNAMIC"}, timeout=60)
    assert sorted(os.listdir(tmp_path)) == ["first.0.json", "second.0.json"]
    _, first, second = results[0]
    assert results[1][1:] == (None, None)
    _check_header(first)
    assert set(_pids(first)) == {"allreduce.dyn_first", "allreduce.dyn_first_again"}
    assert any(r.get("name") == "CYCLE_START" for r in first)
    _check_header(second)
    assert set(_pids(second)) == {"allreduce.dyn_second"}
    assert _pids(second)["allreduce.dyn_second"] == 1  # pids restart in every file
    assert not any(r.get("name") == "CYCLE_START" for r in second)
    # The files on disk are unchanged by what ran after stop_timeline.
    assert _load(tmp_path / "second.0.json") == second


# (c) Errors.

def _errors(path):
    from horovod.common.basics import HorovodBasics
    basics = HorovodBasics()
    messages = []
    for call in (lambda: basics.start_timeline(path), basics.stop_timeline):
        try:
            call()
        except ValueError as e:
            messages.append(str(e))
    basics.init()
    try:
        basics.start_timeline(path, mark_cycles=True)
    except ValueError as e:
        messages.append(str(e))
    basics.stop_timeline()  # enabled or not, stopping with nothing recording is a no-op
    basics.shutdown()
    return messages


def test_timeline_errors(tmp_path):
    path = tmp_path / "never-written.json"
    (messages,) = run_ranks(1, _errors, str(path), env={"HOROVOD_TIMELINE": ""}, timeout=30)
    assert len(messages) == 3, messages
    assert "init" in messages[0] and "init" in messages[1]
    assert "DYNAMIC" in messages[2] and "HOROVOD_TIMELINE" in messages[2]
    assert not path.exists()


# (d) Rank 0 killed with SIGKILL while recording: the file still parses.

def _killed_while_recording():
    basics, ops = _setup()
    rank = basics.rank()
    for _ in range(3):
        _allreduce(ops, np.ones((2, 3), np.float32), TENSOR)
    if rank == 0:
        # Queue an op rank 1 never submits: its negotiation is being recorded, cycles keep marking.
        ops.allreduce_async([np.ones(4, np.float32)], [np.ones(4, np.float32)],
                            ["allreduce.never_finished"], 1)
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(1.0)
    os._exit(0)  # rank 1 leaves without a result; its peer is gone


def test_timeline_survives_sigkill(tmp_path):
    path = tmp_path / "timeline.json"
    env = {"HOROVOD_TIMELINE": str(path), "HOROVOD_TIMELINE_MARK_CYCLES": "1"}
    with pytest.raises(RanksFailed):
        run_ranks(2, _killed_while_recording, env=env, timeout=30)
    records = _load(path)
    _check_header(records)
    pids = _pids(records)
    assert TENSOR in pids and "allreduce.never_finished" in pids
    assert any(e["ph"] == "B" and e["name"] == "NEGOTIATE_ALLREDUCE"
               for e in _events(records, pids["allreduce.never_finished"]))
    assert any(r.get("name") == "CYCLE_START" for r in records)
