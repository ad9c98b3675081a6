"""HorovodStrategy: Lightning's Trainer over Horovod, one process per device."""

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn

import horovod.torch as hvd
from horovod.lightning import _collectives
from horovod.lightning.environment import HorovodEnvironment, HorovodRanks


class HorovodStrategy(HorovodRanks, ParallelStrategy):
    """Trains with Lightning's ``Trainer`` on the processes of a Horovod job.

    Each process is one Horovod rank driving one device: ``Trainer(strategy=HorovodStrategy(),
    accelerator="cpu" or "gpu", devices=1)``, started with ``horovodrun -np N python train.py``
    (or ``horovod.ray.RayExecutor`` / ``horovod.spark.run``). The strategy

    * takes ranks and sizes from Horovod (:class:`HorovodEnvironment`; a GPU rank uses device
      ``hvd.local_rank()``), and gives ``DistributedSampler`` ``hvd.size()`` and ``hvd.rank()``;
    * broadcasts the module's parameters and buffers, and each optimizer's state and options,
      from rank 0 at set-up;
    * wraps each optimizer in ``hvd.DistributedOptimizer`` with ``backward_passes_per_step``
      equal to the Trainer's ``accumulate_grad_batches`` (a ``hvd.ZeroRedundancyOptimizer``
      reduces its own gradients and is left as it is); the gradients are averaged once the
      closure's backward pass is done, before gradient clipping and ``on_before_optimizer_step``;
    * implements ``reduce`` (so ``self.log(..., sync_dist=True)``), ``all_gather``, ``broadcast``
      and ``barrier`` with Horovod collectives; writes checkpoints on rank 0 only;
    * ends every training epoch with ``hvd.join()``, so that a rank with fewer batches (uneven
      data without ``DistributedSampler``) takes part in the others' allreduces instead of
      hanging; when the ranks had different numbers of batches, the parameters and optimizer
      state of the rank that joined last are then broadcast, so all ranks continue alike.

    Args:
        op: the reduction of gradients, ``hvd.Average`` (default) or ``hvd.Sum``, ``hvd.Adasum``.
        compression: ``hvd.Compression.none`` (default), ``hvd.Compression.fp16`` or
            ``hvd.Compression.bf16``.
        gradient_predivide_factor (float): as for ``hvd.DistributedOptimizer``.
        accelerator, checkpoint_io, precision_plugin: as for any Lightning ``Strategy``.

    Raises:
        ValueError: (at ``Trainer`` set-up) ``devices`` other than 1.
    """

    strategy_name = "horovod"

    def __init__(self, op=hvd.Average, compression=hvd.Compression.none, gradient_predivide_factor=1.0,
                 accelerator=None, checkpoint_io=None, precision_plugin=None):
        super().__init__(accelerator=accelerator, parallel_devices=None, cluster_environment=HorovodEnvironment(),
                         checkpoint_io=checkpoint_io, precision_plugin=precision_plugin)
        self._optimizer_options = {"op": op, "compression": compression,
                                   "gradient_predivide_factor": gradient_predivide_factor}

    # Devices.

    def model_to_device(self):
        self.model.to(self.root_device)

    # Set-up: the same start on every rank, distributed optimizers.

    def setup(self, trainer):
        super().setup(trainer)
        hvd.broadcast_parameters(self.lightning_module.state_dict(), root_rank=0)
        if trainer.state.fn != TrainerFn.FITTING:
            return
        named = list(self.lightning_module.named_parameters())
        wrapped = [_collectives.distributed_optimizer(opt, named, trainer.accumulate_grad_batches,
                                                      self._optimizer_options)
                   for opt in self.optimizers]
        for config in self.lr_scheduler_configs:
            for old, new in zip(self.optimizers, wrapped, strict=True):
                if config.scheduler.optimizer is old:
                    config.scheduler.optimizer = new
        self.optimizers = wrapped
        if not any(isinstance(c, _JoinAtEpochEnd) for c in trainer.callbacks):
            # First, so that no other callback's collective runs while a rank is joined.
            trainer.callbacks.insert(0, _JoinAtEpochEnd(self))

    def optimizer_step(self, optimizer, closure, model=None, **kwargs):
        """Runs the closure (forward and backward), waits for the gradient allreduces, then lets
        the precision plugin clip and step; the step does not synchronise again."""
        if not hasattr(optimizer, "synchronize") or self._optimizer_options["op"] == hvd.Adasum:
            # ZeroRedundancyOptimizer, or Adasum (which combines parameter changes in step()).
            return super().optimizer_step(optimizer, closure, model, **kwargs)

        def synchronized_closure():
            result = closure()
            optimizer.synchronize()
            return result

        with optimizer.skip_synchronize():
            return super().optimizer_step(optimizer, synchronized_closure, model, **kwargs)

    # Collectives.

    def reduce(self, tensor, group=None, reduce_op="mean"):
        """Allreduce of ``tensor`` over all ranks with ``reduce_op`` ("mean" (default), "sum",
        "max", "min", "product", or a ``torch.distributed.ReduceOp``); non-tensors pass through.

        Raises:
            ValueError: another ``reduce_op``.
        """
        return _collectives.reduce(tensor, reduce_op)

    def save_checkpoint(self, checkpoint, filepath, storage_options=None):
        """Writes the checkpoint on rank 0 only (every rank holds the same model)."""
        if self.is_global_zero:
            self.checkpoint_io.save_checkpoint(checkpoint, filepath, storage_options=storage_options)


class _JoinAtEpochEnd(Callback):
    """After each rank's last training batch of an epoch: ``hvd.join()``; then, if the ranks
    ran different numbers of batches, the last rank to join broadcasts its parameters and
    optimizer state. Also keeps ``backward_passes_per_step`` equal to the Trainer's
    ``accumulate_grad_batches`` (which a ``GradientAccumulationScheduler`` may change)."""

    def __init__(self, strategy):
        self.strategy = strategy
        self.batches = 0

    def on_train_epoch_start(self, trainer, pl_module):
        self.batches = 0
        for opt in self.strategy.optimizers:
            passes = getattr(opt, "backward_passes_per_step", None)
            if passes is not None and passes != trainer.accumulate_grad_batches:
                opt.set_backward_passes_per_step(trainer.accumulate_grad_batches)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.batches += 1
        progress = trainer.fit_loop.epoch_loop.batch_progress
        if not (progress.is_last_batch or batch_idx + 1 >= trainer.num_training_batches):
            return
        last = hvd.join()
        # Named: after uneven epochs the ranks have submitted different numbers of unnamed
        # operations, so automatic names no longer match.
        counts = torch.tensor([self.batches, -self.batches], dtype=torch.int64)
        most, negative_fewest = hvd.allreduce(counts, op=hvd.Max, name="lightning.join.counts").tolist()
        if most != -negative_fewest:
            hvd.broadcast_parameters(pl_module.state_dict(), root_rank=last)
            for opt in self.strategy.optimizers:
                # A ZeroRedundancyOptimizer's state is sharded, not replicated: nothing to align.
                if not isinstance(opt, hvd.ZeroRedundancyOptimizer) and opt.state_dict()["state"]:
                    hvd.broadcast_optimizer_state(opt, root_rank=last)
