"""An in-memory pipe between one writing and one reading thread."""

import threading


class Pipe:
    """A thread-safe pipe that holds one buffer (a ``str`` or ``bytes``) at a time.

    A writer hands over a whole buffer; the reader takes it in pieces of any length. The writer
    waits until the reader has taken all of the previous buffer, so the pipe never holds more
    than one write (the writer is slowed down to the reader's pace). It has the ``write`` and
    ``flush`` of a text or binary stream, so output can be relayed into it.
    """

    def __init__(self):
        self._cond = threading.Condition()
        self._buf = None
        self._offset = 0
        self._closed = False

    def write(self, buf):
        """Put ``buf`` (``str`` or ``bytes``) into the pipe.

        Blocks until the reader has taken all of the previous buffer.

        Raises:
            RuntimeError: the pipe is closed (before the call or while it waited).
        """
        with self._cond:
            self._cond.wait_for(lambda: self._buf is None or self._closed)
            if self._closed:
                raise RuntimeError("the pipe is closed")
            self._buf = buf
            self._offset = 0
            self._cond.notify_all()

    def read(self, length=-1):
        """Take up to ``length`` items (characters or bytes) of the current buffer.

        Blocks until a buffer is there or the pipe is closed. With ``length <= 0`` everything
        left of the current buffer is returned. A buffer written before :meth:`close` can still
        be read after it.

        Returns:
            A ``str`` or ``bytes`` (the type that was written), or None when the pipe is closed
            and holds nothing more.
        """
        with self._cond:
            self._cond.wait_for(lambda: self._buf is not None or self._closed)
            if self._buf is None:
                return None
            end = len(self._buf)
            if 0 < length < end - self._offset:
                end = self._offset + length
            piece = self._buf[self._offset:end]
            self._offset = end
            if end == len(self._buf):
                self._buf = None
                self._cond.notify_all()
            return piece

    def flush(self):
        """Nothing to do: a written buffer is at once visible to the reader."""

    def close(self):
        """Close the pipe and wake every thread blocked in :meth:`write` or :meth:`read`."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
