"""The Spark ML ``Param``s of the Estimators and their models, each with a ``set<Name>`` and a
``get<Name>`` accessor generated from one table (spec/spark.md §8 lists names and defaults)."""

from pyspark.ml.param import Param, Params


def _camel(name):
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


# (name, default, doc); an accessor name that is not the camel-cased name follows as a fourth item.
ESTIMATOR_PARAMS = [
    ("num_proc", None, "number of Horovod ranks (one Spark task each); default the backend's"),
    ("store", None, "the Store that holds the intermediate data and the runs"),
    ("backend", None, "the Backend that runs the ranks; default SparkBackend(num_proc)"),
    ("model", None, "the model to train"),
    ("optimizer", None, "the optimizer (its learning rate is scaled by the number of ranks while training)"),
    ("loss", None, "the loss: a function of (output, label) or one per label column"),
    ("loss_weights", None, "weights of the label columns' losses (a list of floats)"),
    ("sample_weight_col", None, "column of per-row loss weights"),
    ("metrics", [], "metrics: functions of (output, label) averaged over the batches"),
    ("feature_cols", None, "feature column names (the model's inputs, in order)"),
    ("label_cols", None, "label column names (one per model output)"),
    ("continuous_cols", None, "continuous feature columns (accepted for upstream's scripts)"),
    ("categorical_cols", None, "categorical feature columns (accepted for upstream's scripts)"),
    ("validation", None, "a fraction in [0, 1) of rows held out, or the name of a boolean column that marks them"),
    ("gradient_compression", None, "horovod Compression for the allreduce of the gradients"),
    ("compress_sparse_cols", False, "accepted for upstream's scripts; sparse vectors are written dense"),
    ("batch_size", 32, "rows per batch on each rank"),
    ("val_batch_size", None, "rows per validation batch on each rank; default batch_size"),
    ("epochs", 1, "passes over the training data"),
    ("verbose", 1, "0: quiet, 1: a line per epoch on rank 0, 2: more"),
    ("callbacks", [], "callbacks of the framework's training loop"),
    ("random_seed", None, "seed of the per-epoch shuffle of the training rows (None: a new one each fit)"),
    ("shuffle_buffer_size", None, "rows the reader shuffles together; default the rank's whole shard",
     "ShufflingBufferSize"),
    ("shuffle", True, "shuffle the training rows every epoch"),
    ("partitions_per_process", 10, "Parquet files written per rank"),
    ("run_id", None, "name of the run in the store; an existing run resumes from its checkpoint"),
    ("train_steps_per_epoch", None, "batches per epoch on each rank; default the largest rank shard / batch_size"),
    ("validation_steps_per_epoch", None, "validation batches per epoch on each rank"),
    ("transformation_fn", None, "a function applied to every batch (a dict of column name -> numpy array)"),
    ("transformation_edit_fields", None, "accepted for upstream's scripts"),
    ("transformation_removed_fields", None, "accepted for upstream's scripts"),
    ("train_reader_num_workers", 2, "accepted for upstream's scripts (one reader thread per rank)",
     "TrainReaderNumWorker"),
    ("val_reader_num_workers", 2, "accepted for upstream's scripts (one reader thread per rank)",
     "ValReaderNumWorker"),
    ("reader_pool_type", "thread", "accepted for upstream's scripts"),
    ("label_shapes", None, "shapes the label columns are reshaped to (a list of tuples)"),
    ("inmemory_cache_all", False, "keep the rank's shard in memory after the first epoch", "InMemoryCacheAll"),
    ("use_gpu", True, "train on the rank's GPU when there is one", "UseGpu"),
    ("mp_start_method", None, "accepted for upstream's scripts"),
    ("backward_passes_per_step", 1, "batches whose gradients are accumulated before one allreduce"),
]

MODEL_PARAMS = [
    ("history", None, "per-epoch metrics of the training (a dict of lists)"),
    ("model", None, "the trained model"),
    ("feature_columns", None, "feature column names", "FeatureColumns"),
    ("label_columns", None, "label column names", "LabelColumns"),
    ("output_cols", None, "names of the prediction columns; default <label>__output"),
    ("run_id", None, "the run that trained the model"),
    ("_metadata", None, "the training data's column metadata"),
]


def _accessors(name, accessor):
    def getter(self):
        return self.getOrDefault(getattr(self, name))

    def setter(self, value):
        return self._set(**{name: value})

    getter.__name__ = "get" + accessor
    setter.__name__ = "set" + accessor
    getter.__doc__ = "The value of Param ``%s``." % name
    setter.__doc__ = "Set Param ``%s``; returns self." % name
    return getter, setter


def declare(cls, table):
    """Give ``cls`` (a ``Params`` subclass) one class-level ``Param`` and a getter and setter per
    row of ``table``; returns ``cls``. Defaults are set by :func:`set_defaults`."""
    for row in table:
        name, _default, doc = row[:3]
        accessor = row[3] if len(row) > 3 else _camel(name.lstrip("_"))
        setattr(cls, name, Param(Params._dummy(), name, doc))
        getter, setter = _accessors(name, accessor)
        if not hasattr(cls, getter.__name__):
            setattr(cls, getter.__name__, getter)
        if not hasattr(cls, setter.__name__):
            setattr(cls, setter.__name__, setter)
    cls._param_table = getattr(cls, "_param_table", []) + list(table)
    return cls


def set_defaults(instance):
    """Set the defaults of every row of the instance's tables (fresh copies of lists/dicts)."""
    defaults = {}
    for row in instance._param_table:
        name, default = row[:2]
        defaults[name] = type(default)(default) if isinstance(default, (list, dict)) else default
    instance._setDefault(**defaults)


class EstimatorParams(Params):
    """The Params every Estimator shares (spec/spark.md §8 names and defaults)."""


declare(EstimatorParams, ESTIMATOR_PARAMS)


class ModelParams(Params):
    """The Params every trained model shares."""


declare(ModelParams, MODEL_PARAMS)
