"""Process checks shared by the packages' tests."""

import time

import psutil


def wait_gone(pid, timeout_s=10.0):
    """True once process ``pid`` has exited within ``timeout_s`` seconds, else False. A zombie
    that its (possibly new) parent has not reaped yet counts as gone."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False
