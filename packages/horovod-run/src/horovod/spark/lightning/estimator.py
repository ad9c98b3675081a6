"""The Lightning ``TorchEstimator``: the module's own ``training_step``, ``validation_step`` and
``configure_optimizers`` run by ``lightning.Trainer`` with ``HorovodStrategy`` on each rank; the
data, checkpoints and the returned :class:`~horovod.spark.torch.TorchModel` are the torch
estimator's."""

import cloudpickle
from pyspark import keyword_only

from horovod.spark.common import params
from horovod.spark.common.estimator import HorovodEstimator
from horovod.spark.torch.estimator import TorchModel

__all__ = ["TorchEstimator", "TorchModel"]


class LightningEstimatorParams(params.EstimatorParams):
    """The params of the Lightning :class:`TorchEstimator`."""


params.declare(LightningEstimatorParams, [
    ("data_module", None, "accepted for upstream's scripts; the Parquet reader is built in"),
    ("loss_constructors", None, "not used with a LightningModule (its training_step computes the loss)"),
    ("input_shapes", None, "shapes each feature column is reshaped to, without the batch dimension"),
    ("train_minibatch_fn", None, "not used with a LightningModule"),
    ("trainer_args", None, "further keyword arguments of lightning.Trainer (a dict)"),
    ("num_gpus", None, "accepted for upstream's scripts; a rank uses its GPU when use_gpu and one is there"),
    ("logger", None, "the Trainer's logger; default none"),
    ("log_every_n_steps", 50, "the Trainer's log_every_n_steps"),
    ("loader_num_epochs", None, "accepted for upstream's scripts"),
    ("terminate_on_nan", False, "stop the training when the loss is NaN (the Trainer's detect_anomaly)"),
    ("profiler", None, "the Trainer's profiler"),
    ("debug_data_loader", False, "accepted for upstream's scripts"),
    ("train_async_data_loader_queue_size", None, "batches read ahead (the reader's prefetch)"),
    ("val_async_data_loader_queue_size", None, "accepted for upstream's scripts"),
])


class TorchEstimator(HorovodEstimator, LightningEstimatorParams):
    """Trains a ``lightning.LightningModule`` on a Spark DataFrame with Horovod; ``fit(df)``
    returns a :class:`~horovod.spark.torch.TorchModel`.

    Keyword-only (positional arguments raise ``TypeError``). Each rank runs
    ``lightning.Trainer(strategy=HorovodStrategy(), devices=1, max_epochs=epochs,
    limit_train_batches=<equal steps>, **trainer_args)`` on its shard. A batch is a dict of column
    name -> tensor (float32 for floating point and booleans, int64 for integers; ``(batch,)`` for
    scalars, ``(batch, size)`` for arrays and vectors). The module's learning rate is used as it
    is (scale it by ``hvd.size()`` in ``configure_optimizers`` when wanted). ``transform`` calls
    ``model(*features)`` as :class:`~horovod.spark.torch.TorchModel` does, so ``forward`` takes
    the feature columns in order. The history holds the Trainer's logged metrics per epoch.

    Raises (from ``fit``):
        ValueError: the model is not a ``LightningModule``; ``optimizer``, ``loss`` or
            ``loss_weights`` set (implement ``configure_optimizers`` / ``training_step``).
        RuntimeError: a rank failed (named, with its traceback).
    """

    _run_prefix = "pytorch_lightning"

    @keyword_only
    def __init__(self, num_proc=None, model=None, backend=None, store=None, optimizer=None, loss=None,
                 loss_constructors=None, metrics=None, loss_weights=None, sample_weight_col=None,
                 gradient_compression=None, feature_cols=None, input_shapes=None, validation=None, label_cols=None,
                 callbacks=None, batch_size=None, val_batch_size=None, epochs=None, verbose=1, random_seed=None,
                 shuffle_buffer_size=None, partitions_per_process=None, run_id=None, train_minibatch_fn=None,
                 train_steps_per_epoch=None, validation_steps_per_epoch=None, transformation_fn=None,
                 train_reader_num_workers=None, val_reader_num_workers=None, reader_pool_type=None,
                 label_shapes=None, inmemory_cache_all=False, use_gpu=True, mp_start_method=None, trainer_args=None,
                 num_gpus=None, logger=None, log_every_n_steps=50, data_module=None, loader_num_epochs=None,
                 terminate_on_nan=False, profiler=None, debug_data_loader=False,
                 train_async_data_loader_queue_size=None, val_async_data_loader_queue_size=None, shuffle=True):
        super().__init__()
        self.setParams(**self._input_kwargs)

    def _check_params(self):
        import lightning

        if not isinstance(self.getModel(), lightning.LightningModule):
            raise ValueError("model must be a lightning.LightningModule, got %s" % type(self.getModel()).__name__)
        for name, hook in (("optimizer", "configure_optimizers"), ("loss", "training_step"),
                           ("loss_weights", "training_step")):
            if self.getOrDefault(name) is not None:
                raise ValueError("%s is set, but a LightningModule brings its own: implement %s in the module "
                                 "instead" % (name, hook))

    def _remote_trainer(self, meta, run_id, num_proc):
        from horovod.spark.lightning import remote

        spec = self._train_spec(meta, run_id)
        settings = dict(model=cloudpickle.dumps(self.getModel()), callbacks=cloudpickle.dumps(
            list(self.getCallbacks() or [])), trainer_args=dict(self.getTrainerArgs() or {}),
            logger=self.getLogger(), log_every_n_steps=self.getLogEveryNSteps(),
            detect_anomaly=self.getTerminateOnNan(), profiler=self.getProfiler(), use_gpu=self.getUseGpu(),
            input_shapes=self.getInputShapes(), compression=self.getGradientCompression(),
            prefetch=self.getTrainAsyncDataLoaderQueueSize())
        return remote.trainer(spec, settings)

    def _create_model(self, result, run_id, meta):
        model = cloudpickle.loads(result["model"])
        return TorchModel(history=result["history"], model=model, feature_columns=list(self.getFeatureCols()),
                          input_shapes=self.getInputShapes(), label_columns=list(self.getLabelCols()), run_id=run_id,
                          _metadata=meta)
