"""``KerasEstimator`` and ``KerasModel``: a Keras 3 model trained with ``horovod.keras``
(``model.fit`` with ``hvd.DistributedOptimizer``) on the ranks of a Spark job."""

import cloudpickle
import numpy as np
from pyspark import keyword_only

from horovod.spark.common import params
from horovod.spark.common.estimator import HorovodEstimator, HorovodModel


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


def to_arrays(batch, columns):
    """The columns of ``batch`` as numpy arrays for Keras: floating point and booleans as
    float32, integers as int64."""
    out = []
    for name in columns:
        value = np.asarray(batch[name])
        if value.dtype.kind in "fb":
            value = value.astype(np.float32, copy=False)
        elif value.dtype.kind in "iu":
            value = value.astype(np.int64, copy=False)
        out.append(value)
    return out


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

    Raises (from ``fit``):
        ValueError: the model is not a ``keras.Model``, no optimizer or loss, a bad param or column.
        RuntimeError: a rank failed (named, with its traceback).
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

    def _remote_trainer(self, meta, run_id, num_proc):
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
