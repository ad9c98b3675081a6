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

    Each argument sets the Param of its name; one left out keeps the Param's default
    ("default" below; None where none is given).

    Args:
        num_proc: the number of ranks, one Spark task each (int >= 1). None: the backend's number;
            without a ``backend``, the active SparkContext's ``defaultParallelism``. Give ``num_proc``
            or ``backend``, not both (``ValueError``).
        model: the ``lightning.LightningModule`` to train (required): its ``training_step`` and
            ``validation_step`` get a batch dict (see above), its ``configure_optimizers`` makes the
            optimizer, and its ``forward(*features)`` is what the returned model's ``transform`` calls.
        backend: the :class:`~horovod.spark.common.backend.Backend` that runs the ranks. None:
            ``SparkBackend(num_proc=num_proc, verbose=max(0, verbose - 1))``.
        store: the :class:`~horovod.spark.common.store.Store` (required; ``Store.create(path)``) that
            holds the training and validation Parquet, written by ``fit``, and each run's checkpoint.
        optimizer: must stay None (``ValueError``): implement ``configure_optimizers`` in the module.
        loss: must stay None (``ValueError``): compute the loss in ``training_step``.
        loss_constructors: accepted for upstream's scripts and not used: ``training_step`` computes the
            loss.
        metrics: accepted for upstream's scripts and not used: log metrics with ``self.log`` in the
            module; the history holds the Trainer's ``callback_metrics`` after every epoch.
        loss_weights: must stay None (``ValueError``): weigh the losses in ``training_step``.
        sample_weight_col: the name of a numeric column of per-row loss weights, or None for none; it is
            in every batch dict under its name, for ``training_step`` to apply.
        gradient_compression: the compression of the gradients' allreduce
            (``horovod.torch.Compression.fp16``, ...), given to ``HorovodStrategy``; None: none.
        feature_cols: the names of the feature columns (a list of str, at least one), the model's inputs
            in this order: numeric scalars, arrays of numbers, or ``pyspark.ml.linalg`` vectors (written
            as arrays of doubles).
        input_shapes: the shape each feature column is reshaped to, without the batch dimension (a list
            aligned with ``feature_cols``; a tuple, or None to keep ``(batch,)`` for scalars and
            ``(batch, size)`` for arrays); the tensor becomes ``(batch, *shape)``. The returned model's
            ``transform`` reshapes the same way.
        validation: the validation rows: None for none; a fraction in [0, 1) of the rows, held out at
            random (``DataFrame.randomSplit`` with seed 0); or the name of a column, cast to boolean,
            that is true on them. The validation data is read after every training epoch, unshuffled.
        label_cols: the names of the label columns (a list of str, at least one; one per model output),
            of the same kinds as the features.
        callbacks: ``lightning.Callback`` objects added to the Trainer's callbacks on every rank. None:
            none.
        batch_size: rows per training batch on each rank (int >= 1; default 32).
        val_batch_size: rows per validation batch on each rank (int >= 1); None: ``batch_size``.
        epochs: the epochs of the run (int >= 1; default 1), counting those a resumed run (same
            ``run_id``) has done already.
        verbose: 0: quiet; 1 (default): the same as 0: the Trainer's output is set by its own arguments;
            2 and above: also the data preparation prints what it writes, and the default backend passes
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
            ``'pytorch_lightning_<Unix time in seconds>'``, a new run.
        train_minibatch_fn: accepted for upstream's scripts and not used.
        train_steps_per_epoch: training batches per epoch on every rank (int >= 1). None: the rows of
            the largest rank's shard / ``batch_size``, rounded up. All ranks run the same number: a rank
            whose shard runs out first goes on with a new shuffled pass of it.
        validation_steps_per_epoch: validation batches per epoch on each rank (int >= 1). None: all the
            rank's validation rows (the last batch may be smaller).
        transformation_fn: a function applied on the ranks to every training and validation batch,
            before it becomes tensors: it takes and returns a dict of column name -> numpy array (rows
            first). It must pickle with cloudpickle; ``transform`` does not apply it. None: none.
        train_reader_num_workers: accepted for upstream's scripts and not used (each rank reads with one
            background thread).
        val_reader_num_workers: accepted for upstream's scripts and not used (each rank reads with one
            background thread).
        reader_pool_type: accepted for upstream's scripts and not used.
        label_shapes: accepted for upstream's scripts and not used.
        inmemory_cache_all: keep the rank's training and validation rows in memory once read, instead of
            reading the Parquet again every epoch (bool; default False).
        use_gpu: train on one GPU (``accelerator='gpu', devices=1``) when CUDA is available (bool;
            default True); False, or no CUDA: on the CPU.
        mp_start_method: accepted for upstream's scripts and not used.
        trainer_args: further keyword arguments of ``lightning.Trainer`` (a dict), applied last, so they
            replace the estimator's. None: none.
        num_gpus: accepted for upstream's scripts and not used: a rank uses one GPU when ``use_gpu`` and
            CUDA is available.
        logger: the Trainer's ``logger``; None (default): no logger.
        log_every_n_steps: the Trainer's ``log_every_n_steps`` (int; default 50).
        data_module: accepted for upstream's scripts and not used: the Parquet reader is built in.
        loader_num_epochs: accepted for upstream's scripts and not used.
        terminate_on_nan: passed as the Trainer's ``detect_anomaly`` (bool; default False): PyTorch's
            autograd anomaly detection, which raises, failing the fit, when a backward pass produces
            NaN.
        profiler: the Trainer's ``profiler`` (a Lightning profiler or its name); None: none.
        debug_data_loader: accepted for upstream's scripts and not used.
        train_async_data_loader_queue_size: training batches each rank's reader reads ahead (int >= 1);
            None: 8.
        val_async_data_loader_queue_size: accepted for upstream's scripts and not used.
        shuffle: shuffle the training rows every epoch (bool; default True); the validation rows are
            read in order.

    Raises:
        ValueError: ``fit``: the model is not a ``LightningModule``; ``optimizer``, ``loss`` or
            ``loss_weights`` set (implement ``configure_optimizers`` / ``training_step``).
        RuntimeError: ``fit``: a rank failed (named, with its traceback).
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

    def _remote_trainer(self, meta, run_id):
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
