"""The engine's ``HOROVOD_*`` runtime variables, as its knob table declares them.

Every variable the engine reads is declared once, in the table of csrc/common/config.cc, with its
default and a one-line description; this module is that table seen from Python, so that Python
code (the launcher above all) takes the names from it instead of spelling them again.
"""

import functools
from typing import NamedTuple


class Knob(NamedTuple):
    """One row of the engine's knob table."""

    name: str  #: the environment variable, ``HOROVOD_<...>``
    default: str  #: its default, as text ('' where unset means "not given")
    doc: str  #: what it sets, in one line


@functools.cache
def table():
    """Every engine knob, as a dict ``name -> Knob`` in the table's order.

    Raises:
        ImportError: the compiled core (``horovod.common._core``) cannot be loaded.
    """
    from horovod.common import _core
    return {name: Knob(name, default, doc) for name, default, doc in _core.knobs()}


def knob(short):
    """The name of the engine knob ``HOROVOD_<short>``, e.g. ``knob('CYCLE_TIME')`` is
    ``'HOROVOD_CYCLE_TIME'``.

    Raises:
        ValueError: the engine declares no such variable (the message lists the close ones).
        ImportError: the compiled core cannot be loaded.
    """
    name = f'HOROVOD_{short}'
    rows = table()
    if name not in rows:
        close = [n for n in rows if short.split('_')[0] in n]
        raise ValueError(f'the engine declares no variable {name} (csrc/common/config.cc); '
                         f'related: {", ".join(close) or "none"}')
    return rows[name].name
