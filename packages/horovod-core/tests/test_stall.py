"""The stall inspector (spec core.md §10): one rank skips a tensor; rank 0 warns, naming the
missing rank and the tensor, then every rank's operations fail with an error saying why, and the
processes exit cleanly (no hang)."""

import os
import time

import numpy as np
import pytest

from horovod_testing import run_ranks

STALL_ENV = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "2", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "5"}


def _stall(log_path, warm_up_steps):
    # The core logs to fd 2; keep a copy of it for the test to read.
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics
    from horovod.common.exceptions import HorovodInternalError
    basics = HorovodBasics()
    basics.init()
    rank = basics.rank()

    def allreduce(*names):
        xs = [np.ones(4, np.float32) for _ in names]
        handles = [ops.allreduce_async([x], [x], [name], 1) for x, name in zip(xs, names, strict=True)]
        for handle in handles:
            ops.wait(handle)

    # Steps every rank takes: after them the tensors are in the response cache.
    for _ in range(warm_up_steps):
        allreduce("allreduce.stalled", "allreduce.stalled2")
    start = time.monotonic()
    if rank == 1:
        time.sleep(12)  # skips the tensor rank 0 waits on
        try:
            allreduce("allreduce.after")
            return ["completed", time.monotonic() - start]
        except HorovodInternalError as e:
            return [str(e), time.monotonic() - start]
    try:
        allreduce("allreduce.stalled", "allreduce.stalled2")
        return ["completed", time.monotonic() - start]
    except HorovodInternalError as e:
        return [str(e), time.monotonic() - start]


@pytest.mark.parametrize("warm_up_steps", [0, 3], ids=["uncached", "cached"])
def test_stall_warns_then_shuts_down_every_rank(tmp_path, warm_up_steps):
    start = time.monotonic()
    results = run_ranks(2, _stall, str(tmp_path / "log"), warm_up_steps, env=STALL_ENV, timeout=45)
    assert time.monotonic() - start < 45
    (message0, elapsed0), (message1, _) = results
    # Rank 0's pending operation failed once the shutdown time passed (plus check intervals, and
    # for a cached tensor the eviction after the warning time), not after rank 1 woke up.
    assert "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS" in message0, message0
    # Names every stalled tensor and the rank that did not submit it.
    for name in ("allreduce.stalled", "allreduce.stalled2"):
        assert f"'{name}' (" in message0 and "not submitted by rank 1)" in message0, message0
    assert 5 <= elapsed0 < 12, elapsed0
    # Rank 1's later operation fails with the same reason instead of hanging.
    assert "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS" in message1 and "'allreduce.stalled' (" in message1, message1
    # Rank 0 (the coordinator) logged the warning naming the missing rank and the tensor.
    log = (tmp_path / "log").read_text()
    assert "Stalled tensors" in log, log
    listing = [line for line in log.splitlines() if line.startswith(("1: [", "1!: ["))]
    assert listing and all("allreduce.stalled" in line and "allreduce.stalled2" in line for line in listing), log


def _warn_only(log_path):
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics
    basics = HorovodBasics()
    basics.init()
    if basics.rank() == 1:
        time.sleep(3.5)  # late, but not forever: the operation completes
    x = np.ones(4, np.float32)
    ops.wait(ops.allreduce_async([x], [x], ["allreduce.late"], 1))
    return float(x[0])


def test_stall_warning_without_shutdown(tmp_path):
    results = run_ranks(2, _warn_only, str(tmp_path / "log"), env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1"},
                        timeout=45)
    assert results == [2.0, 2.0]
    log = (tmp_path / "log").read_text()
    assert "Stalled tensors" in log and "\n1: [allreduce.late]" in log, log


def test_stall_check_disable(tmp_path):
    results = run_ranks(2, _warn_only, str(tmp_path / "log"),
                        env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1", "HOROVOD_STALL_CHECK_DISABLE": "1"}, timeout=45)
    assert results == [2.0, 2.0]
    assert "Stalled tensors" not in (tmp_path / "log").read_text()
