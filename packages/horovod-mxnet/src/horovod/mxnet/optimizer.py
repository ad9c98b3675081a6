"""Data-parallel training: an MXNet optimizer and a gluon trainer that average gradients over
the ranks of a process set before every update."""

import collections
import warnings

from horovod.common.util import split_list
from horovod.mxnet import mpi_ops
from horovod.mxnet.compression import Compression
from horovod.mxnet.mpi_ops import Average, Sum, global_process_set

import mxnet as mx


def _averaging(gradient_predivide_factor, process_set):
    """How gradients are averaged: ``(op, prescale, postscale, factor for the framework)``.

    The engine's result is ``postscale * SUM(prescale * g)`` (divided by the set size for
    Average). Upstream averages in the engine only where NCCL >= 2.10 reduces with the scale
    factors (``nccl_built() >= 21000``, not ROCm); otherwise, CPU-only builds included, it sums
    and lets the framework multiply the gradients by ``gradient_predivide_factor / set size``.
    Either way the update sees the mean gradient.
    """
    if gradient_predivide_factor <= 0:
        raise ValueError('gradient_predivide_factor must be positive, got '
                         f'{gradient_predivide_factor!r}.')
    if gradient_predivide_factor != 1.0 and mpi_ops.rocm_built():
        raise ValueError('gradient_predivide_factor other than 1.0 is not supported with ROCm.')
    prescale = 1.0 / gradient_predivide_factor
    if mpi_ops.nccl_built() < 21000 or mpi_ops.rocm_built():
        return Sum, prescale, 1.0, gradient_predivide_factor / process_set.size()
    return Average, prescale, gradient_predivide_factor, 1.0


def _check_process_set(process_set):
    if not isinstance(process_set, mpi_ops.ProcessSet):
        raise ValueError('process_set must be a horovod ProcessSet, '
                         f'got {type(process_set).__name__}.')


def _check_num_groups(num_groups):
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 0:
        raise ValueError(f'num_groups must be an int >= 0, got {num_groups!r}.')


class DistributedOptimizer(mx.optimizer.Optimizer):
    """Wraps an MXNet optimizer so that every update first averages the gradients over the
    ranks of ``process_set``.

    ``update`` and ``update_multi_precision`` allreduce the gradients in place, then call the
    wrapped optimizer's method. With a list of indices (an aggregated update) and
    ``num_groups > 0``, the gradients go in ``num_groups`` grouped allreduces named
    ``"<first index>:<last index>"``; otherwise each gradient is allreduced under the name
    ``str(index)``. Every rank must therefore update the same indices in the same way. Other
    attributes are read from and written to the wrapped optimizer, which is ``_optimizer``.

    With this CPU build the average is a sum in the engine and the wrapped optimizer's
    ``rescale_grad`` is multiplied by ``gradient_predivide_factor / set size`` (see
    ``_averaging``). A gluon ``Trainer`` overwrites ``rescale_grad`` at every step: use
    :class:`DistributedTrainer` with gluon.

    Args:
        optimizer: the ``mx.optimizer.Optimizer`` to wrap.
        gradient_predivide_factor: float > 0; gradients are divided by it before the sum and
            the sum by ``set size / gradient_predivide_factor`` after it (1.0: plain average).
        num_groups: int >= 0; 0 sends one allreduce per gradient.
        process_set: the ``ProcessSet`` to average over (default: all ranks). Ranks outside it
            update with their local gradients.

    Raises:
        ValueError: ``optimizer`` is not an MXNet optimizer, or an argument is out of range.
    """

    def __init__(self, optimizer, gradient_predivide_factor=1.0, num_groups=0,
                 process_set=global_process_set):
        # The base initialiser is not called: the wrapped optimizer holds every setting.
        if not isinstance(optimizer, mx.optimizer.Optimizer):
            raise ValueError('DistributedOptimizer wraps an mx.optimizer.Optimizer, got '
                             f'{type(optimizer).__name__}.')
        _check_process_set(process_set)
        _check_num_groups(num_groups)
        self._optimizer = optimizer
        self._num_groups = num_groups
        self._process_set = process_set
        self._op, self._prescale, self._postscale, factor = _averaging(
            float(gradient_predivide_factor), process_set)
        # What this wrapper multiplied the wrapped optimizer's rescale_grad by.
        self._rescale_factor = 1.0
        if process_set.included() and process_set.size() > 1:
            self._rescale_factor = factor
            optimizer.rescale_grad *= factor

    def __getattr__(self, item):
        # Only reached for names this wrapper lacks; before __init__ has run (copying,
        # unpickling) there is nothing to forward to.
        try:
            wrapped = self.__dict__['_optimizer']
        except KeyError:
            raise AttributeError(item) from None
        return getattr(wrapped, item)

    def __setattr__(self, name, value):
        if name.startswith('_'):
            object.__setattr__(self, name, value)
        else:
            setattr(self._optimizer, name, value)

    def __getstate__(self):
        # The base class's state handling expects its own attributes, which live in the
        # wrapped optimizer (pickled by its own rules). MXNet's updaters pickle the optimizer
        # when saving states with dump_optimizer=True.
        return dict(self.__dict__)

    def __setstate__(self, state):
        self.__dict__.update(state)

    def create_state_multi_precision(self, index, weight):
        """The wrapped optimizer's ``create_state_multi_precision(index, weight)``: the state of
        one weight (with a float32 master copy for float16 weights).

        Args:
            index (int): the weight's index.
            weight: the weight's NDArray.
        """
        return self._optimizer.create_state_multi_precision(index, weight)

    def create_state(self, index, weight):
        """The wrapped optimizer's ``create_state(index, weight)``: the state of one weight.

        Args:
            index (int): the weight's index.
            weight: the weight's NDArray.
        """
        return self._optimizer.create_state(index, weight)

    def _set_current_context(self, device_id):
        self._optimizer._set_current_context(device_id)

    def _allreduce_grads(self, index, grad):
        if not self._process_set.included() or self._process_set.size() == 1:
            return
        settings = dict(op=self._op, prescale_factor=self._prescale,
                        postscale_factor=self._postscale, process_set=self._process_set)
        if not isinstance(index, (list, tuple)):
            index, grad = [index], [grad]
        grads = list(grad)
        mpi_ops._check_arrays(grads, mpi_ops._REDUCE_DTYPES, 'DistributedOptimizer')
        if self._num_groups > 0:
            indices = split_list(list(index), self._num_groups)
            grouped = split_list(grads, self._num_groups)
            starts = [(lambda g=g, i=i: mpi_ops._start_allreduce(
                g, g, None, f'{i[0]}:{i[-1]}', grouped=True, **settings))
                for g, i in zip(grouped, indices, strict=True) if g]
        else:
            starts = [(lambda g=g, i=i: mpi_ops._start_allreduce(
                [g], [g], None, str(i), grouped=False, **settings))
                for g, i in zip(grads, index, strict=True)]
        mpi_ops._run_all(starts)

    def update(self, index, weight, grad, state):
        """Averages ``grad`` over the set in place, then calls the wrapped ``update``.

        Args:
            index: int, or a list of ints (one per weight) for an aggregated update.
            weight, grad: NDArrays (or lists of them), as the wrapped optimizer takes them;
                gradients are dense CPU NDArrays of a dtype allreduce supports.
            state: the optimizer state of ``create_state``.

        Raises:
            ValueError: a gradient allreduce cannot take.
            HorovodInternalError: ranks disagree on the gradients' shapes or dtypes, or
                Horovod is not running.
        """
        self._allreduce_grads(index, grad)
        self._optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index, weight, grad, state):
        """As :meth:`update`, then calls the wrapped ``update_multi_precision``.

        Args:
            index, weight, grad, state: as for :meth:`update`.
        """
        self._allreduce_grads(index, grad)
        self._optimizer.update_multi_precision(index, weight, grad, state)

    def set_learning_rate(self, lr):
        """Sets the wrapped optimizer's learning rate.

        Args:
            lr (float): the new rate.
        """
        self._optimizer.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult):
        """Sets the wrapped optimizer's per-parameter learning-rate multipliers.

        Args:
            args_lr_mult (dict): parameter name or index -> multiplier (float).
        """
        self._optimizer.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult):
        """Sets the wrapped optimizer's per-parameter weight-decay multipliers.

        Args:
            args_wd_mult (dict): parameter name or index -> multiplier (float).
        """
        self._optimizer.set_wd_mult(args_wd_mult)


class DistributedTrainer(mx.gluon.Trainer):
    """A gluon ``Trainer`` whose ``step`` averages every gradient over the ranks of
    ``process_set`` before updating.

    It is built without a kvstore (Horovod replaces it). Before each update, every parameter
    with ``grad_req != 'null'`` has its gradient compressed, allreduced in place under the name
    ``<prefix><i>`` (``i``: the parameter's position in the trainer), and decompressed back into
    the gradient; with ``num_groups > 0`` the gradients instead go in ``num_groups`` grouped
    allreduces, split further by dtype, named ``<prefix><first i>:<prefix><last i>``. All
    allreduces of a step are submitted before any is waited on, so the engine fuses them.
    Nothing is sent when the set has one rank or this rank is not in it. Every rank must build
    the same model the same way: gluon names parameters with per-process counters
    (``dense3_weight``), and those names decide the positions.

    With this CPU build the average is a sum in the engine, and the trainer's gradient scale
    is multiplied by ``gradient_predivide_factor / set size`` (see ``_averaging``).

    Args:
        params: the parameters to train: a ``ParameterDict`` or ``dict`` (taken in sorted key
            order, as gluon does), or a list or tuple of ``Parameter`` (sorted by name, so that
            every rank numbers them alike).
        optimizer: an optimizer name or ``mx.optimizer.Optimizer``; a
            :class:`DistributedOptimizer` is unwrapped, with a warning (and the wrapped
            optimizer's ``rescale_grad`` restored to what it was before wrapping).
        optimizer_params: dict of options when ``optimizer`` is a name.
        compression: ``Compression.none`` (default) or ``Compression.fp16``.
        gradient_predivide_factor: float > 0, as for :class:`DistributedOptimizer`.
        prefix: str or None; prepended to the allreduce names, so that several trainers in
            one program do not collide.
        num_groups: int >= 0; 0 sends one allreduce per gradient.
        process_set: the ``ProcessSet`` to average over (default: all ranks).

    Raises:
        ValueError: ``prefix`` is not a str or None, or another argument is out of range;
            during ``step``, a parameter on more than one context (Horovod runs one context
            per process) or a gradient allreduce cannot take.
        HorovodInternalError: during ``step``, ranks disagree on the gradients' shapes or
            dtypes, or Horovod is not running.
    """

    def __init__(self, params, optimizer, optimizer_params=None, compression=Compression.none,
                 gradient_predivide_factor=1.0, prefix=None, num_groups=0,
                 process_set=global_process_set):
        if isinstance(optimizer, DistributedOptimizer):
            warnings.warn('DistributedTrainer averages the gradients itself; the '
                          'DistributedOptimizer passed to it is replaced by the optimizer it '
                          'wraps.', stacklevel=2)
            # Undo the wrapper's averaging factor, which the trainer applies itself.
            optimizer._optimizer.rescale_grad /= optimizer._rescale_factor
            optimizer = optimizer._optimizer
        if prefix is not None and not isinstance(prefix, str):
            raise ValueError(f'prefix must be a str or None, got {type(prefix).__name__}.')
        _check_process_set(process_set)
        _check_num_groups(num_groups)
        if isinstance(params, dict):
            params = collections.OrderedDict(params)
        elif isinstance(params, (list, tuple)):
            params = sorted(params, key=lambda p: p.name)
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=None)
        self._compression = compression
        self._prefix = prefix or ''
        self._num_groups = num_groups
        self._process_set = process_set
        self._op, self._prescale, self._postscale, factor = _averaging(
            float(gradient_predivide_factor), process_set)
        if process_set.included() and process_set.size() > 1:
            self._scale *= factor

    def _allreduce_grads(self):
        if self._process_set.size() == 1 or not self._process_set.included():
            return
        entries = []  # (position, gradient, compressed gradient, compression context)
        for i, param in enumerate(self._params):
            if param.grad_req == 'null':
                continue
            grads = param.list_grad()
            if len(grads) != 1:
                raise ValueError(f'DistributedTrainer: parameter {param.name} lives on '
                                 f'{len(grads)} contexts; Horovod trains one context per '
                                 'process.')
            compressed, ctx = self._compression.compress(grads[0])
            entries.append((i, grads[0], compressed, ctx))
        if not entries:
            return
        mpi_ops._check_arrays([e[2] for e in entries], mpi_ops._REDUCE_DTYPES,
                              'DistributedTrainer')
        settings = dict(op=self._op, prescale_factor=self._prescale,
                        postscale_factor=self._postscale, process_set=self._process_set)
        # Submitted last parameter first: backward produces the gradients of the last layers
        # first, so their allreduces run while MXNet is still computing the earlier ones
        # (each submission waits only for its own gradients).
        starts = []
        if self._num_groups > 0:
            for group in split_list(entries, self._num_groups):
                by_dtype = collections.defaultdict(list)
                for entry in group:
                    by_dtype[entry[2].dtype].append(entry)
                for members in by_dtype.values():
                    name = f'{self._prefix}{members[0][0]}:{self._prefix}{members[-1][0]}'
                    arrays = [e[2] for e in members]
                    starts.append(lambda a=arrays, n=name: mpi_ops._start_allreduce(
                        a, a, None, n, grouped=True, **settings))
        else:
            for i, _, compressed, _ in entries:
                starts.append(lambda c=compressed, n=f'{self._prefix}{i}':
                              mpi_ops._start_allreduce([c], [c], None, n, grouped=False,
                                                       **settings))
        mpi_ops._run_all(starts[::-1])
        for _, grad, compressed, ctx in entries:
            restored = self._compression.decompress(compressed, ctx)
            if restored is not grad:
                restored.copyto(grad)
