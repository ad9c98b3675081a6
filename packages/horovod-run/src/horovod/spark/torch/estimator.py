"""``TorchEstimator`` and ``TorchModel``: a ``torch.nn.Module`` trained with ``horovod.torch``
on the ranks of a Spark job."""

import cloudpickle
from pyspark import keyword_only

from horovod.spark.common import params
from horovod.spark.common.estimator import HorovodEstimator, HorovodModel
from horovod.spark.torch import remote
from horovod.spark.torch.remote import to_tensors

_TORCH_PARAMS = [
    ("data_module", None, "accepted for upstream's scripts; the Parquet reader is built in"),
    ("loss_constructors", None, "functions of no arguments that make the loss, one per label (instead of loss)"),
    ("input_shapes", None, "shapes each feature column is reshaped to, without the batch dimension"),
    ("train_minibatch_fn", None, "replaces one training step: fn(model, optimizer, transform_outputs, loss_fn, "
                                 "inputs, labels, sample_weights) -> (outputs, loss)"),
]


class TorchModelParams(params.ModelParams):
    """The params of :class:`TorchModel`."""


params.declare(TorchModelParams, [
    ("optimizer", None, "the optimizer, its state after training (learning rate as given)"),
    ("loss", None, "the loss"),
    ("loss_constructors", None, "the loss constructors"),
    ("input_shapes", None, "shapes each feature column is reshaped to"),
])


class TorchEstimatorParams(params.EstimatorParams):
    """The params of :class:`TorchEstimator`."""


params.declare(TorchEstimatorParams, _TORCH_PARAMS)


class TorchEstimator(HorovodEstimator, TorchEstimatorParams):
    """Trains a ``torch.nn.Module`` on a Spark DataFrame with Horovod; ``fit(df)`` returns a
    :class:`TorchModel`.

    Keyword-only (positional arguments raise ``TypeError``); the params of spec/spark.md §8 plus
    ``data_module``, ``loss_constructors``, ``input_shapes`` and ``train_minibatch_fn``.

    The model is called as ``model(*features)``: one tensor per feature column, float32 for
    floating point and boolean columns, int64 for integers, ``(batch,)`` for scalars and
    ``(batch, size)`` for arrays and vectors, or ``(batch, *input_shapes[i])``. It returns one
    tensor, or a tuple with one per label column. ``loss(output, label)`` returns a scalar
    tensor; with ``sample_weight_col`` it must return one loss per row (``reduction='none'``),
    which is averaged with the weights. ``metrics`` are functions ``(output, label) -> float``
    (of the first label), reported per epoch under their ``__name__`` (``val_<name>`` on the
    validation data). ``callbacks`` are objects with any of ``on_epoch_begin(epoch)``,
    ``on_batch_end(epoch, step, logs)`` and ``on_epoch_end(epoch, logs)``, called on every rank.

    Training scales the optimizer's learning rate by the number of ranks (gradients are
    averaged over the ranks' batches); the returned model's optimizer has it unscaled.

    Each argument sets the Param of its name; one left out keeps the Param's default
    ("default" below; None where none is given).

    Args:
        num_proc: the number of ranks, one Spark task each (int >= 1). None: the backend's number;
            without a ``backend``, the active SparkContext's ``defaultParallelism``. Give ``num_proc``
            or ``backend``, not both (``ValueError``).
        model: the ``torch.nn.Module`` to train (required), called as ``model(*features)`` (see above).
        backend: the :class:`~horovod.spark.common.backend.Backend` that runs the ranks. None:
            ``SparkBackend(num_proc=num_proc, verbose=max(0, verbose - 1))``.
        store: the :class:`~horovod.spark.common.store.Store` (required; ``Store.create(path)``) that
            holds the training and validation Parquet, written by ``fit``, and each run's checkpoint.
        optimizer: a ``torch.optim.Optimizer`` over ``model.parameters()`` (required); its learning rate
            is multiplied by the number of ranks while training and divided back in the returned model.
        loss: ``loss(output, label)`` returning a scalar tensor, used for every label, or a list of
            them, one per label column; required unless ``loss_constructors`` or ``train_minibatch_fn``
            is given.
        loss_constructors: functions of no arguments that each return the loss of one label column (a
            list, one per label); instead of ``loss``, not with it (``ValueError``).
        metrics: functions ``(output, label) -> float`` of the first label, averaged over every rank's
            rows each epoch and recorded under their ``__name__`` (``val_<name>`` on the validation
            data). None: none.
        loss_weights: the weight of each label column's loss in the total loss (a list of floats, one
            per label); None: 1.0 each.
        sample_weight_col: the name of a numeric column of per-row loss weights, or None for none; with
            one, each loss must return one value per row (``reduction='none'``) and the loss is
            ``sum(w * loss) / sum(w)`` over the batch.
        gradient_compression: the compression of the gradients' allreduce: a ``Compression`` of the
            framework's Horovod module (``hvd.Compression.fp16``, ...); None: none.
        feature_cols: the names of the feature columns (a list of str, at least one), the model's inputs
            in this order: numeric scalars, arrays of numbers, or ``pyspark.ml.linalg`` vectors (written
            as arrays of doubles).
        continuous_cols: accepted for upstream's scripts and not used.
        categorical_cols: accepted for upstream's scripts and not used.
        input_shapes: the shape each feature column is reshaped to, without the batch dimension (a list
            aligned with ``feature_cols``; a tuple, or None to keep ``(batch,)`` for scalars and
            ``(batch, size)`` for arrays); the tensor becomes ``(batch, *shape)``. The returned model's
            ``transform`` reshapes the same way.
        validation: the validation rows: None for none; a fraction in [0, 1) of the rows, held out at
            random (``DataFrame.randomSplit`` with seed 0); or the name of a column, cast to boolean,
            that is true on them. The validation data is read after every training epoch, unshuffled.
        label_cols: the names of the label columns (a list of str, at least one; one per model output),
            of the same kinds as the features.
        callbacks: objects with any of ``on_epoch_begin(epoch)``, ``on_batch_end(epoch, step, logs)``
            and ``on_epoch_end(epoch, logs)``, called on every rank. None: none.
        batch_size: rows per training batch on each rank (int >= 1; default 32).
        val_batch_size: rows per validation batch on each rank (int >= 1); None: ``batch_size``.
        epochs: the epochs of the run (int >= 1; default 1), counting those a resumed run (same
            ``run_id``) has done already.
        verbose: 0: quiet; 1 (default): rank 0 prints each epoch's loss and metrics; 2 and above: also
            the data preparation prints what it writes, and the default backend passes ``verbose - 1``
            to :func:`horovod.spark.run`.
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
            ``'pytorch_<Unix time in seconds>'``, a new run.
        train_minibatch_fn: replaces one training step:
            ``fn(model, optimizer, as_list, loss_fn, inputs, labels, sample_weights) -> (outputs, loss)``,
            where ``optimizer`` is the ``horovod.torch.DistributedOptimizer``, ``as_list`` turns the
            model's output into a list, ``loss_fn(outputs, labels, sample_weights)`` is the weighted
            total loss, ``inputs`` and ``labels`` are lists of tensors on the rank's device and
            ``sample_weights`` a tensor or None; it zeroes the gradients, calls ``backward`` and steps
            itself. None: the built-in step.
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
        label_shapes: the shape each label column is reshaped to, without the batch dimension (a list
            aligned with ``label_cols``; a tuple or None per column), as ``input_shapes`` does for the
            features.
        inmemory_cache_all: keep the rank's training and validation rows in memory once read, instead of
            reading the Parquet again every epoch (bool; default False).
        use_gpu: train on the GPU ``hvd.local_rank()`` when CUDA is available (bool; default True);
            False, or no CUDA: on the CPU.
        mp_start_method: accepted for upstream's scripts and not used.
        backward_passes_per_step: batches whose gradients are accumulated locally before one allreduce
            and optimizer step (int >= 1; default 1), passed to ``horovod.torch.DistributedOptimizer``.
        data_module: accepted for upstream's scripts and not used: the Parquet reader is built in.
        shuffle: shuffle the training rows every epoch (bool; default True); the validation rows are
            read in order.

    Raises:
        ValueError: ``fit``: a missing or ill-typed param or column, ``loss`` together with
            ``loss_constructors``, ``backward_passes_per_step < 1``.
        RuntimeError: ``fit``: a rank failed (named, with its traceback).
    """

    _run_prefix = "pytorch"

    @keyword_only
    def __init__(self, num_proc=None, model=None, backend=None, store=None, optimizer=None, loss=None,
                 loss_constructors=None, metrics=None, loss_weights=None, sample_weight_col=None,
                 gradient_compression=None, feature_cols=None, continuous_cols=None, categorical_cols=None,
                 input_shapes=None, validation=None, label_cols=None, callbacks=None, batch_size=None,
                 val_batch_size=None, epochs=None, verbose=1, random_seed=None, shuffle_buffer_size=None,
                 partitions_per_process=None, run_id=None, train_minibatch_fn=None, train_steps_per_epoch=None,
                 validation_steps_per_epoch=None, transformation_fn=None, train_reader_num_workers=None,
                 val_reader_num_workers=None, reader_pool_type=None, label_shapes=None, inmemory_cache_all=False,
                 use_gpu=True, mp_start_method=None, backward_passes_per_step=1, data_module=None, shuffle=True):
        super().__init__()
        self.setParams(**self._input_kwargs)

    def _check_params(self):
        import torch

        if not isinstance(self.getModel(), torch.nn.Module):
            raise ValueError("model must be a torch.nn.Module, got %s" % type(self.getModel()).__name__)
        if self.getOptimizer() is None or not isinstance(self.getOptimizer(), torch.optim.Optimizer):
            raise ValueError("optimizer must be a torch.optim.Optimizer over the model's parameters, got %r"
                             % (self.getOptimizer(),))
        own = {id(p) for p in self.getModel().parameters()}
        if any(id(p) not in own for g in self.getOptimizer().param_groups for p in g["params"]):
            raise ValueError("the optimizer holds parameters that are not the model's: make it from "
                             "model.parameters()")
        if self.getLoss() is not None and self.getLossConstructors() is not None:
            raise ValueError("set loss or loss_constructors, not both")
        if self.getLoss() is None and self.getLossConstructors() is None and self.getTrainMinibatchFn() is None:
            raise ValueError("loss is not set: pass loss=... (a function of output and label) or loss_constructors")
        bpps = self.getBackwardPassesPerStep()
        if isinstance(bpps, bool) or not isinstance(bpps, int) or bpps <= 0:
            raise ValueError("backward_passes_per_step must be a positive integer, got %r" % (bpps,))

    def _remote_trainer(self, meta, run_id):
        spec = self._train_spec(meta, run_id)
        model_and_optimizer = cloudpickle.dumps((self.getModel(), self.getOptimizer()))
        settings = dict(loss=self.getLoss(), loss_constructors=self.getLossConstructors(),
                        loss_weights=self.getLossWeights(), metrics=list(self.getMetrics() or []),
                        callbacks=list(self.getCallbacks() or []), input_shapes=self.getInputShapes(),
                        label_shapes=self.getLabelShapes(), compression=self.getGradientCompression(),
                        backward_passes_per_step=self.getBackwardPassesPerStep(),
                        train_minibatch_fn=self.getTrainMinibatchFn(), use_gpu=self.getUseGpu())
        return remote.trainer(spec, model_and_optimizer, settings)

    def _create_model(self, result, run_id, meta):
        model, optimizer = cloudpickle.loads(result["model_and_optimizer"])
        return TorchModel(history=result["history"], model=model, optimizer=optimizer,
                          feature_columns=list(self.getFeatureCols()), label_columns=list(self.getLabelCols()),
                          input_shapes=self.getInputShapes(), run_id=run_id, _metadata=meta,
                          loss=self.getLoss(), loss_constructors=self.getLossConstructors())


class TorchModel(HorovodModel, TorchModelParams):
    """A trained torch model; ``transform(df)`` appends its predictions (see
    :class:`~horovod.spark.common.estimator.HorovodModel`). Keyword-only constructor:
    ``history, model, feature_columns, input_shapes, label_columns, optimizer, run_id, _metadata,
    loss, loss_constructors``."""

    @keyword_only
    def __init__(self, history=None, model=None, feature_columns=None, input_shapes=None, label_columns=None,
                 optimizer=None, run_id=None, _metadata=None, loss=None, loss_constructors=None):
        super().__init__()
        self._set(**self._input_kwargs)

    def _predictor(self):
        model_bytes = cloudpickle.dumps(self.getModel())
        shapes = self.getInputShapes()
        names = ["f%d" % i for i in range(len(self.getFeatureColumns()))]
        cache = {}

        def predict(arrays):
            import torch

            if "model" not in cache:
                torch.set_num_threads(1)
                cache["model"] = cloudpickle.loads(model_bytes).eval()
            inputs = to_tensors(dict(zip(names, arrays, strict=True)), names, shapes)
            with torch.no_grad():
                outputs = cache["model"](*inputs)
            if not isinstance(outputs, (tuple, list)):
                outputs = [outputs]
            return [o.detach().cpu().numpy() for o in outputs]

        return predict
