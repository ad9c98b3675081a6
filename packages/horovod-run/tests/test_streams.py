"""horovod.runner.util.streams.Pipe: single-slot hand-over between threads, blocking and close."""

import threading

import pytest

from horovod.runner.util.streams import Pipe

# A call that should block is given this long to show that it does not return.
BLOCKED_S = 0.3
# A call that should return is given this long before the test fails (it never hangs).
RETURNS_S = 5.0


class _Call:
    """Runs ``fn(*args)`` in a daemon thread; keeps its result or exception."""

    def __init__(self, fn, *args):
        self.result = self.error = None
        self._thread = threading.Thread(target=self._run, args=(fn, args), daemon=True)
        self._thread.start()

    def _run(self, fn, args):
        try:
            self.result = fn(*args)
        except Exception as e:
            self.error = e

    def blocked(self):
        self._thread.join(BLOCKED_S)
        return self._thread.is_alive()

    def done(self):
        self._thread.join(RETURNS_S)
        return not self._thread.is_alive()


def test_read_returns_what_was_written():
    pipe = Pipe()
    pipe.write("abcdefg")
    assert pipe.read() == "abcdefg"


def test_bytes_pass_unchanged():
    pipe = Pipe()
    pipe.write(b"\x00\xffbytes")
    piece = pipe.read(2)
    assert piece == b"\x00\xff" and isinstance(piece, bytes)
    assert pipe.read() == b"bytes"


def test_read_length_takes_pieces_of_the_current_buffer():
    pipe = Pipe()
    pipe.write("abcdefg")
    assert [pipe.read(3), pipe.read(3), pipe.read(3)] == ["abc", "def", "g"]
    # The buffer is used up: the next read waits for a write.
    reader = _Call(pipe.read, 3)
    assert reader.blocked()
    pipe.close()
    assert reader.done() and reader.result is None


@pytest.mark.parametrize("length", [0, -1, -5])
def test_non_positive_length_reads_the_rest(length):
    pipe = Pipe()
    pipe.write("abcdefg")
    assert pipe.read(2) == "ab"
    assert pipe.read(length) == "cdefg"
    pipe.write("xyz")
    assert pipe.read(length) == "xyz"


def test_read_blocks_until_a_write():
    pipe = Pipe()
    reader = _Call(pipe.read)
    assert reader.blocked()
    pipe.write("late")
    assert reader.done() and reader.result == "late"


def test_write_blocks_until_the_previous_buffer_is_fully_read():
    pipe = Pipe()
    pipe.write("first")
    writer = _Call(pipe.write, "second")
    assert writer.blocked()
    assert pipe.read(2) == "fi"
    assert writer.blocked()  # three characters of "first" are still unread
    assert pipe.read() == "rst"
    assert writer.done() and writer.error is None
    assert pipe.read() == "second"


def test_close_keeps_the_unread_buffer_then_reads_none():
    pipe = Pipe()
    pipe.write("abcdefg")
    pipe.close()
    assert pipe.read(3) == "abc"
    assert pipe.read() == "defg"
    assert pipe.read() is None
    assert pipe.read(1) is None


def test_close_wakes_all_blocked_readers_with_none():
    pipe = Pipe()
    readers = [_Call(pipe.read) for _ in range(3)]
    assert all(reader.blocked() for reader in readers)
    pipe.close()
    assert all(reader.done() for reader in readers)
    assert [reader.result for reader in readers] == [None, None, None]


def test_write_to_a_closed_pipe_raises():
    pipe = Pipe()
    pipe.close()
    with pytest.raises(RuntimeError, match="closed"):
        pipe.write("too late")
    assert pipe.read() is None


def test_close_wakes_a_blocked_writer_with_an_error():
    pipe = Pipe()
    pipe.write("kept")
    writer = _Call(pipe.write, "lost")
    assert writer.blocked()
    pipe.close()
    assert writer.done() and isinstance(writer.error, RuntimeError)
    assert pipe.read() == "kept"
    assert pipe.read() is None


def test_flush_does_nothing():
    pipe = Pipe()
    flusher = _Call(pipe.flush)  # an empty pipe: nothing to wait for
    assert flusher.done() and flusher.result is None
    pipe.write("abc")
    pipe.flush()  # a full pipe: flushing must not wait for the reader either
    assert pipe.read() == "abc"


def test_concurrent_writer_and_reader_keep_every_piece_in_order():
    pipe = Pipe()
    pieces = ["piece %d;" % i for i in range(200)]

    def write_all():
        for piece in pieces:
            pipe.write(piece)
        pipe.close()

    writer = _Call(write_all)
    received = []
    while (piece := pipe.read(4)) is not None:
        received.append(piece)
    assert writer.done() and writer.error is None
    assert "".join(received) == "".join(pieces)
    assert max(len(piece) for piece in received) == 4
