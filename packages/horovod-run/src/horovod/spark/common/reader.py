"""The ranks' data reader: each rank reads its own shard of the Parquet row groups with
``pyarrow.dataset`` and turns it into batches of numpy arrays, in a background thread that stays a
few batches ahead of training.

Sharding: rank ``r`` of ``size`` reads row groups ``r, r + size, r + 2 size, ...`` (in the order
:func:`horovod.spark.common.data.describe` lists them), so the ranks' rows are disjoint and together
are the whole split.

Training epochs have the same number of steps on every rank (:func:`steps_per_epoch`), so no
rank waits for another at an epoch's end: a rank whose shard runs out first goes on with the next
shuffled pass of its shard, one whose steps end first leaves its last rows for that epoch.

Shuffling: for epoch ``e`` the generator ``numpy.random.default_rng([seed, e, rank])`` orders the
row groups, then shuffles the rows of each window of ``shuffle_buffer_size`` rows (default: the
whole shard, a full shuffle). Runs with the same seed read the same batches.
"""

import math
import queue
import threading
import time

import numpy as np

from horovod.spark.common.data import ARRAY

_END = object()


def shard(row_groups, rank, size):
    """The row groups rank ``rank`` of ``size`` reads."""
    return list(row_groups[rank::size])


def steps_per_epoch(row_groups, size, batch_size):
    """Batches per training epoch on every rank: the largest shard's rows / ``batch_size``,
    rounded up (at least 1)."""
    largest = max((sum(n for _, _, n in shard(row_groups, r, size)) for r in range(size)), default=0)
    return max(1, math.ceil(largest / batch_size))


def _to_numpy(table, kinds):
    """``{column: numpy array}``: scalars as 1-d arrays, arrays as ``(rows, size)``; a row whose
    array has another length raises ``ValueError``."""
    import pyarrow.compute as pc

    out = {}
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        kind, size = kinds.get(name, (None, None))
        if kind == ARRAY:
            lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
            if len(lengths) and (lengths.min() != size or lengths.max() != size):
                raise ValueError("column %r holds arrays of %s elements; every row must have %s"
                                 % (name, sorted(set(lengths.tolist())), size))
            flat = column.flatten().to_numpy(zero_copy_only=False)
            out[name] = flat.reshape(len(column), size)
        else:
            out[name] = column.to_numpy(zero_copy_only=False)
    return out


def _concat(parts):
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _rows(columns):
    """The number of rows of a dict of column arrays (0 for no columns)."""
    return len(next(iter(columns.values()))) if columns else 0


def _take(columns, index):
    return {k: v[index] for k, v in columns.items()}


class BatchReader:
    """Batches of one rank's shard.

    Args:
        row_groups: ``[(file, row group id, rows)]`` of the whole split (:func:`describe`).
        filesystem: the ``pyarrow.fs.FileSystem`` the files are on.
        columns: the column names to read (list of str).
        kinds: ``{column: ('scalar' | 'array', size)}``.
        batch_size: rows per batch (int >= 1).
        rank, size: this rank and the number of ranks.
        steps: batches per epoch (int), or None for one pass over the shard whose last batch may
            be smaller (validation).
        shuffle: shuffle row groups and rows each epoch (bool).
        seed: the shuffle's seed (int; None counts as 0).
        shuffle_buffer_size: rows shuffled together (int), None for the whole shard.
        inmemory_cache: keep the shard's arrays after the first read (bool).
        transformation_fn: applied to every batch (a dict of column -> numpy array), returns one.
        prefetch: batches the background thread may read ahead.

    :meth:`epoch` yields dicts of numpy arrays: scalar columns ``(rows,)``, array columns
    ``(rows, size)`` in their Parquet dtype.
    """

    def __init__(self, row_groups, filesystem, columns, kinds, batch_size, rank=0, size=1, steps=None, shuffle=True,
                 seed=None, shuffle_buffer_size=None, inmemory_cache=False, transformation_fn=None, prefetch=8):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError("batch_size must be a positive integer, got %r" % (batch_size,))
        self.shard = shard(row_groups, rank, size)
        self.rows = sum(n for _, _, n in self.shard)
        self.fs = filesystem
        self.columns = list(columns)
        self.kinds = kinds
        self.batch_size = batch_size
        self.rank = rank
        self.steps = steps
        self.shuffle = shuffle
        self.seed = 0 if seed is None else int(seed)
        self.buffer_rows = shuffle_buffer_size or max(self.rows, 1)
        self.transformation_fn = transformation_fn
        self.prefetch = prefetch
        self._cache = {} if inmemory_cache else None
        # Seconds the training thread waited for a batch, summed (for the benchmark).
        self.wait_s = 0.0

    def _read(self, index):
        if self._cache is not None and index in self._cache:
            return self._cache[index]
        import pyarrow.dataset as ds

        path, group, _ = self.shard[index]
        fragment = ds.ParquetFileFormat().make_fragment(path, filesystem=self.fs, row_groups=[group])
        arrays = _to_numpy(fragment.to_table(columns=self.columns), self.kinds)
        if self._cache is not None:
            self._cache[index] = arrays
        return arrays

    def _passes(self, rng):
        """Windows of shuffled rows, pass after pass over the shard (one pass without steps)."""
        while True:
            order = rng.permutation(len(self.shard)) if self.shuffle else np.arange(len(self.shard))
            window, rows = [], 0
            for index in order:
                part = self._read(int(index))
                window.append(part)
                rows += _rows(part)
                if rows >= self.buffer_rows:
                    yield self._mixed(window, rng)
                    window, rows = [], 0
            if window:
                yield self._mixed(window, rng)
            if self.steps is None:
                return

    def _mixed(self, window, rng):
        columns = _concat(window)
        if self.shuffle:
            columns = _take(columns, rng.permutation(_rows(columns)))
        return columns

    def _batches(self, epoch):
        if not self.shard:
            return
        rng = np.random.default_rng([self.seed, epoch, self.rank])
        pending, pending_rows, emitted = [], 0, 0
        for window in self._passes(rng):
            pending.append(window)
            pending_rows += _rows(window)
            if pending_rows < self.batch_size:
                continue
            columns = _concat(pending)
            start = 0
            while pending_rows - start >= self.batch_size:
                if self.steps is not None and emitted == self.steps:
                    return
                yield _take(columns, slice(start, start + self.batch_size))
                emitted += 1
                start += self.batch_size
            pending = [_take(columns, slice(start, None))]
            pending_rows -= start
            if self.steps is not None and emitted == self.steps:
                return
        if pending_rows:
            yield _concat(pending)

    def epoch(self, epoch):
        """The batches of epoch ``epoch`` (int), read ahead by a background thread; exceptions of
        the reading (a bad file, a bad row, the transformation) are raised here."""
        out = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def put(item):
            while not stop.is_set():
                try:
                    out.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    pass
            return False

        def produce():
            try:
                for batch in self._batches(epoch):
                    if self.transformation_fn is not None:
                        batch = self.transformation_fn(batch)
                    if not put(batch):
                        return
                put(_END)
            except BaseException as e:  # handed to the training thread
                put(e)

        thread = threading.Thread(target=produce, name="horovod.spark reader", daemon=True)
        thread.start()
        try:
            while True:
                start = time.perf_counter()
                item = out.get()
                self.wait_s += time.perf_counter() - start
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            thread.join()
