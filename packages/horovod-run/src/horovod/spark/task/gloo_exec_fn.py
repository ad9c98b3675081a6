"""One Horovod rank of :func:`horovod.spark.run`: ``python -m horovod.spark.task.gloo_exec_fn FD``.

Started by its Spark task with the rank's environment (``HOROVOD_*`` and, never on the command
line, the rendezvous secret in ``_HOROVOD_SECRET_KEY``). Reads the cloudpickled ``(fn, args,
kwargs)`` from stdin, calls ``fn(*args, **kwargs)`` and writes the outcome to file descriptor
``FD``: ``b"O<rank> <size>\n"`` (the rank and size at the end: they change in an elastic job) and
the cloudpickled result, ``b"X"`` when ``fn`` called ``sys.exit(0)`` (an elastic worker whose slot
was removed), or ``b"E"`` and the traceback (UTF-8). Exits 0, or 1 (``sys.exit``'s status).

The process asks Linux to kill it when its parent (the Spark task's Python worker) dies, and also
checks its parent: a cancelled Spark job kills the worker, never its children.
"""

import ctypes
import faulthandler
import os
import signal
import sys
import threading
import time
import traceback

import cloudpickle
from horovod.runner.common.util import env_names

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent):
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass

    def watch():
        while True:
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(1.0)

    threading.Thread(target=watch, name="horovod.spark parent watch", daemon=True).start()
    if os.getppid() != parent:  # the parent died before the signal was asked for
        os.kill(os.getpid(), signal.SIGKILL)


def main(argv):
    result_fd = int(argv[1])
    faulthandler.enable()  # a crash leaves the Python stacks in the rank's stderr
    _die_with_parent(int(os.environ.get(env_names.SPARK_TASK_PID, os.getppid())))
    payload = sys.stdin.buffer.read()
    try:
        fn, args, kwargs = cloudpickle.loads(payload)
        result = cloudpickle.dumps(fn(*args, **kwargs))
        place = "%s %s\n" % (os.environ.get(env_names.RANK, "-1"), os.environ.get(env_names.SIZE, "-1"))
        body = b"O" + place.encode("ascii") + result
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        body = b"X" if code == 0 else b"E" + traceback.format_exc().encode("utf-8", "replace")
    except BaseException:
        body = b"E" + traceback.format_exc().encode("utf-8", "replace")
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    with os.fdopen(result_fd, "wb") as f:
        f.write(body)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
