"""``KerasEstimator`` and ``KerasModel``: a Keras 3 model trained with ``horovod.keras``
(``model.fit`` with ``hvd.DistributedOptimizer``) on the ranks of a Spark job."""

import cloudpickle
import numpy as np
from pyspark import keyword_only

from horovod.spark.common import params
from horovod.spark.common.estimator import HorovodEstimator, HorovodModel
from horovod.spark.common.remote import to_arrays


class KerasEstimatorParams(params.EstimatorParams):
    """The params of :class:`KerasEstimator`."""


params.declare(KerasEstimatorParams, [
    ("data_module", None, "accepted for upstream's scripts; the Parquet reader is built in"),
    ("custom_objects", {}, "custom Keras objects the model needs to load (a dict of name -> object)"),
    ("checkpoint_callback", None, "accepted for upstream's scripts; rank 0 checkpoints every epoch into the store"),
    ("backend_env", {"LIBHDFS_OPTS": "-Xms2048m -Xmx2048m"}, "variables added to the ranks' environment"),
])


class KerasModelParams(params.ModelParams):
    """The params of :class:`KerasModel`."""


params.declare(KerasModelParams, [
    ("custom_objects", {}, "custom Keras objects of the model"),
    ("_floatx", None, "keras.config.floatx() of the training"),
])


class KerasEstimator(HorovodEstimator, KerasEstimatorParams):
    """Trains a Keras 3 model (``keras.Model``) on a Spark DataFrame with Horovod; ``fit(df)``
    returns a :class:`KerasModel`.

    Keyword-only (positional arguments raise ``TypeError``); the params of spec/spark.md §8 plus
    ``data_module``, ``custom_objects``, ``checkpoint_callback`` and ``backend_env``.

    Each rank compiles the model with ``optimizer`` (a Keras optimizer; its learning rate scaled
    by the number of ranks and the optimizer wrapped in ``horovod.keras.DistributedOptimizer``),
    ``loss``, ``loss_weights`` and ``metrics``, and runs ``model.fit`` on batches of its shard: the
    inputs are one array per feature column (float32 for floating point and booleans, int64 for
    integers; ``(batch,)`` for scalars, ``(batch, size)`` for arrays and vectors) in the order of
    ``feature_cols`` (a single array for one column), the targets likewise per label column.
    ``callbacks`` are Keras callbacks, run on every rank after Horovod's broadcast and metric
    averaging callbacks. The ranks' shell environment gets ``backend_env``; ``KERAS_BACKEND``
    must be ``tensorflow`` (the default).

    Checkpoints hold the weights, the optimizer's variables (slots and iteration count; a resumed
    run keeps its own learning rate), the epoch and the history.

    Each argument sets the Param of its name; one left out keeps the Param's default
    ("default" below; None where none is given).

    Args:
        num_proc: the number of ranks, one Spark task each (int >= 1). None: the backend's number;
            without a ``backend``, the active SparkContext's ``defaultParallelism``. Give ``num_proc``
            or ``backend``, not both (``ValueError``).
        model: the ``keras.Model`` to train (required); each rank gets a cloudpickled copy.
        backend: the :class:`~horovod.spark.common.backend.Backend` that runs the ranks. None:
            ``SparkBackend(num_proc=num_proc, verbose=max(0, verbose - 1))``.
        store: the :class:`~horovod.spark.common.store.Store` (required; ``Store.create(path)``) that
            holds the training and validation Parquet, written by ``fit``, and each run's checkpoint.
        custom_objects: the custom Keras objects the model needs (a dict of name -> object; default
            empty), in scope when the ranks load the model; kept on the returned model.
        optimizer: a ``keras.optimizers.Optimizer`` (required): each rank rebuilds it from its class and
            ``get_config()``, with the learning rate multiplied by the number of ranks.
        loss: passed to ``model.compile`` (required): a Keras loss, its name, or one per output.
        loss_weights: passed to ``model.compile``: a list of floats, one per output, or a dict by output
            name; None: 1.0 each.
        sample_weight_col: the name of a numeric column of per-row loss weights, given to ``model.fit``
            with each batch, or None for none.
        metrics: passed to ``model.compile`` (Keras metrics or their names); averaged over the ranks at
            the end of every epoch. None: none.
        feature_cols: the names of the feature columns (a list of str, at least one), the model's inputs
            in this order: numeric scalars, arrays of numbers, or ``pyspark.ml.linalg`` vectors (written
            as arrays of doubles).
        label_cols: the names of the label columns (a list of str, at least one; one per model output),
            of the same kinds as the features.
        continuous_cols: accepted for upstream's scripts and not used.
        categorical_cols: accepted for upstream's scripts and not used.
        validation: the validation rows: None for none; a fraction in [0, 1) of the rows, held out at
            random (``DataFrame.randomSplit`` with seed 0); or the name of a column, cast to boolean,
            that is true on them. The validation data is read after every training epoch, unshuffled.
        callbacks: Keras callbacks, run on every rank after Horovod's broadcast and metric averaging
            callbacks; cloudpickled to the ranks. None: none.
        batch_size: rows per training batch on each rank (int >= 1; default 32).
        val_batch_size: rows per validation batch on each rank (int >= 1); None: ``batch_size``.
        epochs: the epochs of the run (int >= 1; default 1), counting those a resumed run (same
            ``run_id``) has done already.
        verbose: 0: quiet; 1 (default): rank 0's ``model.fit`` prints a line per epoch; 2 and above:
            also the data preparation prints what it writes, and the default backend passes
            ``verbose - 1`` to :func:`horovod.spark.run`.
        random_seed: the seed (int) of the training rows' shuffle: epoch ``e`` of rank ``r`` draws from
            ``numpy.random.default_rng([seed, e, r])``, so fits with the same seed, data and number of
            ranks read the same batches. None: a random seed drawn for each ``fit``. The model's initial
            weights are those it was given (or the checkpoint's); the seed does not touch them.
        shuffle_buffer_size: rows shuffled together (int >= 1): every epoch the rank's row groups are
            read in a shuffled order and the rows of each window of this many rows are shuffled. None:
            the rank's whole shard (a full shuffle). Not used when ``shuffle`` is False.
        partitions_per_process: Parquet files written per rank (int >= 1; default 10): the training data
            gets ``num_proc * partitions_per_process * (1 - validation fraction)`` files, at least
            ``num_proc`` and rounded up to a multiple of it, so that every rank reads as many files; the
            validation data ``partitions_per_process`` times fewer, at least ``num_proc``.
        run_id: the run's name in the store (str): rank 0 writes ``<runs path>/<run_id>/checkpoint``
            after every epoch (when the store keeps runs), and a ``fit`` whose run has a checkpoint
            resumes at the epoch after it, with its weights, optimizer state and history. None:
            ``'keras_<Unix time in seconds>'``, a new run.
        train_steps_per_epoch: training batches per epoch on every rank (int >= 1). None: the rows of
            the largest rank's shard / ``batch_size``, rounded up. All ranks run the same number: a rank
            whose shard runs out first goes on with a new shuffled pass of it.
        validation_steps_per_epoch: validation batches per epoch on each rank (int >= 1). None: all the
            rank's validation rows (the last batch may be smaller).
        transformation_fn: a function applied on the ranks to every training and validation batch,
            before it becomes arrays for Keras: it takes and returns a dict of column name -> numpy
            array (rows first). It must pickle with cloudpickle; ``transform`` does not apply it. None:
            none.
        train_reader_num_workers: accepted for upstream's scripts and not used (each rank reads with one
            background thread).
        val_reader_num_workers: accepted for upstream's scripts and not used (each rank reads with one
            background thread).
        reader_pool_type: accepted for upstream's scripts and not used.
        label_shapes: accepted for upstream's scripts and not used.
        checkpoint_callback: accepted for upstream's scripts and not used: rank 0 writes the run's
            checkpoint after every epoch.
        inmemory_cache_all: keep the rank's training and validation rows in memory once read, instead of
            reading the Parquet again every epoch (bool; default False).
        backend_env: variables added to the ranks' environment (a dict of str -> str; default
            ``{'LIBHDFS_OPTS': '-Xms2048m -Xmx2048m'}``); ``KERAS_BACKEND=tensorflow`` is added unless
            it is given.
        use_gpu: accepted for upstream's scripts and not used: TensorFlow places the model as it does by
            default.
        mp_start_method: accepted for upstream's scripts and not used.
        data_module: accepted for upstream's scripts and not used: the Parquet reader is built in.
        shuffle: shuffle the training rows every epoch (bool; default True); the validation rows are
            read in order.
        gradient_compression: the compression of the gradients' allreduce
            (``horovod.keras.Compression.fp16``, ...), given to ``horovod.keras.DistributedOptimizer``;
            None: none.

    Raises:
        ValueError: ``fit``: the model is not a ``keras.Model``, no optimizer or loss, a bad param or column.
        RuntimeError: ``fit``: a rank failed (named, with its traceback).
    """

    _run_prefix = "keras"

    @keyword_only
    def __init__(self, num_proc=None, model=None, backend=None, store=None, custom_objects=None, optimizer=None,
                 loss=None, loss_weights=None, sample_weight_col=None, metrics=None, feature_cols=None,
                 label_cols=None, continuous_cols=None, categorical_cols=None, validation=None, callbacks=None,
                 batch_size=None, val_batch_size=None, epochs=None, verbose=1, random_seed=None,
                 shuffle_buffer_size=None, partitions_per_process=None, run_id=None, train_steps_per_epoch=None,
                 validation_steps_per_epoch=None, transformation_fn=None, train_reader_num_workers=None,
                 val_reader_num_workers=None, reader_pool_type=None, label_shapes=None, checkpoint_callback=None,
                 inmemory_cache_all=False, backend_env=None, use_gpu=True, mp_start_method=None, data_module=None,
                 shuffle=True, gradient_compression=None):
        super().__init__()
        self.setParams(**self._input_kwargs)

    def _check_params(self):
        import keras

        if not isinstance(self.getModel(), keras.Model):
            raise ValueError("model must be a keras.Model (Keras 3), got %s" % type(self.getModel()).__name__)
        if not isinstance(self.getOptimizer(), keras.optimizers.Optimizer):
            raise ValueError("optimizer must be a keras.optimizers.Optimizer, got %r" % (self.getOptimizer(),))
        if self.getLoss() is None:
            raise ValueError("loss is not set: pass loss=... (a Keras loss, its name, or one per label)")

    def _rank_env(self):
        env = dict(self.getBackendEnv() or {})
        env.setdefault("KERAS_BACKEND", "tensorflow")
        return env

    def _remote_trainer(self, meta, run_id):
        from horovod.spark.keras import remote

        spec = self._train_spec(meta, run_id)
        optimizer = self.getOptimizer()
        settings = dict(model=cloudpickle.dumps(self.getModel()),
                        optimizer=(type(optimizer), optimizer.get_config()), loss=self.getLoss(),
                        loss_weights=self.getLossWeights(), metrics=list(self.getMetrics() or []),
                        callbacks=cloudpickle.dumps(list(self.getCallbacks() or [])),
                        custom_objects=self.getCustomObjects(), compression=self.getGradientCompression())
        return remote.trainer(spec, settings)

    def _create_model(self, result, run_id, meta):
        import keras

        model = cloudpickle.loads(cloudpickle.dumps(self.getModel()))
        model.set_weights(result["weights"])
        return KerasModel(history=result["history"], model=model, feature_columns=list(self.getFeatureCols()),
                          label_columns=list(self.getLabelCols()), custom_objects=self.getCustomObjects(),
                          run_id=run_id, _metadata=meta, _floatx=keras.config.floatx())


class KerasModel(HorovodModel, KerasModelParams):
    """A trained Keras model; ``transform(df)`` appends its predictions (see
    :class:`~horovod.spark.common.estimator.HorovodModel`). Keyword-only constructor:
    ``history, model, feature_columns, label_columns, custom_objects, run_id, _metadata, _floatx``."""

    @keyword_only
    def __init__(self, history=None, model=None, feature_columns=None, label_columns=None, custom_objects=None,
                 run_id=None, _metadata=None, _floatx=None):
        super().__init__()
        self._set(**self._input_kwargs)

    def _predictor(self):
        model_bytes = cloudpickle.dumps(self.getModel())
        names = list(self.getFeatureColumns())
        cache = {}

        def predict(arrays):
            if "model" not in cache:
                cache["model"] = cloudpickle.loads(model_bytes)
            inputs = to_arrays(dict(zip(names, arrays, strict=True)), names)
            outputs = cache["model"].predict_on_batch(inputs[0] if len(inputs) == 1 else inputs)
            if not isinstance(outputs, (tuple, list)):
                outputs = [outputs]
            return [np.asarray(o) for o in outputs]

        return predict
