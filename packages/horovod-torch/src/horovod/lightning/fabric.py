"""HorovodFabricStrategy: Lightning Fabric over Horovod, one process per device."""

import torch
from lightning.fabric.strategies import ParallelStrategy

import horovod.torch as hvd
from horovod.lightning import _collectives
from horovod.lightning.environment import HorovodEnvironment, HorovodRanks


class HorovodFabricStrategy(HorovodRanks, ParallelStrategy):
    """Runs Lightning ``Fabric`` on the processes of a Horovod job:
    ``Fabric(strategy=HorovodFabricStrategy(), accelerator="cpu" or "gpu", devices=1)``, started
    with ``horovodrun -np N python train.py``.

    ``fabric.setup(model, optimizer)`` broadcasts the module's parameters and buffers and the
    optimizer's state and options from rank 0 and wraps the optimizer in
    ``hvd.DistributedOptimizer`` (a ``hvd.ZeroRedundancyOptimizer`` is left as it is);
    ``fabric.backward(loss)`` starts the gradient allreduces and ``optimizer.step()`` waits for
    them. ``fabric.all_reduce``, ``all_gather``, ``broadcast`` and ``barrier`` are Horovod
    collectives, ``setup_dataloaders`` uses a ``DistributedSampler`` over ``hvd.size()`` ranks,
    and ``fabric.save`` writes on rank 0 only.

    Args:
        backward_passes_per_step (int): backward passes accumulated locally before the gradients
            are reduced (default 1), as for ``hvd.DistributedOptimizer``.
        op, compression, gradient_predivide_factor: as for ``hvd.DistributedOptimizer``.
        accelerator, checkpoint_io, precision: as for any Fabric ``Strategy``.

    Raises:
        ValueError: (at ``Fabric`` set-up) ``devices`` other than 1.
    """

    def __init__(self, backward_passes_per_step=1, op=hvd.Average, compression=hvd.Compression.none,
                 gradient_predivide_factor=1.0, accelerator=None, checkpoint_io=None, precision=None):
        super().__init__(accelerator=accelerator, parallel_devices=None, cluster_environment=HorovodEnvironment(),
                         checkpoint_io=checkpoint_io, precision=precision)
        self._backward_passes_per_step = backward_passes_per_step
        self._optimizer_options = {"op": op, "compression": compression,
                                   "gradient_predivide_factor": gradient_predivide_factor}
        self._named_parameters = []

    def module_to_device(self, module):
        module.to(self.root_device)

    def setup_module(self, module):
        hvd.broadcast_parameters(module.state_dict(), root_rank=0)
        # The optimizer set up next (or later) names its allreduces by these names.
        self._named_parameters += list(module.named_parameters())
        return module

    def setup_optimizer(self, optimizer):
        return _collectives.distributed_optimizer(optimizer, self._named_parameters, self._backward_passes_per_step,
                                                  self._optimizer_options)

    def all_reduce(self, tensor, group=None, reduce_op="mean"):
        """Allreduce over all ranks with ``reduce_op`` ("mean" (default), "sum", "max", "min",
        "product", or a ``torch.distributed.ReduceOp``); non-tensors pass through.

        Raises:
            ValueError: another ``reduce_op``.
        """
        return _collectives.reduce(tensor, reduce_op)

    def reduce_boolean_decision(self, decision, all=True):
        """``all`` (default) or ``any`` of every rank's ``decision``."""
        votes = int(_collectives.reduce(torch.tensor(int(bool(decision))), "sum"))
        return votes == self.world_size if all else votes > 0
