"""The collectives and the optimizer set-up that both strategies (Trainer and Fabric) share."""

import torch

import horovod.torch as hvd


_OPS = {"mean": hvd.Average, "avg": hvd.Average, "sum": hvd.Sum, "max": hvd.Max, "min": hvd.Min,
        "product": hvd.Product, "prod": hvd.Product}


def horovod_op(reduce_op):
    """Lightning's ``reduce_op`` (a string, a ``torch.distributed.ReduceOp``, or None for sum) as a
    Horovod op.

    Raises:
        ValueError: an op Horovod does not reduce with.
    """
    if reduce_op is None:
        return hvd.Sum
    name = reduce_op if isinstance(reduce_op, str) else str(getattr(reduce_op, "name", reduce_op)).split(".")[-1]
    op = _OPS.get(name.lower())
    if op is None:
        raise ValueError(f"expected reduce_op to be one of {sorted(_OPS)} (or the matching torch ReduceOp), "
                         f"got {reduce_op!r}")
    return op


def reduce(tensor, reduce_op="mean"):
    """Allreduce of a tensor over all ranks (a new tensor); other values pass through."""
    if not isinstance(tensor, torch.Tensor):
        return tensor
    # One name for every call (each waits for its result): automatic names count operations,
    # and after an epoch of uneven data (hvd.join) the ranks' counts differ.
    return hvd.allreduce(tensor.detach().contiguous(), op=horovod_op(reduce_op), name="lightning.reduce")


def all_gather(tensor, sync_grads=False):
    """Every rank's ``tensor`` stacked along a new first dimension: shape ``(size, *tensor.shape)``.
    Differentiable when ``sync_grads`` (the gradient of an allgather)."""
    stacked = tensor.unsqueeze(0).contiguous()
    if sync_grads:
        return hvd.allgather(stacked, name="lightning.all_gather")
    with torch.no_grad():
        return hvd.allgather(stacked.detach(), name="lightning.all_gather")


def broadcast(obj, src=0):
    return hvd.broadcast_object(obj, root_rank=src, name="lightning.broadcast")


def barrier():
    hvd.barrier()


def broadcast_optimizer(optimizer):
    """Makes the optimizer's state and options equal to rank 0's. An optimizer without state yet
    gets only rank 0's group options (``hvd.broadcast_optimizer_state`` would first take a step on
    zero gradients to create the state, which moves parameters under weight decay)."""
    if optimizer.state_dict()["state"]:
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        return
    options = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    for group, received in zip(optimizer.param_groups, broadcast(options), strict=True):
        group.update(received)


def distributed_optimizer(optimizer, named_parameters, backward_passes_per_step, options):
    """``hvd.DistributedOptimizer`` over ``optimizer``, naming its parameters by the module's names;
    a ``hvd.ZeroRedundancyOptimizer`` already reduces its gradients and is returned as it is."""
    if isinstance(optimizer, hvd.ZeroRedundancyOptimizer):
        return optimizer
    broadcast_optimizer(optimizer)
    in_optimizer = {p for g in optimizer.param_groups for p in g["params"]}
    named = [(n, p) for n, p in named_parameters if p in in_optimizer]
    # Parameters the module does not name (added to the optimizer by hand): positional names.
    named_set = {p for _, p in named}
    named += [(f"unnamed.{i}.{j}", p) for i, g in enumerate(optimizer.param_groups)
              for j, p in enumerate(g["params"]) if p not in named_set]
    return hvd.DistributedOptimizer(optimizer, named_parameters=named,
                                    backward_passes_per_step=backward_passes_per_step, **options)
