"""Implementation shared by ``horovod.keras`` (standalone Keras 3) and ``horovod.tensorflow.keras``
(``tf.keras``, which is Keras 3 on TensorFlow 2.16+).

Everything here works on Keras objects and on the tensors of the Keras backend in use, through
the backend layer of :mod:`horovod._keras.backend`.
"""

import warnings

import numpy as np

from horovod._keras.optimizer import _DistributedOptimizer, _Settings
from horovod.common.stateful_compression import check_optimizer_options


def _is_variable_list_of_lists(groups):
    return (isinstance(groups, list) and groups
            and all(isinstance(unit, (list, tuple)) for unit in groups))


def create_distributed_optimizer(keras, optimizer, name, device_dense, device_sparse, compression,
                                 sparse_as_dense, gradient_predivide_factor, op,
                                 backward_passes_per_step=1, average_aggregated_gradients=False,
                                 groups=None, process_set=None, scale_local_gradients=True,
                                 backend=None, num_groups=0):
    """Returns a distributed copy of the Keras 3 optimizer ``optimizer`` (see the public
    ``DistributedOptimizer`` of horovod.keras for the arguments).

    The copy is ``cls.from_config(optimizer.get_config())`` where ``cls`` is a subclass of
    ``type(optimizer)`` with the same name and module; the original's variables are not copied
    (the copy is built on its first ``apply``).

    Raises:
        ValueError: ``optimizer`` is not a Keras 3 optimizer or is already distributed; ``op`` is
            not Average or Sum; ``gradient_predivide_factor != 1`` with an op other than
            Average; ``backward_passes_per_step`` is not a positive int; ``groups`` is neither
            None, a positive int nor a list of lists of variables; ``compression`` is not a
            compressor; a compressor with state (PowerSGD, TopK) with a
            ``gradient_predivide_factor`` other than 1.
    """
    if backend is None:
        from horovod._keras.backend import load
        backend = load(keras.backend.backend())
    framework = backend.framework
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError("DistributedOptimizer expects a Keras 3 optimizer (an instance of "
                         f"keras.optimizers.Optimizer), got {type(optimizer).__name__}.")
    if isinstance(optimizer, _DistributedOptimizer):
        raise ValueError("DistributedOptimizer got an optimizer that is already distributed; "
                         "wrap the plain Keras optimizer once.")
    if op not in (framework.Average, framework.Sum):
        raise ValueError("DistributedOptimizer for Keras supports op=Average or op=Sum only, "
                         f"got op={op!r}.")
    if gradient_predivide_factor != 1.0 and op != framework.Average:
        raise ValueError("gradient_predivide_factor other than 1.0 requires op=Average, got "
                         f"gradient_predivide_factor={gradient_predivide_factor} with op={op!r}.")
    if (isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int)
            or backward_passes_per_step < 1):
        raise ValueError("backward_passes_per_step must be an int >= 1, got "
                         f"{backward_passes_per_step!r}.")
    if num_groups:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed.",
                      DeprecationWarning, stacklevel=3)
        if groups is None:
            groups = num_groups
    if groups is not None:
        valid_int = isinstance(groups, int) and not isinstance(groups, bool) and groups > 0
        if not valid_int and not _is_variable_list_of_lists(groups):
            raise ValueError("groups must be None, a positive int (the number of groups) or a "
                             f"non-empty list of lists of variables, got {groups!r}.")
    if getattr(compression, "stateful", False):
        check_optimizer_options(compression, op, gradient_predivide_factor)
    elif not (hasattr(compression, "compress") and hasattr(compression, "decompress")):
        raise ValueError("compression must be one of hvd.Compression (none, fp16 or bf16) or a compressor with "
                         f"state (hvd.PowerSGD, hvd.TopK), got {compression!r}.")
    if process_set is None:
        process_set = framework.global_process_set

    base = type(optimizer)
    settings = _Settings(keras, backend, base.__name__, name, compression, sparse_as_dense, op,
                         gradient_predivide_factor, backward_passes_per_step,
                         average_aggregated_gradients, groups, process_set,
                         scale_local_gradients)
    # Same name, module and qualified name as the wrapped class: Keras serialises the optimizer
    # under them, so a saved model loads (with the plain optimizer) where Horovod is absent.
    cls = type(base.__name__, (_DistributedOptimizer, base),
               {"_hvd_settings": settings, "__module__": base.__module__,
                "__qualname__": base.__qualname__})
    return cls.from_config(optimizer.get_config())


def is_distributed(optimizer):
    """Whether ``optimizer`` was made by :func:`create_distributed_optimizer`."""
    return isinstance(optimizer, _DistributedOptimizer)


def load_model(keras, filepath, custom_optimizers=None, custom_objects=None, compression=None,
               backend=None):
    """Loads a model saved by Keras (``model.save``) and, when it was saved compiled, gives it a
    distributed copy of its optimizer, with the optimizer's saved state (slots, iterations).

    Raises:
        ValueError: ``custom_optimizers`` is not a list of optimizer classes; the loaded
            optimizer's state does not fit its distributed copy.
    """
    if backend is None:
        from horovod._keras.backend import load
        backend = load(keras.backend.backend())
    objects = {}
    for cls in custom_optimizers or []:
        if not (isinstance(cls, type) and issubclass(cls, keras.optimizers.Optimizer)):
            raise ValueError("custom_optimizers must be a list of Keras optimizer classes, got "
                             f"{cls!r}.")
        objects[cls.__name__] = cls
    objects.update(custom_objects or {})
    model = keras.models.load_model(filepath, custom_objects=objects)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or is_distributed(optimizer):
        return model
    if compression is None:
        compression = backend.Compression.none
    distributed = create_distributed_optimizer(
        keras, optimizer, None, "", "", compression, False, 1.0, backend.framework.Average,
        backend=backend)
    if optimizer.built:
        distributed.build(list(optimizer._trainable_variables))
        source, target = list(optimizer.variables), list(distributed.variables)
        if len(source) != len(target):
            raise ValueError(f"the optimizer loaded from {filepath} has {len(source)} variables, "
                             f"its distributed copy {len(target)}; cannot carry its state over.")
        for dst, src in zip(target, source, strict=True):
            dst.assign(src)
    model.optimizer = distributed
    return model


def _to_tensor(keras, value):
    return keras.ops.convert_to_tensor(value)


def allreduce(keras, backend, value, name, op, prescale_factor, postscale_factor, compression):
    """Allreduce of ``value`` (a number, numpy array or backend tensor) across all ranks;
    returns a backend tensor of the same shape."""
    tensor, ctx = compression.compress(_to_tensor(keras, value))
    reduced = backend.allreduce(tensor, op, prescale_factor, postscale_factor, name=name)
    return compression.decompress(reduced, ctx)


def allgather(keras, backend, value, name):
    """Concatenation along dimension 0 of every rank's ``value`` (rank order); backend tensor."""
    return backend.allgather(_to_tensor(keras, value), name=name)


def broadcast(keras, backend, value, root_rank, name):
    """``root_rank``'s ``value`` on every rank; backend tensor."""
    return backend.broadcast(_to_tensor(keras, value), root_rank, name=name)


def reducescatter(keras, backend, value, name, op):
    """This rank's slice (along dimension 0) of the reduction of every rank's ``value``."""
    return backend.reducescatter(_to_tensor(keras, value), op, name=name)


def broadcast_variables(keras, backend, variables, root_rank, process_set=None,
                        name="broadcast_variables"):
    """Sets every variable in ``variables`` (Keras variables) to its value on ``root_rank``.

    The values travel bitwise as one uint8 buffer, in one broadcast whatever their dtypes; every
    rank must pass variables of the same shapes and dtypes in the same order.

    Raises:
        ValueError: ``root_rank`` is not a rank of the process set (from the engine).
        HorovodInternalError: the ranks' buffers differ in size (different variables).
    """
    variables = list(variables)
    if not variables:
        return
    if process_set is None:
        process_set = backend.framework.global_process_set
    arrays = [np.asarray(keras.ops.convert_to_numpy(v.value), order="C") for v in variables]
    flat = np.concatenate([a.reshape(-1).view(np.uint8) for a in arrays])
    received = backend.to_numpy(backend.broadcast(backend.to_tensor(flat), root_rank,
                                                  process_set=process_set, name=name))
    offset = 0
    for v, a in zip(variables, arrays, strict=True):
        chunk = received[offset:offset + a.nbytes]
        offset += a.nbytes
        v.assign(chunk.view(a.dtype).reshape(a.shape))
