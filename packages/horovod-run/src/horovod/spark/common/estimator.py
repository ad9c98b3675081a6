"""The framework-independent half of the Estimators: :class:`HorovodEstimator` (check the
params, write the data, run the ranks, build the model) and :class:`HorovodModel` (the Spark ML
``Transformer`` that appends predictions), both saved and loaded as Spark ML stages.

A framework supplies, on the estimator, ``_check_params``, ``_remote_trainer`` (the function each
rank runs, see :mod:`horovod.spark.common.remote`) and ``_create_model``; on the model,
``_predictor`` (a picklable function from a list of numpy feature arrays to a list of numpy
outputs, one per label).
"""

import secrets
import time
from typing import Iterator, Tuple

import numpy as np
import pyarrow as pa
from pyspark.ml import Estimator, Model
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader, MLWritable, MLWriter

from horovod.runner.common.util import codec
from horovod.spark.common import data, params, remote
from horovod.spark.common.backend import SparkBackend
from horovod.spark.common.store import Store

_PARAMS_KEY = "horovodParams"


class _Writer(MLWriter):
    """Writes a stage as Spark ML metadata (a JSON line under ``<path>/metadata``) whose
    ``horovodParams`` holds the stage's set params as base64 cloudpickle."""

    def __init__(self, instance):
        super().__init__()
        self.instance = instance

    def saveImpl(self, path):
        values = {p.name: v for p, v in self.instance._paramMap.items()}
        blob = codec.dumps_base64(values)
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sc, paramMap={},
                                         extraMetadata={"defaultParamMap": {}, _PARAMS_KEY: blob})


class _Reader(MLReader):
    def __init__(self, cls):
        super().__init__()
        self.cls = cls

    def load(self, path):
        metadata = DefaultParamsReader.loadMetadata(path, self.sc)
        if _PARAMS_KEY not in metadata:
            raise ValueError("%s holds no horovod.spark stage (its metadata has no %s)" % (path, _PARAMS_KEY))
        values = codec.loads_base64(metadata[_PARAMS_KEY])
        instance = self.cls()
        instance._resetUid(metadata["uid"])
        instance._set(**values)
        return instance


class _Persistence(MLWritable, MLReadable):
    def write(self):
        """An ``MLWriter`` of this stage (``.save(path)``, ``.overwrite()``)."""
        return _Writer(self)

    @classmethod
    def read(cls):
        return _Reader(cls)


class HorovodEstimator(Estimator, params.EstimatorParams, _Persistence):
    """The base of the Estimators; ``fit(df)`` trains on every rank and returns a model."""

    # The run_id prefix of runs started without one.
    _run_prefix = "horovod"

    def __init__(self):
        super().__init__()
        params.set_defaults(self)

    def setParams(self, **kwargs):
        """Set the params named by ``kwargs``; returns self."""
        return self._set(**kwargs)

    # Checks.

    def _check_common(self):
        if self.getModel() is None:
            raise ValueError("model is not set: pass model=... to the estimator")
        if not self.getFeatureCols() or not self.getLabelCols():
            raise ValueError("feature_cols and label_cols must each name at least one column")
        for name in ("batch_size", "epochs"):
            value = self.getOrDefault(name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError("%s must be a positive integer, got %r" % (name, value))
        for name in ("val_batch_size", "train_steps_per_epoch", "validation_steps_per_epoch"):
            value = self.getOrDefault(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError("%s must be None or a positive integer, got %r" % (name, value))
        if self.getStore() is None:
            raise ValueError("store is not set: pass store=Store.create(path) to the estimator")
        if not isinstance(self.getStore(), Store):
            raise ValueError("store must be a horovod.spark.common.store.Store, got %s"
                             % type(self.getStore()).__name__)
        if self.getNumProc() is not None and self.getBackend() is not None:
            raise ValueError("set num_proc or backend, not both (a backend knows its number of ranks)")
        data.check_validation(self.getValidation())
        self._check_params()

    def _check_params(self):
        """Framework checks; raise ``ValueError``."""

    def _backend(self):
        return self.getBackend() or SparkBackend(num_proc=self.getNumProc(), verbose=max(0, self.getVerbose() - 1))

    def _columns(self):
        return list(self.getFeatureCols()) + list(self.getLabelCols()) + (
            [self.getSampleWeightCol()] if self.getSampleWeightCol() else [])

    # Fitting.

    def fit_on_parquet(self, params=None, dataset_idx=None):
        """Train on data already in the store (written by ``prepare_data`` with index
        ``dataset_idx``, int or None); returns the model. Raises ``ValueError`` as ``fit``."""
        if params:
            return self.copy(params).fit_on_parquet(dataset_idx=dataset_idx)
        self._check_common()
        backend = self._backend()
        meta = data.describe(self.getStore(), dataset_idx)
        return self._fit_prepared(backend, meta)

    def _fit(self, df):
        self._check_common()
        backend = self._backend()
        with data.prepare_data(backend.num_processes(), self.getStore(), df, label_columns=self.getLabelCols(),
                               feature_columns=self.getFeatureCols(), validation=self.getValidation(),
                               sample_weight_col=self.getSampleWeightCol(),
                               partitions_per_process=self.getPartitionsPerProcess(),
                               verbose=self.getVerbose() >= 2) as idx:
            meta = data.describe(self.getStore(), idx)
            return self._fit_prepared(backend, meta)

    def _fit_prepared(self, backend, meta):
        missing = [c for c in self._columns() if c not in meta["kinds"]]
        if missing:
            raise ValueError("the prepared data has no column(s) %s (it has %s)" % (missing, sorted(meta["kinds"])))
        run_id = self.getRunId() or "%s_%d" % (self._run_prefix, int(time.time()))
        trainer = self._remote_trainer(meta, run_id)
        results = backend.run(trainer, env=self._rank_env())
        return self._create_model(results[0], run_id, meta)

    def _rank_env(self):
        return {}

    def _train_spec(self, meta, run_id):
        """The :class:`~horovod.spark.common.remote.TrainSpec` of this estimator's params."""
        seed = self.getRandomSeed()
        return remote.TrainSpec(
            store=self.getStore(), run_id=run_id, meta=meta, feature_cols=list(self.getFeatureCols()),
            label_cols=list(self.getLabelCols()), sample_weight_col=self.getSampleWeightCol(),
            batch_size=self.getBatchSize(), val_batch_size=self.getValBatchSize(), epochs=self.getEpochs(),
            seed=int(seed) if seed is not None else secrets.randbelow(2 ** 31), shuffle=self.getShuffle(),
            shuffle_buffer_size=self.getShufflingBufferSize(), train_steps_per_epoch=self.getTrainStepsPerEpoch(),
            validation_steps_per_epoch=self.getValidationStepsPerEpoch(),
            transformation_fn=self.getTransformationFn(), inmemory_cache_all=self.getInMemoryCacheAll(),
            verbose=self.getVerbose())

    def _remote_trainer(self, meta, run_id):
        raise NotImplementedError()

    def _create_model(self, result, run_id, meta):
        raise NotImplementedError()


class HorovodModel(Model, params.ModelParams, _Persistence):
    """A trained model as a Spark ML ``Transformer``: ``transform(df)`` appends one prediction
    column per label (``<label>__output`` unless ``setOutputCols``), computed on the executors'
    CPUs; a prediction with one element per row is a double column, else an array of doubles."""

    def __init__(self):
        super().__init__()
        params.set_defaults(self)

    def setLabelColoumns(self, value):
        """``setLabelColumns`` as upstream spells it."""
        return self.setLabelColumns(value)

    def getOutputCols(self):
        cols = self.getOrDefault(self.output_cols)
        return list(cols) if cols else ["%s__output" % c for c in self.getLabelColumns()]

    def _predictor(self):
        raise NotImplementedError()

    def _transform(self, df):
        from pyspark.ml.functions import vector_to_array
        from pyspark.ml.linalg import VectorUDT
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        outputs = self.getOutputCols()
        if len(outputs) != len(self.getLabelColumns()):
            raise Exception("%d output columns %s for %d label columns %s" % (
                len(outputs), outputs, len(self.getLabelColumns()), self.getLabelColumns()))
        clash = [c for c in outputs if c in df.columns]
        if clash:
            raise ValueError("the DataFrame already has column(s) %s; choose other names with setOutputCols" % clash)
        fields = {f.name: f.dataType for f in df.schema.fields}
        inputs = []
        for c in self.getFeatureColumns():
            if c not in fields:
                raise ValueError("feature column %r is not in the DataFrame (its columns: %s)" % (c, sorted(fields)))
            inputs.append(vector_to_array(F.col(c)) if isinstance(fields[c], VectorUDT) else F.col(c))
        # The output types, from one row predicted here (by a predictor of its own: the one that
        # travels must not carry the model it loaded here).
        sample = df.select(*inputs).limit(1).collect()
        if not sample:
            types = [T.DoubleType()] * len(outputs)
        else:
            shapes = [np.asarray(o).reshape(1, -1).shape[1] for o in
                      self._predictor()([np.asarray([v], dtype=_dtype(v)) for v in sample[0]])]
            types = [T.DoubleType() if n == 1 else T.ArrayType(T.DoubleType()) for n in shapes]
        predict = self._predictor()
        struct = T.StructType([T.StructField(name, t) for name, t in zip(outputs, types, strict=True)])

        def run(batches: Iterator[Tuple[pa.Array, ...]]) -> Iterator[pa.Array]:  # noqa: UP006
            for columns in batches:
                if not isinstance(columns, tuple):
                    columns = (columns,)
                arrays = [_arrow_to_numpy(c) for c in columns]
                results = predict(arrays)
                out = []
                for result, t in zip(results, types, strict=True):
                    result = np.asarray(result, dtype=np.float64).reshape(len(arrays[0]), -1)
                    if isinstance(t, T.DoubleType):
                        out.append(pa.array(result[:, 0]))
                    else:
                        out.append(pa.array(list(result)))
                yield pa.StructArray.from_arrays(out, names=outputs)

        udf = F.arrow_udf(run, struct)
        tmp = "__horovod_outputs__"
        return df.withColumn(tmp, udf(*inputs)).select(
            *[F.col(c) for c in df.columns], *[F.col(tmp)[name].alias(name) for name in outputs])


def _dtype(value):
    if isinstance(value, (list, tuple)):
        return np.float64 if any(isinstance(v, float) for v in value) else None
    return None


def _arrow_to_numpy(column):
    """A Spark Arrow batch column as numpy: scalars 1-d, arrays ``(rows, size)``."""
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        flat = column.flatten().to_numpy(zero_copy_only=False)
        return flat.reshape(len(column), -1) if len(column) else flat.reshape(0, 0)
    return column.to_numpy(zero_copy_only=False)

