"""How the launchers name a worker's exit status in their messages."""

import signal


def describe_exit_code(code):
    """``code`` and, for ``128 + s``, the name of signal ``s`` (e.g. ``137 (SIGKILL)``)."""
    if code > 128:
        try:
            return "%d (%s)" % (code, signal.Signals(code - 128).name)
        except ValueError:
            pass
    return str(code)
