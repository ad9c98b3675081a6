"""Small helpers to run functions in background threads."""

import queue
import threading


def _check_args(args):
    if not isinstance(args, tuple):
        raise ValueError("args must be a tuple, not %s, for a single argument use (arg,)"
                         % type(args))


def in_thread(target, args=(), name=None, daemon=True, silent=False):
    """Start ``target(*args)`` in a new thread and return the thread.

    ``args`` must be a tuple (else ``ValueError``). With ``silent``, an exception raised by
    ``target`` is swallowed instead of being reported by ``threading``.
    """
    _check_args(args)
    run = target
    if silent:
        def run(*call_args):
            try:
                target(*call_args)
            except Exception:
                pass
    thread = threading.Thread(target=run, args=args, name=name, daemon=daemon)
    thread.start()
    return thread


def on_event(event, func, args=(), stop=None, check_stop_interval_s=1.0, daemon=True,
             silent=False):
    """Start a thread that calls ``func(*args)`` once ``event`` is set; return the thread.

    When ``stop`` (an event) is set first, the thread ends without calling ``func``; it is
    checked every ``check_stop_interval_s`` seconds. Raises ``ValueError`` when ``event`` is
    None, ``args`` is not a tuple, or a non-daemon thread is asked for without a ``stop`` event
    (it could never end).
    """
    if event is None:
        raise ValueError("Event must not be None")
    _check_args(args)
    if stop is None and not daemon:
        raise ValueError("Stop event must be given for non-daemon event thread")

    def wait_then_call(*call_args):
        if stop is None:
            event.wait()
        else:
            while not event.wait(check_stop_interval_s):
                if stop.is_set():
                    return
        func(*call_args)

    return in_thread(wait_then_call, args, daemon=daemon, silent=silent)


def execute_function_multithreaded(fn, args_list, block_until_all_done=True,
                                   max_concurrent_executions=1000):
    """Call ``fn(*args)`` for every ``args`` of ``args_list`` on up to
    ``max_concurrent_executions`` threads.

    Returns ``{index in args_list: result}``. When ``block_until_all_done`` it waits for every
    call and raises ``RuntimeError`` if some call did not complete (it raised); otherwise it
    returns at once a dict that fills in as calls complete.
    """
    work = queue.Queue()
    for index, args in enumerate(args_list):
        work.put((index, args))
    results = {}
    lock = threading.Lock()

    def worker():
        while True:
            try:
                index, args = work.get_nowait()
            except queue.Empty:
                return
            result = fn(*args)
            with lock:
                results[index] = result

    threads = [in_thread(worker) for _ in range(min(max_concurrent_executions, len(args_list)))]
    if block_until_all_done:
        for thread in threads:
            thread.join()
        if len(results) != len(args_list):
            raise RuntimeError("%d of %d calls of %s did not complete"
                               % (len(args_list) - len(results), len(args_list),
                                  getattr(fn, "__name__", fn)))
    return results
