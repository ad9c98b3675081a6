"""horovod.runner.util.threads (imported by upstream's test helpers)."""

import threading
import time
from unittest import mock

import pytest

from horovod.runner.util.threads import execute_function_multithreaded, in_thread, on_event

NOT_A_TUPLE = r"^args must be a tuple, not <class 'int'>, for a single argument use \(arg,\)$"


def test_in_thread():
    fn = mock.Mock()
    thread = in_thread(fn, args=(1, 2), name="worker")
    thread.join(5)
    assert not thread.is_alive() and thread.daemon and thread.name == "worker"
    fn.assert_called_once_with(1, 2)
    with pytest.raises(ValueError, match=NOT_A_TUPLE):
        in_thread(fn, args=1)


def test_in_thread_silent_swallows_exceptions():
    seen = []
    with mock.patch("threading.excepthook", side_effect=lambda hook_args: seen.append(hook_args)):
        in_thread(mock.Mock(side_effect=KeyError("x")), silent=True).join(5)
        in_thread(mock.Mock(side_effect=KeyError("y"))).join(5)
    assert len(seen) == 1


def test_on_event_calls_after_event():
    event = threading.Event()
    fn = mock.Mock()
    thread = on_event(event, fn, ("a", 1))
    time.sleep(0.05)
    fn.assert_not_called()
    event.set()
    thread.join(5)
    fn.assert_called_once_with("a", 1)


def test_on_event_stop_first():
    event, stop = threading.Event(), threading.Event()
    fn = mock.Mock()
    thread = on_event(event, fn, stop=stop, check_stop_interval_s=0.01, daemon=False)
    stop.set()
    thread.join(5)
    assert not thread.is_alive()
    event.set()
    fn.assert_not_called()


def test_on_event_argument_errors():
    with pytest.raises(ValueError, match="^Event must not be None$"):
        on_event(None, mock.Mock())
    with pytest.raises(ValueError, match=NOT_A_TUPLE):
        on_event(threading.Event(), mock.Mock(), args=1)
    with pytest.raises(ValueError, match="^Stop event must be given for non-daemon event thread$"):
        on_event(threading.Event(), mock.Mock(), daemon=False)


def test_execute_function_multithreaded():
    assert execute_function_multithreaded(lambda a, b: a * b, [(1, 2), (3, 4), (5, 6)],
                                          max_concurrent_executions=2) == {0: 2, 1: 12, 2: 30}

    def fails_on_two(x):
        if x == 2:
            raise ValueError("two")
        return x

    with mock.patch("threading.excepthook"):
        with pytest.raises(RuntimeError, match="1 of 3 calls of fails_on_two did not complete"):
            execute_function_multithreaded(fails_on_two, [(1,), (2,), (3,)])
