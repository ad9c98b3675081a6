"""What every framework's rank function shares: its view of the job's settings, its readers and
its checkpoint in the store.

A rank function is built on the driver by an estimator's ``_remote_trainer`` as a closure over a
:class:`TrainSpec` and runs on each rank; rank 0 writes the checkpoint after every epoch, so that
a later ``fit`` with the same ``run_id`` starts at the epoch after the last one written.
"""

import dataclasses
import io

import numpy as np

from horovod.spark.common.reader import BatchReader, steps_per_epoch


@dataclasses.dataclass
class TrainSpec:
    """The settings of one run, as the ranks see them."""

    store: object
    run_id: str
    meta: dict
    feature_cols: list
    label_cols: list
    sample_weight_col: str
    batch_size: int
    val_batch_size: int
    epochs: int
    seed: int
    shuffle: bool
    shuffle_buffer_size: int
    train_steps_per_epoch: int
    validation_steps_per_epoch: int
    transformation_fn: object
    inmemory_cache_all: bool
    verbose: int

    @property
    def columns(self):
        return list(self.feature_cols) + list(self.label_cols) + (
            [self.sample_weight_col] if self.sample_weight_col else [])

    def steps(self, size):
        """Training batches per epoch on every rank."""
        return self.train_steps_per_epoch or steps_per_epoch(self.meta["train_row_groups"], size, self.batch_size)

    def readers(self, rank, size):
        """``(train reader, validation reader or None)`` of rank ``rank`` of ``size``."""
        fs, local = self.store.get_arrow_filesystem()

        def groups(kind):
            return [(local(path) if "://" in path else path, g, n) for path, g, n in self.meta[kind + "_row_groups"]]

        train = BatchReader(groups("train"), fs, self.columns, self.meta["kinds"], self.batch_size, rank, size,
                            steps=self.steps(size), shuffle=self.shuffle, seed=self.seed,
                            shuffle_buffer_size=self.shuffle_buffer_size, inmemory_cache=self.inmemory_cache_all,
                            transformation_fn=self.transformation_fn)
        val = None
        if self.meta.get("val_path"):
            val = BatchReader(groups("val"), fs, self.columns, self.meta["kinds"],
                              self.val_batch_size or self.batch_size, rank, size,
                              steps=self.validation_steps_per_epoch, shuffle=False,
                              inmemory_cache=self.inmemory_cache_all, transformation_fn=self.transformation_fn)
        return train, val

    def checkpoint_path(self):
        return self.store.get_checkpoint_path(self.run_id)

    def load_checkpoint(self):
        """The bytes of the run's checkpoint, or None when there is none."""
        path = self.checkpoint_path()
        if path is None or not self.store.exists(path):
            return None
        return self.store.read(path)

    def save_checkpoint(self, data):
        """Write ``data`` (bytes) as the run's checkpoint (a no-op when the store keeps no runs)."""
        path = self.checkpoint_path()
        if path is not None:
            self.store.write(path, data)


def to_bytes(save, obj):
    """``obj`` written by ``save(obj, file)`` (``torch.save`` and the like) as bytes."""
    buffer = io.BytesIO()
    save(obj, buffer)
    return buffer.getvalue()


def to_arrays(batch, columns):
    """The columns of ``batch`` (a dict of numpy arrays) as numpy arrays for training: floating
    point and booleans as float32, integers as int64."""
    out = []
    for name in columns:
        value = np.asarray(batch[name])
        if value.dtype.kind in "fb":
            value = value.astype(np.float32, copy=False)
        elif value.dtype.kind in "iu":
            value = value.astype(np.int64, copy=False)
        out.append(value)
    return out
