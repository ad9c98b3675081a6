"""Horovod for Keras 3: data-parallel ``model.fit`` over many processes and hosts.

``import horovod.keras as hvd`` works on the Keras backends 'tensorflow' and 'torch' (chosen by
``KERAS_BACKEND`` as usual); the collectives go through ``horovod.tensorflow`` or
``horovod.torch`` respectively, and only that framework is imported. Call ``hvd.init()``, scale
the learning rate by ``hvd.size()``, wrap the optimizer in ``hvd.DistributedOptimizer``, and pass
``hvd.callbacks.BroadcastGlobalVariablesCallback(0)`` (and usually
``hvd.callbacks.MetricAverageCallback()``) to ``model.fit``.

Values returned by :func:`allreduce`, :func:`allgather`, :func:`broadcast` and
:func:`reducescatter` are tensors of the Keras backend (``tf.Tensor`` or ``torch.Tensor``).
"""

from importlib.metadata import PackageNotFoundError as _PackageNotFoundError, version as _version

from horovod.common.util import check_framework_package as _check_framework_package

try:
    _check_framework_package("horovod-keras", _version("horovod-keras"))
except _PackageNotFoundError:
    pass  # running from a source tree rather than an installed distribution

import keras

import horovod._keras as _impl
from horovod.keras._selected import backend as _backend
_framework = _backend.framework

init = _framework.init
shutdown = _framework.shutdown
is_initialized = _framework.is_initialized
start_timeline = _framework.start_timeline
stop_timeline = _framework.stop_timeline
dump_flight_recorder = _framework.dump_flight_recorder
size = _framework.size
local_size = _framework.local_size
cross_size = _framework.cross_size
rank = _framework.rank
local_rank = _framework.local_rank
cross_rank = _framework.cross_rank
mpi_threads_supported = _framework.mpi_threads_supported
mpi_enabled = _framework.mpi_enabled
mpi_built = _framework.mpi_built
gloo_enabled = _framework.gloo_enabled
gloo_built = _framework.gloo_built
nccl_built = _framework.nccl_built
ddl_built = _framework.ddl_built
ccl_built = _framework.ccl_built
cuda_built = _framework.cuda_built
rocm_built = _framework.rocm_built
global_process_set = _framework.global_process_set
Average = _framework.Average
Sum = _framework.Sum
Adasum = _framework.Adasum
Compression = _backend.Compression
# Compressors with state (horovod.common.stateful_compression), registered for the backend's tensors.
PowerSGD = _framework.PowerSGD
TopK = _framework.TopK

from horovod.keras import callbacks, elastic  # noqa: E402,F401  (hvd.callbacks, hvd.elastic)


def DistributedOptimizer(optimizer, name=None, device_dense='', device_sparse='',
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=Average, num_groups=0, groups=None,
                         backward_passes_per_step=1, average_aggregated_gradients=False,
                         process_set=global_process_set, scale_local_gradients=True):
    """Returns a copy of the Keras optimizer ``optimizer`` whose updates use gradients reduced
    over all ranks (of ``process_set``) before they are applied.

    Works with ``model.fit`` and with ``optimizer.apply(grads, variables)`` /
    ``apply_gradients`` in custom loops. The result is an instance of a subclass of
    ``type(optimizer)`` with the same class name, made from ``optimizer.get_config()``, so a model
    saved with it loads without Horovod.

    Args:
        optimizer: a Keras 3 optimizer (``keras.optimizers.Optimizer``), not yet distributed.
        name: name of the copy; default ``"Distributed" + type(optimizer).__name__``.
        device_dense, device_sparse: accepted for compatibility; the engine reduces CPU memory.
        compression: ``hvd.Compression.none``, ``hvd.Compression.fp16`` or
            ``hvd.Compression.bf16`` (gradients travel as float16 or bfloat16 and are cast back).
            Or a compressor with state, ``hvd.PowerSGD(...)`` or ``hvd.TopK(...)``
            (``horovod.common.stateful_compression``): every gradient of a step goes to one
            ``reduce`` of the compressor, which keeps its residuals and factors per variable
            (``groups`` and ``gradient_predivide_factor`` do not apply; on TensorFlow it runs
            eagerly only: ``model.compile(..., run_eagerly=True)``, else ``ValueError`` at the
            first step). Save it with ``compression.state_dict()``; ``hvd.elastic.KerasState``
            syncs it from rank 0 and empties its residuals at every reset.
        sparse_as_dense: turn sparse gradients (``tf.IndexedSlices`` of embeddings) dense before
            the allreduce; otherwise they are allgathered.
        gradient_predivide_factor: with ``op=Average``, gradients are multiplied by
            ``1/factor`` before the sum and by ``factor/size`` after it.
        op: ``hvd.Average`` (default) or ``hvd.Sum``.
        num_groups: deprecated spelling of an int ``groups``.
        groups: None (all gradients in one grouped allreduce), an int ``k`` (``k`` groups of
            consecutive gradients), or a list of lists of variables reduced together (the rest
            form one more group).
        backward_passes_per_step: ``N >= 1``; gradients of ``N`` consecutive calls are summed
            locally and reduced and applied once, at the N-th call.
        average_aggregated_gradients: divide the ``N`` summed gradients by ``N``.
        process_set: the ranks to reduce over (default: all).
        scale_local_gradients: divide the gradients of variables registered with
            ``register_local_var`` (never reduced) by the process set size.

    Raises:
        ValueError: see ``horovod._keras.create_distributed_optimizer``.
    """
    return _impl.create_distributed_optimizer(
        keras, optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
        gradient_predivide_factor, op, backward_passes_per_step, average_aggregated_gradients,
        groups, process_set, scale_local_gradients, backend=_backend, num_groups=num_groups)


def PartialDistributedOptimizer(optimizer, name=None, device_dense='', device_sparse='',
                                compression=Compression.none, sparse_as_dense=False,
                                gradient_predivide_factor=1.0, op=Average,
                                backward_passes_per_step=1, average_aggregated_gradients=False,
                                groups=None, process_set=global_process_set, local_layers=None,
                                scale_local_gradients=True):
    """A :func:`DistributedOptimizer` whose trainable weights of ``local_layers`` (a Keras layer
    or a list of them) are local: their gradients are not reduced across ranks.

    The arguments ``optimizer``, ``name``, ``device_dense``, ``device_sparse``, ``compression``,
    ``sparse_as_dense``, ``gradient_predivide_factor``, ``op``, ``backward_passes_per_step``,
    ``average_aggregated_gradients``, ``groups``, ``process_set`` and ``scale_local_gradients``
    are those of :func:`DistributedOptimizer`.

    Args:
        local_layers: a Keras layer or a list of them whose trainable weights are local.

    Raises:
        ValueError: an entry of ``local_layers`` is not a Keras layer, or as for
            :func:`DistributedOptimizer`.
    """
    if local_layers is None:
        local_layers = []
    elif isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    for layer in local_layers:
        if not isinstance(layer, keras.layers.Layer):
            raise ValueError('local_layers must be a Keras layer or a list of Keras layers, got '
                             f'{type(layer).__name__}.')
    opt = DistributedOptimizer(
        optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
        compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op, groups=groups,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, process_set=process_set,
        scale_local_gradients=scale_local_gradients)
    for layer in local_layers:
        for var in layer.trainable_weights:
            opt.register_local_var(var)
    return opt


def broadcast_variables(variables, root_rank=0, process_set=global_process_set):
    """Sets each Keras variable of ``variables`` to its value on ``root_rank`` (bitwise, one
    broadcast for all of them). Every rank passes the same variables in the same order.

    Args:
        variables: a list of Keras variables (any shapes and dtypes).
        root_rank (int): the global rank whose values are sent.
        process_set: the ``ProcessSet`` to broadcast over (default: every rank).
    """
    _impl.broadcast_variables(keras, _backend, variables, root_rank, process_set)


def broadcast_global_variables(root_rank):
    """Keras 3 has no global variable collection to broadcast.

    Raises:
        RuntimeError: always; it says to use ``callbacks.BroadcastGlobalVariablesCallback`` with
            ``model.fit``, or ``broadcast_variables(model.variables, root_rank)``.
    """
    raise RuntimeError('Keras 3 keeps no global variables: pass '
                       'hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank) to model.fit, or '
                       'call hvd.broadcast_variables(model.variables + optimizer.variables, '
                       'root_rank) once both are built.')


def allreduce(value, name=None, average=True, prescale_factor=1.0, postscale_factor=1.0, op=None,
              compression=Compression.none):
    """Reduces ``value`` (a number, numpy array or backend tensor; dtype int32, int64 or a
    float type) over all ranks and returns a backend tensor of the same shape.

    ``op`` (``hvd.Average``, ``hvd.Sum``, ...) takes precedence over ``average`` (True: Average,
    False: Sum); ``result = postscale * op(prescale * value)``.

    Args:
        value: a number, numpy array or backend tensor (int32, int64 or float; any shape).
        name (str): the engine name, the same on every rank; None for an automatic one.
        average (bool): deprecated; True for Average, False for Sum.
        prescale_factor, postscale_factor (float): factors applied before and after the reduction.
        op: ``hvd.Average``, ``hvd.Sum``, ... or None for what ``average`` says.
        compression: ``hvd.Compression.none``, ``hvd.Compression.fp16`` or
            ``hvd.Compression.bf16`` (sent as float16 or bfloat16).

    Raises:
        ValueError: both ``op`` and ``average=False`` given; an unsupported dtype (from the
            framework's allreduce).
    """
    if op is None:
        op = Average if average else Sum
    elif average is not True:
        raise ValueError('The op parameter supersedes average. Please provide only one of them.')
    return _impl.allreduce(keras, _backend, value, name, op, prescale_factor, postscale_factor,
                           compression)


def allgather(value, name=None):
    """Concatenation of every rank's ``value`` along dimension 0, in rank order (first dimensions
    may differ); a backend tensor.

    Args:
        value: a numpy array or backend tensor; the other dimensions and the dtype are the same on
            every rank.
        name (str): the engine name, the same on every rank; None for an automatic one.
    """
    return _impl.allgather(keras, _backend, value, name)


def broadcast(value, root_rank, name=None):
    """``value`` of rank ``root_rank``, on every rank (same shape and dtype on all ranks).

    Args:
        value: a numpy array or backend tensor.
        root_rank (int): the global rank whose value is sent.
        name (str): the engine name, the same on every rank; None for an automatic one.
    """
    return _impl.broadcast(keras, _backend, value, root_rank, name)


def reducescatter(value, name=None, op=Average):
    """Reduces ``value`` over all ranks (``op`` Average or Sum) and returns this rank's part of
    dimension 0 (the first ``dim0 % size`` ranks get one extra row).

    Args:
        value: a numpy array or backend tensor, the same shape and dtype on every rank.
        name (str): the engine name, the same on every rank; None for an automatic one.
        op: ``hvd.Average`` (default) or ``hvd.Sum``.
    """
    return _impl.reducescatter(keras, _backend, value, name, op)


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none, legacy_opts=False):
    """Loads a model saved with ``model.save`` (``.keras``), giving it a :func:`DistributedOptimizer`
    copy of its optimizer with the saved optimizer state and ``compression``.

    Args:
        filepath: path of the saved model.
        custom_optimizers: optimizer classes the file refers to that Keras does not know.
        custom_objects: other custom classes or functions, as for ``keras.models.load_model``.
        compression: the distributed optimizer's gradient compression.
        legacy_opts: must be False (Keras 3 has no legacy optimizers).

    Raises:
        ValueError: ``legacy_opts`` is True; see :func:`horovod._keras.load_model`.
    """
    if legacy_opts:
        raise ValueError('legacy_opts=True needs keras.optimizers.legacy, which Keras 3 does not '
                         'have.')
    return _impl.load_model(keras, filepath, custom_optimizers, custom_objects, compression,
                            backend=_backend)
