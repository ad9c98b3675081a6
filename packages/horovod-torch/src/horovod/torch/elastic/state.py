"""TorchState: elastic state holding models, optimizers, samplers and plain Python values.

Values are matched against a handler registry of ``(type, handler_cls)`` pairs, first match
wins; a handler knows how to snapshot, roll back and broadcast its kind of object. Everything
else is a plain attribute of the underlying ``ObjectState``.
"""

import copy

import torch

from horovod.common.elastic import ObjectState
from horovod.torch.elastic.sampler import ElasticSampler
from horovod.torch.functions import (
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from horovod.torch.mpi_ops import rank
from horovod.torch.zero import ZeroRedundancyOptimizer


class StateHandler(object):
    """Snapshots, restores and synchronises one value of a :class:`TorchState`.

    Args:
        value: the managed object.
    """

    def __init__(self, value):
        self.value = value

    def save(self):
        """Snapshots ``value`` in memory."""
        raise NotImplementedError()

    def restore(self):
        """Rolls ``value`` back to the last snapshot."""
        raise NotImplementedError()

    def sync(self):
        """Makes ``value`` equal to rank 0's (collective)."""
        raise NotImplementedError()

    def set_value(self, value):
        """Replaces the managed object and snapshots it at once."""
        self.value = value
        self.save()


class ModelStateHandler(StateHandler):
    """Handles a ``torch.nn.Module`` through its ``state_dict``."""

    def __init__(self, model):
        super().__init__(model)
        self._saved_model_state = copy.deepcopy(self.value.state_dict())

    def save(self):
        self._saved_model_state = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved_model_state)

    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(StateHandler):
    """Handles a ``torch.optim.Optimizer`` through its ``state_dict``.

    A :class:`~horovod.torch.ZeroRedundancyOptimizer` (global process set only) holds only its
    shard of the state, and a reset may remove the ranks that held the others, so its snapshot
    (``save``, i.e. every ``commit``) gathers the whole state on every rank, in host memory (what
    an unsharded optimizer's snapshot costs). After a reset (:meth:`reset`) the snapshot is loaded
    again, resharded for the new number of ranks, and ``sync`` hands rank 0's snapshot to ranks
    that joined: its state returns to the last commit at every reset.

    A DistributedOptimizer's stateful compressor (PowerSGD, TopK) is saved and restored with the
    optimizer's state; every reset zeroes every rank's residuals, and ``sync`` gives every rank
    rank 0's factors and step.

    Raises:
        ValueError: a ZeroRedundancyOptimizer on a process set other than the global one (process
            sets do not survive a reset).
    """

    def __init__(self, optimizer):
        super().__init__(optimizer)
        self._sharded = isinstance(optimizer, ZeroRedundancyOptimizer)
        if self._sharded and optimizer.process_set.process_set_id != 0:
            raise ValueError("TorchState handles a ZeroRedundancyOptimizer on the global process set only, "
                             f"got one on {optimizer.process_set}")
        self.save()

    def save(self):
        if self._sharded:
            self._saved_optimizer_state = self.value._gathered_state_dict()
        else:
            self._saved_optimizer_state = copy.deepcopy(self.value.state_dict())

    def restore(self):
        # load_state_dict may keep the given tensors as the optimizer's state, and later steps
        # update them in place: hand it a copy so that the snapshot stays intact.
        try:
            self.value.load_state_dict(copy.deepcopy(self._saved_optimizer_state))
        except (ValueError, RuntimeError):
            if not self._sharded:
                raise
            # Horovod is down (a peer failed): reset() reshards once it is back.

    def sync(self):
        if self._sharded:
            self._saved_optimizer_state = broadcast_object(
                self._saved_optimizer_state if rank() == 0 else None, root_rank=0)
            self.value.load_state_dict(copy.deepcopy(self._saved_optimizer_state))
        else:
            broadcast_optimizer_state(self.value, root_rank=0)
        compression = getattr(self.value, '_compression', None)
        if getattr(compression, 'stateful', False):
            compression.sync(lambda shared: broadcast_object(shared, root_rank=0))

    def reset(self):
        # The number of ranks may have changed without a sync (hosts only removed): reshard.
        if self._sharded:
            self.value.load_state_dict(copy.deepcopy(self._saved_optimizer_state))
        # A stateful compressor's residuals start again from zero on every rank, whether or not a
        # sync follows: those of ranks that left are lost, and each rank's share of the data has
        # changed (the factors and the step are the same on every rank already, or after the sync).
        compression = getattr(self.value, '_compression', None)
        if getattr(compression, 'stateful', False):
            compression.reset_residuals()


class SamplerStateHandler(StateHandler):
    """Handles an :class:`ElasticSampler` through its epoch and progress."""

    def __init__(self, sampler):
        super().__init__(sampler)
        self._saved_sampler_state = copy.deepcopy(self.value.state_dict())

    def save(self):
        self._saved_sampler_state = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved_sampler_state)

    def sync(self):
        self.value.load_state_dict(broadcast_object(self.value.state_dict()))

    def reset(self):
        # The world may have changed without a sync (hosts only removed): repartition.
        self.value.reset()


_handler_registry = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry():
    """Returns the list of ``(type, handler_cls)`` pairs consulted by new :class:`TorchState`
    objects, in matching order."""
    return _handler_registry


def set_handler_registry(registry):
    """Replaces the handler registry.

    Args:
        registry: list of ``(type, handler_cls)``; ``handler_cls(value)`` must build a
            :class:`StateHandler`.
    """
    global _handler_registry
    _handler_registry = registry


def _handler_for(value):
    for value_type, handler_cls in _handler_registry:
        if isinstance(value, value_type):
            return handler_cls(value)
    return None


class TorchState(ObjectState):
    """Elastic state of a PyTorch training loop.

    Args:
        model (torch.nn.Module): the model, or None.
        optimizer (torch.optim.Optimizer): the optimizer, or None.
        **kwargs: more values; models, optimizers and :class:`ElasticSampler` objects are managed
            by their handlers, anything else (picklable) is broadcast with ``broadcast_object``.

    Assigning a handled attribute (``state.model = new_model``) replaces the managed object and
    snapshots it. :meth:`sync` is a collective over all ranks.
    """

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        handlers = {}
        plain = {}
        for name, value in kwargs.items():
            handler = _handler_for(value)
            if handler is None:
                plain[name] = value
            else:
                handlers[name] = handler
        self._handlers = handlers
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **plain)

    def save(self):
        """Snapshots, in this process's memory, the model's and optimizer's state dicts, the
        samplers' positions and the plain values (``commit`` calls it)."""
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self):
        """Rolls every managed object and plain value back to the last :meth:`save` (after a
        ``HorovodInternalError``, before the reset)."""
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self):
        """Makes every rank's state equal to rank 0's: parameters, optimizer state (resharded
        for a ``ZeroRedundancyOptimizer``), samplers and plain values are broadcast. A
        collective over all ranks; raises ``HorovodInternalError`` when a rank is lost meanwhile."""
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def reset(self):
        """After Horovod was re-initialised: handlers that depend on the world size and rank
        (an :class:`ElasticSampler`) recompute their share, also when the state is not
        synchronised (hosts only removed)."""
        for handler in self._handlers.values():
            reset = getattr(handler, "reset", None)
            if reset is not None:
                reset()

    def __getattr__(self, name):
        # Only reached when normal lookup fails, i.e. for handled values.
        handlers = self.__dict__.get('_handlers', {})
        if name in handlers:
            return handlers[name].value
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __setattr__(self, name, value):
        handlers = self.__dict__.get('_handlers', {})
        if name in handlers:
            handlers[name].set_value(value)
        else:
            super().__setattr__(name, value)
