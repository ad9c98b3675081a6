"""The training data in the store: :func:`prepare_data` writes a DataFrame's feature, label and
sample-weight columns as Parquet (vectors as arrays of doubles) and caches the result per
(DataFrame, store, validation) while it is in use."""

import contextlib
import threading

# Column kinds of the written data, in the metadata that travels to the ranks.
SCALAR, ARRAY = "scalar", "array"


class _TrainingCache:
    """Dataset indices of prepared DataFrames: ``(id(df), store prefix, validation) -> idx``
    with a use count; a released index is reused by the next new DataFrame."""

    def __init__(self):
        self._lock = threading.Lock()
        self._entries = {}  # key -> [idx, users, metadata]
        self._free = []

    def acquire(self, key, prepare):
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                entry[1] += 1
                return entry[0], entry[2], False
            idx = self._free.pop(0) if self._free else len(self._entries) + len(self._free)
            while any(e[0] == idx for e in self._entries.values()):
                idx += 1
            entry = [idx, 1, None]
            self._entries[key] = entry
        try:
            entry[2] = prepare(idx)
        except BaseException:
            with self._lock:
                del self._entries[key]
                self._free.append(idx)
            raise
        return idx, entry[2], True

    def release(self, key):
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] == 0:
                del self._entries[key]
                self._free.append(entry[0])
                self._free.sort()


_training_cache = _TrainingCache()


def _column_kinds(df, columns):
    """``{column: (kind, size or None)}`` for ``columns`` of ``df``; ``ValueError`` for a
    missing column or a type the Estimators cannot feed (strings, maps, structs)."""
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import types as T

    kinds = {}
    fields = {f.name: f for f in df.schema.fields}
    for name in columns:
        if name not in fields:
            raise ValueError("column %r is not in the DataFrame (its columns: %s)" % (name, sorted(fields)))
        dtype = fields[name].dataType
        if isinstance(dtype, VectorUDT):
            kinds[name] = ("vector", None)
        elif isinstance(dtype, T.ArrayType) and isinstance(dtype.elementType, T.NumericType):
            kinds[name] = (ARRAY, None)
        elif isinstance(dtype, (T.NumericType, T.BooleanType)):
            kinds[name] = (SCALAR, None)
        else:
            raise ValueError("column %r has type %s; the Estimators take numeric scalars, arrays of numbers and "
                             "ml.linalg vectors (dense or sparse)" % (name, dtype.simpleString()))
    return kinds


def check_validation(validation, df=None):
    """``validation`` is None, a float in [0, 1) or a column name of ``df``; else ``ValueError``."""
    if validation is None:
        return
    if isinstance(validation, float) or (isinstance(validation, int) and not isinstance(validation, bool)):
        if not 0 <= validation < 1:
            raise ValueError("validation must be a fraction in [0, 1) or a column name, got %r" % (validation,))
        return
    if isinstance(validation, str):
        if df is not None and validation not in df.columns:
            raise ValueError("validation column %r is not in the DataFrame (its columns: %s)"
                             % (validation, sorted(df.columns)))
        return
    raise ValueError("validation must be a fraction in [0, 1) or a column name, got %r" % (validation,))


def _to_columns(df, columns):
    """``df`` with only ``columns``, vectors turned into arrays of doubles (a no-op on a
    DataFrame that already is)."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import functions as F

    fields = {f.name: f.dataType for f in df.schema.fields}
    return df.select(*[vector_to_array(F.col(name)).alias(name) if isinstance(fields[name], VectorUDT)
                       else F.col(name) for name in columns])


@contextlib.contextmanager
def prepare_data(num_processes, store, df, label_columns, feature_columns, validation=None, sample_weight_col=None,
                 compress_sparse=False, partitions_per_process=10, verbose=0):
    """Write ``df``'s columns as training (and validation) Parquet into ``store``; a context
    manager that yields the dataset index (int) while the data is in use.

    Args:
        num_processes: the ranks that will read the data (int >= 1).
        store: a :class:`~horovod.spark.common.store.Store`.
        df: a ``pyspark.sql.DataFrame``.
        label_columns, feature_columns: lists of column names: numeric scalars, arrays of numbers
            or ``pyspark.ml.linalg`` vectors (dense or sparse; written as arrays of doubles).
        validation: None, a fraction in [0, 1) of rows held out (``DataFrame.randomSplit`` with
            seed 0), or the name of a boolean/0-1 column marking the validation rows.
        sample_weight_col: a numeric column of per-row loss weights, or None.
        compress_sparse: accepted for upstream's scripts; vectors are always written dense.
        partitions_per_process: Parquet files per rank: the training data gets
            ``max(int(num_processes * partitions_per_process * (1 - val)), num_processes)``
            files (rounded up to a multiple of ``num_processes``, so that each rank reads the same
            number of files), the validation data ``partitions_per_process`` times fewer, at
            least ``num_processes``.
        verbose: 0, or 1 and above to print what is written.

    Raises:
        ValueError: a missing column, a column of another type, a bad ``validation``, or no rows.
    """
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError("num_processes must be a positive integer, got %r" % (num_processes,))
    label_columns, feature_columns = list(label_columns or []), list(feature_columns or [])
    if not feature_columns or not label_columns:
        raise ValueError("feature_columns and label_columns must each name at least one column")
    check_validation(validation, df)
    columns = feature_columns + label_columns + ([sample_weight_col] if sample_weight_col else [])
    if len(set(columns)) != len(columns):
        raise ValueError("a column is named twice among features, labels and sample weights: %s" % columns)
    _column_kinds(df, columns + ([validation] if isinstance(validation, str) else []))  # ValueError when bad
    key = (id(df), store.prefix_path, validation, tuple(columns))

    def prepare(idx):
        from pyspark.sql import functions as F

        val_fraction = validation if isinstance(validation, (int, float)) and validation else 0.0
        selected = None
        if isinstance(validation, str):
            marked = F.col(validation).cast("boolean")
            train_df, val_df = df.filter(~marked), df.filter(marked)
        elif val_fraction:
            # randomSplit draws per row in each partition's order; the two splits are computed by
            # two jobs, so the input is persisted: recomputed, a shuffled DataFrame could order its
            # rows differently and the splits would overlap or miss rows.
            selected = _to_columns(df, columns).persist()
            train_df, val_df = selected.randomSplit([1.0 - val_fraction, val_fraction], seed=0)
        else:
            train_df, val_df = df, None
        train_parts = max(int(num_processes * partitions_per_process * (1.0 - val_fraction)), num_processes)
        train_parts = -(-train_parts // num_processes) * num_processes
        val_parts = max(train_parts // max(partitions_per_process, 1), num_processes)
        train_path, val_path = store.get_train_data_path(idx), store.get_val_data_path(idx)
        store.remove(train_path)
        store.remove(val_path)
        try:
            _to_columns(train_df, columns).repartition(train_parts).write.parquet(train_path)
            if val_df is not None:
                _to_columns(val_df, columns).repartition(val_parts).write.parquet(val_path)
        finally:
            if selected is not None:
                selected.unpersist()
        meta = describe(store, idx)
        if meta["train_rows"] == 0:
            raise ValueError("the training data is empty (validation=%r left no training rows)" % (validation,))
        if verbose:
            print("horovod.spark: wrote %d training rows (%d row groups)%s to %s"
                  % (meta["train_rows"], len(meta["train_row_groups"]),
                     "" if val_df is None else " and %d validation rows" % meta["val_rows"], store.prefix_path))
        return meta

    idx, _meta, _new = _training_cache.acquire(key, prepare)
    try:
        yield idx
    finally:
        _training_cache.release(key)


def describe(store, idx):
    """What the ranks need to know of dataset ``idx`` in ``store``: for ``train`` and ``val``
    the path, the Parquet row groups ``(file, row group id, rows)`` and the total rows, and for every column its
    kind (``'scalar'`` or ``'array'``) and element count. ``ValueError`` when there is no
    training data."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    fs, local = store.get_arrow_filesystem()
    meta = {}
    for kind, path in (("train", store.get_train_data_path(idx)), ("val", store.get_val_data_path(idx))):
        if not store.exists(path):
            if kind == "train":
                raise ValueError("there is no training data at %s (prepare_data writes it)" % path)
            meta.update(val_path=None, val_row_groups=[], val_rows=0)
            continue
        dataset = ds.dataset(local(path), format="parquet", filesystem=fs)
        groups = []
        for fragment in sorted(dataset.get_fragments(), key=lambda f: f.path):
            groups.extend((fragment.path, rg.id, rg.num_rows) for rg in fragment.row_groups)
        meta.update({kind + "_path": path, kind + "_row_groups": groups,
                     kind + "_rows": sum(n for _, _, n in groups)})
        if kind == "train":
            head = dataset.head(1)
            kinds = {}
            for field in dataset.schema:
                if pa.types.is_list(field.type) or pa.types.is_fixed_size_list(field.type):
                    size = len(head.column(field.name)[0]) if head.num_rows else None
                    kinds[field.name] = (ARRAY, size)
                else:
                    kinds[field.name] = (SCALAR, None)
            meta["kinds"] = kinds
    return meta
