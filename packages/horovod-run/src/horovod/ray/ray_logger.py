"""Reports from the workers to the driver's callbacks (spec ray.md §8).

In a function run by :class:`~horovod.ray.RayExecutor` (``run``/``execute`` with ``callbacks``),
``ray_logger.log({"loss": 0.1, "epoch": 3})`` sends the dict to the process that called ``run``,
where every callback is called with it, in the order the records arrived. The records travel
through a ``ray.util.queue.Queue`` actor on the driver's Ray node.

Without a queue (the function was run without callbacks, or outside Ray) a record is dropped,
with a ``UserWarning`` the first time in a process.
"""

import threading
import warnings
from typing import Any, Callable, Dict, List, Optional

_queue = None
_warned = False

# How often the driver takes the records off the queue (seconds), and how long it waits for the
# thread doing that once the results are in.
POLL_INTERVAL_S = 0.1
JOIN_TIMEOUT_S = 60


def configure(queue):
    """Send this process's records to ``queue`` (a ``ray.util.queue.Queue``, or None to stop)."""
    global _queue
    _queue = queue


def log(info_dict: Dict[str, Any]):
    """Send ``info_dict`` (a picklable dict) to the driver's callbacks.

    Raises:
        ValueError: ``info_dict`` is not a dict.
    """
    global _warned
    if not isinstance(info_dict, dict):
        raise ValueError("ray_logger.log takes a dict, got %s" % type(info_dict).__name__)
    if _queue is None:
        if not _warned:
            _warned = True
            warnings.warn("horovod.ray.ray_logger: logging is not configured (the function was run "
                          "without callbacks, or outside horovod.ray); records are dropped",
                          UserWarning, stacklevel=2)
        return
    _queue.put(info_dict)


class CallbackPump:
    """Driver side: a zero-CPU queue actor on this process's Ray node, drained every
    :data:`POLL_INTERVAL_S` seconds by a thread that calls each callback on each record.

    Args:
        callbacks: callables taking one dict; an exception in one is printed and the others go on.
    """

    def __init__(self, callbacks: List[Callable[[Dict[str, Any]], Any]]):
        import ray
        from ray.util.queue import Queue
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        self.callbacks = list(callbacks)
        self.queue = Queue(actor_options={
            "num_cpus": 0,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(),
                                                                  soft=False)})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain_loop, name="horovod-ray-callbacks", daemon=True)
        self._thread.start()

    def _drain(self):
        while True:
            size = self.queue.size()
            if not size:
                return
            for record in self.queue.get_nowait_batch(size):
                for callback in self.callbacks:
                    try:
                        callback(record)
                    except Exception as e:  # one bad callback must not end the job
                        print("horovod.ray: callback %r failed on %r: %s" % (callback, record, e), flush=True)

    def _drain_loop(self):
        while not self._stop.wait(POLL_INTERVAL_S):
            try:
                self._drain()
            except Exception:  # the queue actor is gone: nothing more will come
                return

    def stop(self):
        """Deliver what is left, stop the thread (at most :data:`JOIN_TIMEOUT_S`) and the queue."""
        self._stop.set()
        self._thread.join(JOIN_TIMEOUT_S)
        try:
            self._drain()
        except Exception:
            pass
        try:
            self.queue.shutdown(force=True)
        except Exception:
            pass


def start_pump(callbacks: Optional[List[Callable]]) -> Optional[CallbackPump]:
    """A :class:`CallbackPump` for ``callbacks``, or None when there are none."""
    return CallbackPump(callbacks) if callbacks else None
