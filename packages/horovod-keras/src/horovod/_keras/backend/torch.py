"""Keras backend 'torch': tensors are torch tensors, collectives go through horovod.torch."""

import numpy as np

try:
    import horovod.torch as framework
except ImportError as e:
    raise ImportError("horovod.keras on the Keras backend 'torch' needs horovod-torch: "
                      "pip install horovod-torch") from e

import keras  # noqa: F401  (this layer's ``keras``, see horovod._keras.backend)
import torch

NAME = "torch"
Compression = framework.Compression


def _on_cpu(tensor):
    """The engine reads CPU memory: returns the contiguous CPU version of ``tensor`` and the
    device to move the result back to (None when it was already there)."""
    if tensor.device.type == "cpu":
        return tensor.detach().contiguous(), None
    return tensor.detach().cpu().contiguous(), tensor.device


def _back(tensor, device):
    return tensor if device is None else tensor.to(device)


def grouped_allreduce(tensors, op, prescale_factor=1.0, postscale_factor=1.0,
                      process_set=framework.global_process_set, name=None):
    moved = [_on_cpu(t) for t in tensors]
    reduced = framework.grouped_allreduce(
        [t for t, _ in moved], name=name, op=op, prescale_factor=prescale_factor,
        postscale_factor=postscale_factor, process_set=process_set)
    return [_back(r, device) for r, (_, device) in zip(reduced, moved, strict=True)]


def allreduce(tensor, op, prescale_factor=1.0, postscale_factor=1.0,
              process_set=framework.global_process_set, name=None):
    cpu, device = _on_cpu(tensor)
    return _back(framework.allreduce(cpu, name=name, op=op, prescale_factor=prescale_factor,
                                     postscale_factor=postscale_factor,
                                     process_set=process_set), device)


def allgather(tensor, process_set=framework.global_process_set, name=None):
    cpu, device = _on_cpu(tensor)
    return _back(framework.allgather(cpu, name=name, process_set=process_set), device)


def broadcast(tensor, root_rank, process_set=framework.global_process_set, name=None):
    cpu, device = _on_cpu(tensor)
    return _back(framework.broadcast(cpu, root_rank, name=name, process_set=process_set), device)


def reducescatter(tensor, op, process_set=framework.global_process_set, name=None):
    cpu, device = _on_cpu(tensor)
    return _back(framework.reducescatter(cpu, name=name, op=op, process_set=process_set), device)


def to_tensor(array):
    return torch.from_numpy(np.asarray(array, order="C"))


def to_numpy(tensor):
    return tensor.detach().cpu().numpy()


def dense(grad):
    return grad.to_dense() if grad.is_sparse else grad


def is_sparse(grad):
    return grad.is_sparse
