"""One Horovod rank of :func:`horovod.spark.run`: ``python -m horovod.spark.task.gloo_exec_fn FD``.

Started by its Spark task with the rank's environment (``HOROVOD_*`` and, never on the command
line, the rendezvous secret in ``_HOROVOD_SECRET_KEY``). Reads the cloudpickled ``(fn, args,
kwargs)`` from stdin, calls ``fn(*args, **kwargs)`` and writes the outcome to file descriptor
``FD``: ``b"O"`` and the cloudpickled result, or ``b"E"`` and the traceback (UTF-8). Exits 0 or 1.

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
    _die_with_parent(int(os.environ.get("HOROVOD_SPARK_TASK_PID", os.getppid())))
    payload = sys.stdin.buffer.read()
    try:
        fn, args, kwargs = cloudpickle.loads(payload)
        body = b"O" + cloudpickle.dumps(fn(*args, **kwargs))
        code = 0
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
