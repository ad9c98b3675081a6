"""Deadlines for the launcher's start-up steps."""

import time


class TimeoutException(Exception):
    """A start-up step did not finish before its deadline."""


class Timeout:
    """A deadline ``timeout`` seconds from now.

    ``message`` is a ``str.format`` template with an ``{activity}`` field, filled in by
    :meth:`check_time_out_for`.
    """

    def __init__(self, timeout: float, message: str):
        self._timeout = timeout
        self._timeout_at = time.time() + timeout
        self._message = message

    @property
    def seconds(self) -> float:
        """The length of the deadline as given, in seconds."""
        return self._timeout

    def remaining(self) -> float:
        """Seconds left before the deadline (0 once it has passed)."""
        return max(0.0, self._timeout_at - time.time())

    def timed_out(self) -> bool:
        """True once the deadline has passed."""
        return time.time() > self._timeout_at

    def check_time_out_for(self, activity: str):
        """Raise :class:`TimeoutException` naming ``activity`` if the deadline has passed."""
        if self.timed_out():
            raise TimeoutException(self._message.format(activity=activity))
