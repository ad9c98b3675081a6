"""Helpers that bring model parameters, optimizer state and Python objects into agreement
across ranks."""

import collections

from horovod.torch.mpi_ops import (
    allgather,
    broadcast_,
    broadcast_async_,
    global_process_set,
    rank,
    synchronize,
)

import torch


def broadcast_parameters(params, root_rank):
    """Overwrites ``params`` on every rank with the root's values, in place.

    Typically called once before training, with ``model.state_dict()`` or
    ``model.named_parameters()`` (as a list), so that every rank starts from the same weights.
    All broadcasts are started before any is waited on. Uses the global process set.

    Args:
        params: a dict name -> tensor (sent in sorted key order), or a list of tensors or of
            ``(name, tensor)`` tuples. Tensors: contiguous CPU tensors of any dtype broadcast
            supports; same names, shapes and dtypes on every rank.
        root_rank: the global rank whose values are sent.

    Raises:
        ValueError: ``params`` is neither a dict nor a list, or a tensor is not broadcastable.
        HorovodInternalError: ranks disagree on the shape or dtype of a tensor, or Horovod is
            not running.
    """
    if isinstance(params, dict):
        named = sorted(params.items())
    elif isinstance(params, list):
        named = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError('broadcast_parameters expects a dict or a list of tensors or of '
                         f'(name, tensor) tuples, got {type(params).__name__}.')
    handles = [broadcast_async_(p, root_rank, name) for name, p in named]
    for handle in handles:
        synchronize(handle)


def broadcast_optimizer_state(optimizer, root_rank, model=None):
    """Overwrites ``optimizer``'s state and hyper-parameters on every rank with the root's.

    An optimizer whose state is still empty (no ``step()`` taken yet) is first given its
    initial state by one step on zero gradients, taken on the wrapped optimizer when
    ``optimizer`` is a ``DistributedOptimizer`` (so no allreduce happens). Tensor state is
    broadcast in place under the names ``"<state key>.<n>"`` (``n`` counts occurrences of the
    key over the parameters in group order, from 1); every other value (param-group options
    such as ``lr.0``, and non-tensor state) goes in one ``broadcast_object``.

    Args:
        optimizer: a ``torch.optim.Optimizer`` (possibly a ``DistributedOptimizer``) holding
            the same parameters, in the same order, on every rank.
        root_rank: the global rank whose state is sent.
        model: optional ``torch.nn.Module``; its sparse ``nn.Embedding`` layers get sparse zero
            gradients for the initial step of an SGD optimizer.

    Raises:
        ValueError: ``optimizer`` is ``torch.optim.LBFGS`` (its state cannot be broadcast).
        HorovodInternalError: ranks disagree on state shapes, or Horovod is not running.
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError('broadcast_optimizer_state does not support torch.optim.LBFGS.')

    if not optimizer.state_dict()['state']:
        _initialize_state(optimizer, model)
        if not optimizer.state_dict()['state']:
            return

    tensors = []
    values = {}
    setters = {}
    occurrences = collections.defaultdict(int)
    for index, group in enumerate(optimizer.param_groups):
        for option, value in group.items():
            if option == 'params':
                continue
            key = f'{option}.{index}'
            values[key] = value
            setters[key] = _item_setter(group, option)
        for p in group['params']:
            state = optimizer.state.get(p)
            if not state:
                continue
            for name, value in state.items():
                occurrences[name] += 1
                key = f'{name}.{occurrences[name]}'
                if torch.is_tensor(value):
                    tensors.append((key, value))
                else:
                    values[key] = value
                    setters[key] = _item_setter(state, name)

    broadcast_parameters(tensors, root_rank)
    values = broadcast_object(values, root_rank, name='optimizer_state')
    for key, value in values.items():
        setters[key](value)


def _item_setter(container, key):
    def set_item(value):
        container[key] = value
    return set_item


def _initialize_state(optimizer, model):
    sparse_embeddings = set()
    if model is not None and isinstance(optimizer, torch.optim.SGD):
        for module in model.modules():
            if isinstance(module, torch.nn.Embedding) and module.sparse:
                sparse_embeddings.update(id(p) for p in module.parameters())
    sparse_all = isinstance(optimizer, torch.optim.SparseAdam)
    for group in optimizer.param_groups:
        for p in group['params']:
            if not p.requires_grad:
                continue
            if sparse_all or id(p) in sparse_embeddings:
                p.grad = torch.zeros_like(p).to_sparse()
            else:
                p.grad = torch.zeros_like(p)
    # A DistributedOptimizer's own step() would allreduce; step the wrapped class instead.
    getattr(optimizer, '_step_without_allreduce', optimizer.step)()


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Sends a picklable Python object from the root to every rank of ``process_set``.

    The root serialises ``obj`` with cloudpickle; a header (int32 ``[status, length]``, engine
    name ``broadcast.<name>.sz``) and then the bytes (uint8, ``broadcast.<name>.t``) are broadcast
    (horovod.common.objects).

    Args:
        obj: any object cloudpickle can serialise; ignored on non-root ranks (``None`` is fine).
        root_rank: the global rank whose object is sent (default 0).
        name: base name of the two broadcasts; default ``'broadcast_object'``. Ranks must use
            the same name.
        process_set: the ``ProcessSet`` to broadcast within (default: all ranks).

    Returns:
        The root's object (on the root, ``obj`` itself; elsewhere, an unpickled copy).

    Raises:
        ValueError: ``root_rank`` is not in ``process_set``.
        the root's exception (on the root) and horovod.common.objects.ObjectTransferError (on the
            other ranks, naming the root): ``obj`` cannot be serialised on the root.
        HorovodInternalError: the ranks' names or roots disagree, or Horovod is not running.
    """
    from horovod.common import objects
    base = objects.BROADCAST_NAME if name is None else name

    def run(array, suffix):
        tensor = torch.from_numpy(array)
        broadcast_(tensor, root_rank, base + suffix, process_set)
        return tensor.numpy()

    return objects.broadcast_object(obj, rank() == root_rank, root_rank, run)


def allgather_object(obj, name=None):
    """Gathers a picklable Python object from every rank; uses the global process set.

    Each rank serialises ``obj`` with cloudpickle; headers (int32 ``[status, length]``, engine
    name ``allgather.<name>.sz``) and then the bytes (uint8, ``allgather.<name>.t``) are gathered
    (horovod.common.objects).

    Args:
        obj: any object cloudpickle can serialise.
        name: base name of the two allgathers; default ``'allgather_object'``. Ranks must use the
            same name.

    Returns:
        list of ``size()`` objects, in rank order (this rank's entry is an unpickled copy).

    Raises:
        this rank's exception when its ``obj`` cannot be serialised, and
            horovod.common.objects.ObjectTransferError on the others, naming the failed ranks.
        HorovodInternalError: the ranks' names disagree, or Horovod is not running.
    """
    from horovod.common import objects
    base = objects.ALLGATHER_NAME if name is None else name
    return objects.allgather_object(
        obj, lambda array, suffix: allgather(torch.from_numpy(array), base + suffix).numpy())
