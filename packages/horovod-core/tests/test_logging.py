"""Core log lines (spec core.md §9): level from HOROVOD_LOG_LEVEL, upstream's line format, INFO to
stdout and WARNING+ to stderr, HOROVOD_LOG_HIDE_TIME."""

import os
import re
import subprocess
import sys

SCRIPT = """
from horovod.common.basics import HorovodBasics
hvd = HorovodBasics()
hvd.init()
hvd.shutdown()
"""


def _run(**env):
    full = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    full.update(env)
    return subprocess.run([sys.executable, "-c", SCRIPT], env=full, capture_output=True, text=True, timeout=60,
                          check=True)


def test_info_line_with_time_goes_to_stdout():
    out = _run(HOROVOD_LOG_LEVEL="info")
    line = next(ln for ln in out.stdout.splitlines() if "Horovod initialized" in ln)
    assert re.match(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}: INFO engine\.cc:\d+\] Horovod initialized", line), line
    assert "Horovod initialized" not in out.stderr


def test_hide_time_and_case_insensitive_level():
    out = _run(HOROVOD_LOG_LEVEL="DEBUG", HOROVOD_LOG_HIDE_TIME="1")
    assert re.search(r"^\[INFO engine\.cc:\d+\] Horovod initialized", out.stdout, re.M), out.stdout


def test_default_and_unknown_levels_are_warning():
    for env in ({}, {"HOROVOD_LOG_LEVEL": "chatty"}):
        out = _run(**env)
        assert "Horovod initialized" not in out.stdout + out.stderr
