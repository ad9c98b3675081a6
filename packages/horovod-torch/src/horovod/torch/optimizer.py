"""``DistributedOptimizer``: wraps a torch optimizer so that ``step()`` applies gradients
averaged over all ranks.

Each parameter's gradient is allreduced as soon as backward has finished accumulating it: a hook
on the parameter's gradient accumulator submits an asynchronous in-place allreduce, so
communication overlaps the rest of the backward pass. ``step()`` (or an explicit
``synchronize()``) waits for the allreduces, then runs the wrapped optimizer's step.

With ``op=Adasum`` and more than one rank, each rank instead steps locally during backward and
the parameter changes are combined with Adasum (``_DistributedAdasumOptimizer``).
"""

import contextlib
import os
import warnings

from horovod.common.process_sets import check_adasum_process_set
from horovod.common.stateful_compression import check_optimizer_options
from horovod.common.util import split_list
from horovod.torch import mpi_ops
from horovod.torch.compression import Compression
from horovod.torch.functions import broadcast_object
from horovod.torch.mpi_ops import (
    Adasum,
    Average,
    allreduce_async_,
    global_process_set,
    grouped_allreduce_async_,
    size,
    synchronize,
)

import torch


_TOO_MANY_PASSES = ('Gradients were computed more than backward_passes_per_step times before '
                    'step() was called. Increase backward_passes_per_step to accumulate '
                    'gradients locally.')
_ZERO_GRAD_PENDING = ('optimizer.zero_grad() was called after loss.backward() but before '
                      'optimizer.step() or optimizer.synchronize(); this races with the '
                      'gradient allreduce and is not allowed.')


# The handle of a gradient left for the stateful compressor's reduce in synchronize().
_DEFERRED = object()


def _hook_grad_accumulator(p, hook):
    """Registers ``hook`` on ``p``'s gradient accumulator and returns the accumulator (keep it
    alive: the hook lives on it).

    ``expand_as`` gives a view whose grad_fn leads to p's AccumulateGrad node; a hook there
    runs once per backward, after ``p.grad`` holds the new gradient. Grad mode is switched on
    in case the optimizer is built under ``torch.no_grad()``.
    """
    with torch.enable_grad():
        grad_acc = p.expand_as(p).grad_fn.next_functions[0][0]
    grad_acc.register_hook(hook)
    return grad_acc


def _find_duplicates(lst):
    """Returns the set of items that occur more than once in ``lst``."""
    seen, duplicates = set(), set()
    for item in lst:
        if item in seen:
            duplicates.add(item)
        seen.add(item)
    return duplicates


def _name_parameters(param_groups, named_parameters, default_name):
    """Returns the dict param -> allreduce name; ``default_name(group index, index in group)``
    names the params when ``named_parameters`` is None."""
    if named_parameters is None:
        return {p: default_name(i, j)
                for i, group in enumerate(param_groups)
                for j, p in enumerate(group['params'])}
    named_parameters = list(named_parameters)
    if any(not isinstance(entry, tuple) or len(entry) != 2 for entry in named_parameters):
        raise ValueError('named_parameters must be a sequence of (name, parameter) tuples, '
                         'as returned by model.named_parameters().')
    duplicates = _find_duplicates([name for name, _ in named_parameters])
    if duplicates:
        raise ValueError('Parameter names in named_parameters must be unique; duplicates: '
                         f'{", ".join(sorted(map(str, duplicates)))}.')
    named_ids = {id(p) for _, p in named_parameters}
    unnamed = [id(p) for group in param_groups for p in group['params']
               if id(p) not in named_ids]
    if unnamed:
        raise ValueError('named_parameters was given, but some parameters of the optimizer '
                         'are not named in it; their Python object ids: '
                         f'{", ".join(map(str, unnamed))}.')
    return {p: name for name, p in named_parameters}


class _DistributedOptimizer:
    """Mixin placed before the wrapped optimizer's class in a dynamically created subclass
    (see :func:`DistributedOptimizer`); ``super()`` here reaches the wrapped class."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, groups, sparse_as_dense, process_set, defaults):
        super().__init__(params)
        self.defaults = defaults
        self._compression = compression
        # A compressor with state (horovod.torch.stateful_compression) combines all the
        # gradients of a step at once, in synchronize(), instead of one allreduce per hook.
        self._stateful = getattr(compression, 'stateful', False)
        self._sparse_as_dense = sparse_as_dense
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.process_set = process_set
        self._parameter_names = _name_parameters(self.param_groups, named_parameters,
                                                 lambda i, j: f'allreduce.noname.{i}.{j}')

        self._handles = {}
        # param -> sparse_dim of its sparse gradient, for those that sparse_as_dense made dense
        # for the allreduce: made sparse again before the wrapped optimizer's step (an optimizer
        # such as SparseAdam takes only sparse gradients).
        self._densified = {}
        self._grad_accs = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True
        self._allreduce_delay = {p: backward_passes_per_step
                                 for group in self.param_groups for p in group['params']}
        # param -> tuple of the params allreduced together with it (only for grouped params).
        self._group_of = {}
        if isinstance(groups, list):
            for p in (p for unit in groups for p in unit):
                if p not in self._allreduce_delay:
                    raise ValueError('groups lists a tensor that is not a parameter of the '
                                     f'optimizer (shape {tuple(p.shape)}).')
        # size() first: it raises a clear ValueError when Horovod is not initialised.
        if (size() > 1 or os.environ.get('HOROVOD_ELASTIC') == '1') and process_set.included():
            self._make_groups(groups)
            self._register_hooks()

    def _make_groups(self, groups):
        if groups is None:
            return
        if isinstance(groups, int):
            trainable = [p for group in self.param_groups for p in group['params']
                         if p.requires_grad]
            # Every rank must build the same groups: take rank 0's parameter order.
            by_name = {self._parameter_names[p]: p for p in trainable}
            names = broadcast_object([self._parameter_names[p] for p in trainable],
                                     root_rank=self.process_set.ranks[0],
                                     name='DistributedOptimizer.groups',
                                     process_set=self.process_set)
            units = [[by_name[n] for n in chunk] for chunk in split_list(names, groups)]
        else:
            # Members that need no gradient never fire a hook; leave them out so that the
            # group does not wait for them.
            units = [[p for p in unit if p.requires_grad] for unit in groups]
        for unit in units:
            if unit:
                members = tuple(unit)
                for p in members:
                    self._group_of[p] = members

    def _register_hooks(self):
        for group in self.param_groups:
            for p in group['params']:
                if p.requires_grad:
                    self._requires_update.add(p)
                    self._grad_accs.append(_hook_grad_accumulator(p, self._make_hook(p)))

    def _make_hook(self, p):
        def hook(*_):
            # The delay reaches 0 at the pass that submits p's allreduce and is reset only when
            # its handle is cleared, so a delay of 0 also covers "already submitted".
            if self._allreduce_delay[p] <= 0:
                raise AssertionError(_TOO_MANY_PASSES)
            self._allreduce_delay[p] -= 1
            self._handles[p] = (None, None)
            if self._allreduce_delay[p] == 0:
                unit = self._group_of.get(p, (p,))
                if all(self._allreduce_delay[q] == 0 for q in unit):
                    self._submit(unit)
        return hook

    def _submit(self, unit):
        """Starts the in-place allreduce of the gradients of ``unit`` (one parameter, or all the
        members of one group) and records its handle for each member."""
        compressed = []
        for p in unit:
            if p.grad is None:
                # No gradient on this rank (e.g. the parameter was unused), but other ranks may
                # have one: take part with zeros.
                p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
            elif p.grad.is_sparse:
                if not self._sparse_as_dense:
                    if len(unit) > 1:
                        raise ValueError(f'Parameter {self._parameter_names[p]} has a sparse '
                                         'gradient and is in a group; grouped allreduces are '
                                         'dense: pass sparse_as_dense=True.')
                    handle = mpi_ops.sparse_allreduce_async(
                        p.grad, name=self._parameter_names[p], op=self.op,
                        process_set=self.process_set)
                    self._handles[p] = (handle, None)
                    return
                self._densified[p] = p.grad.sparse_dim()
                p.grad = p.grad.to_dense()
            elif not p.grad.is_contiguous():
                p.grad = p.grad.contiguous()
            if self._stateful:
                self._handles[p] = (_DEFERRED, None)
                continue
            compressed.append(self._compression.compress(p.grad))
        if self._stateful:
            return
        tensors = [t for t, _ in compressed]
        name = self._parameter_names[unit[0]]
        if unit[0] in self._group_of:
            handle = grouped_allreduce_async_(tensors, name=name, op=self.op,
                                              process_set=self.process_set)
        else:
            prescale, postscale = 1.0, 1.0
            if self.op == Average:
                # The engine divides by the set size; predividing by the factor here and
                # multiplying back after the sum keeps large sums in range.
                prescale = 1.0 / self.gradient_predivide_factor
                postscale = self.gradient_predivide_factor
            handle = allreduce_async_(tensors[0], name=name, op=self.op,
                                      prescale_factor=prescale, postscale_factor=postscale,
                                      process_set=self.process_set)
        for p, (_, ctx) in zip(unit, compressed, strict=True):
            self._handles[p] = (handle, ctx)

    def synchronize(self):
        """Waits until every gradient has been allreduced and writes the results into ``.grad``.

        Gradients whose allreduce has not started yet (the parameter took no part in this
        rank's backward, or fewer than ``backward_passes_per_step`` passes ran) are submitted
        first. Call it before modifying gradients (for example clipping), then call ``step()``
        inside :meth:`skip_synchronize`.

        Raises:
            HorovodInternalError: an allreduce failed (ranks disagree, or a peer was lost).
        """
        if not self.process_set.included():
            self._synchronized = True
            return
        try:
            for group in self.param_groups:
                for p in group['params']:
                    if p in self._requires_update and self._handles.get(p, (None,))[0] is None:
                        self._submit(self._group_of.get(p, (p,)))
            if self._stateful:
                self._reduce_deferred()
            waited = {_DEFERRED}
            for p, (handle, _) in list(self._handles.items()):
                if handle in waited:
                    continue
                waited.add(handle)
                if callable(handle):
                    # Sparse: the allgathered entries of every rank, uncoalesced.
                    p.grad.zero_().add_(handle())
                    continue
                unit = self._group_of.get(p, (p,))
                outputs = synchronize(handle)
                if not isinstance(outputs, list):
                    outputs = [outputs]
                for q, output in zip(unit, outputs, strict=True):
                    result = self._compression.decompress(output, self._handles[q][1])
                    # Without compression the allreduce ran in place on the gradient itself,
                    # and set_ onto itself would cost a microsecond per parameter for nothing.
                    if result is not q.grad:
                        q.grad.set_(result)
                    if q in self._densified:
                        # The rows (sparse_dim leading indices) that are not all zero.
                        q.grad = q.grad.to_sparse(self._densified[q])
        finally:
            self._reset_delays(self.backward_passes_per_step)
            self._handles.clear()
            self._densified.clear()
        self._synchronized = True

    def _reduce_deferred(self):
        """The stateful compressor's reduce of every deferred gradient, in name order (the same
        on every rank, whatever order the hooks fired in)."""
        deferred = sorted((p for p, (handle, _) in self._handles.items() if handle is _DEFERRED),
                          key=lambda p: self._parameter_names[p])
        if not deferred:
            return
        reduced = self._compression.reduce([(self._parameter_names[p], p.grad) for p in deferred],
                                           op=self.op, process_set=self.process_set)
        for p, result in zip(deferred, reduced, strict=True):
            p.grad.copy_(result)
            if p in self._densified:
                p.grad = p.grad.to_sparse(self._densified[p])

    def state_dict(self):
        """The wrapped optimizer's state dict; with a stateful compressor, its state too under
        ``'horovod_compression'`` (this rank's residuals, the factors, the step)."""
        state = super().state_dict()
        if self._stateful:
            state['horovod_compression'] = self._compression.state_dict()
        return state

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Context manager inside which ``step()`` does not synchronize; use after an explicit
        :meth:`synchronize`."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        """Synchronizes the gradients (unless inside :meth:`skip_synchronize`), then runs the
        wrapped optimizer's ``step(closure)`` and returns its result."""
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn('optimizer.step() called without optimizer.skip_synchronize() '
                              'after optimizer.synchronize(): the gradients are allreduced a '
                              'second time. Call step() inside `with '
                              'optimizer.skip_synchronize():` when you synchronize yourself.',
                              stacklevel=2)
            self.synchronize()
        self._synchronized = False
        return super().step(closure)

    def _step_without_allreduce(self):
        """The wrapped optimizer's own ``step()``, with no allreduce (broadcast_optimizer_state
        runs it to create the optimizer's state)."""
        return super(_DistributedOptimizer, self).step()

    def zero_grad(self, set_to_none=True):
        """Clears the gradients, as the wrapped optimizer's ``zero_grad``.

        Raises:
            AssertionError: gradients are still being allreduced (called after backward but
                before ``step()`` or ``synchronize()``); clearing them now would race with the
                allreduce.
        """
        if self._handles:
            raise AssertionError(_ZERO_GRAD_PENDING)
        return super().zero_grad(set_to_none)

    def set_backward_passes_per_step(self, passes):
        """Sets how many backward passes accumulate locally before each allreduce.

        Raises:
            ValueError: ``passes`` is not a positive int.
        """
        _check_backward_passes(passes)
        self.backward_passes_per_step = passes
        self._reset_delays(passes)

    def load_state_dict(self, state_dict):
        """Forgets pending allreduces, then loads the state as the wrapped optimizer does; the
        stateful compressor's part (``'horovod_compression'``), when present, goes to the
        compressor."""
        self._handles.clear()
        self._synchronized = False
        self._should_synchronize = True
        self._reset_delays(self.backward_passes_per_step)
        if 'horovod_compression' in state_dict:
            state_dict = dict(state_dict)
            compression_state = state_dict.pop('horovod_compression')
            if self._stateful:
                self._compression.load_state_dict(compression_state)
        return super().load_state_dict(state_dict)

    def _reset_delays(self, passes):
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    find_duplicates = staticmethod(_find_duplicates)


class _DistributedAdasumOptimizer(_DistributedOptimizer):
    """Mixin for ``op=Adasum`` with more than one rank: each rank takes its own optimizer step,
    and the ranks combine the resulting parameter changes (deltas) with the Adasum reduction.

    Per parameter, once backward has accumulated its gradient ``backward_passes_per_step``
    times, the hook copies the parameter into its start tensor, runs the wrapped optimizer's
    step on that parameter alone, and starts an in-place Adasum allreduce of
    ``delta = p - start``. ``step()`` waits for the deltas and sets ``p = start + delta``.
    Adasum: Maleki et al., "Scaling Distributed Training with Adaptive Summation", MLSys 2021.

    It shares ``zero_grad``, ``set_backward_passes_per_step`` and ``load_state_dict`` with
    :class:`_DistributedOptimizer`; ``super(_DistributedOptimizer, self)`` reaches the wrapped
    optimizer's class.
    """

    def __init__(self, params, named_parameters, compression, backward_passes_per_step,
                 process_set, defaults):
        super(_DistributedOptimizer, self).__init__(params)
        self.defaults = defaults
        self._compression = compression
        # A compressor with state (horovod.torch.stateful_compression) combines all the
        # gradients of a step at once, in synchronize(), instead of one allreduce per hook.
        self._stateful = getattr(compression, 'stateful', False)
        self.backward_passes_per_step = backward_passes_per_step
        self.op = Adasum
        self.process_set = process_set
        self._parameter_names = _name_parameters(self.param_groups, named_parameters,
                                                 lambda _, j: f'allreduce.noname.{j}')
        # The default names restart in each param group, so with several groups they repeat,
        # and two allreduces of one name cannot be in flight at once: those are submitted
        # under names that also carry the group index.
        self._allreduce_names = dict(self._parameter_names)
        if named_parameters is None and len(self.param_groups) > 1:
            self._allreduce_names = _name_parameters(
                self.param_groups, None, lambda i, j: f'allreduce.noname.{i}.{j}')
        self._handles = {}
        self._grad_accs = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True
        self._allreduce_delay = {p: backward_passes_per_step
                                 for group in self.param_groups for p in group['params']}
        self._starts = {p: torch.zeros_like(p, requires_grad=False)
                        for group in self.param_groups for p in group['params']}
        self._register_hooks()

    def _make_hook(self, p):
        def hook(*_):
            if self._allreduce_delay[p] <= 0:
                raise AssertionError(_TOO_MANY_PASSES)
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                self._step_and_submit(p)
        return hook

    def _step_one(self, p):
        """Runs the wrapped optimizer's step on ``p`` only (its state and hyper-parameters
        as in its own param group)."""
        saved = [group['params'] for group in self.param_groups]
        try:
            for group in self.param_groups:
                group['params'] = [q for q in group['params'] if q is p]
            super(_DistributedOptimizer, self).step()
        finally:
            for group, params in zip(self.param_groups, saved, strict=True):
                group['params'] = params

    def _step_and_submit(self, p):
        start = self._starts[p]
        with torch.no_grad():
            start.copy_(p)
            self._step_one(p)
            delta = p.detach() - start
        compressed, ctx = self._compression.compress(delta)
        handle = allreduce_async_(compressed, name=self._allreduce_names[p], op=Adasum,
                                  process_set=self.process_set)
        self._handles[p] = (handle, ctx)

    def synchronize(self):
        """Does nothing: the Adasum optimizer combines parameter changes in ``step()``."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Not supported with Adasum.

        Raises:
            AssertionError: always; gradients cannot be modified between synchronization and
                the step, since the local step runs during backward.
        """
        raise AssertionError('Skipping synchronization is not supported when using Adasum: '
                             'the local optimizer step runs during backward.')
        yield  # pragma: no cover (makes this a generator)

    def step(self, closure=None):
        """Finishes the step: runs the local step and starts the Adasum allreduce for the
        parameters whose hook did not (no gradient on this rank, or fewer passes than
        ``backward_passes_per_step``), waits for every delta and applies it.

        Args:
            closure: optional callable that re-evaluates the model and returns the loss; it is
                called first.

        Returns:
            The closure's loss, or None.

        Raises:
            HorovodInternalError: an allreduce failed.
        """
        loss = closure() if closure is not None else None
        try:
            for group in self.param_groups:
                for p in group['params']:
                    if p in self._requires_update and p not in self._handles:
                        self._step_and_submit(p)
            with torch.no_grad():
                for p, (handle, ctx) in self._handles.items():
                    delta = self._compression.decompress(synchronize(handle), ctx)
                    start = self._starts[p]
                    start.add_(delta)
                    p.copy_(start)
        finally:
            self._handles.clear()
            self._reset_delays(self.backward_passes_per_step)
        return loss


def _check_backward_passes(passes):
    if isinstance(passes, bool) or not isinstance(passes, int) or passes <= 0:
        raise ValueError(f'backward_passes_per_step must be a positive int, got {passes!r}.')


def _check_groups(groups):
    if isinstance(groups, bool):
        raise ValueError(f'groups must be a positive int or a list of lists of torch.Tensor, '
                         f'got {groups!r}.')
    if isinstance(groups, int):
        if groups <= 0:
            raise ValueError(f'groups must be a positive int, got {groups}.')
        return
    if not isinstance(groups, list) or not all(isinstance(g, list) for g in groups):
        raise ValueError('groups must be a positive int or a list of lists of torch.Tensor, '
                         f'got {type(groups).__name__}.')
    seen = set()
    for group in groups:
        for p in group:
            if not isinstance(p, torch.Tensor):
                raise ValueError('groups must contain only torch.Tensor parameters, got '
                                 f'{type(p).__name__}.')
            if id(p) in seen:
                raise ValueError('A parameter appears more than once in groups.')
            seen.add(id(p))


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wraps ``optimizer`` so that gradients are reduced over ``process_set`` before each step.

    Returns an instance of a subclass of ``type(optimizer)`` with the same class name, built on
    ``optimizer.param_groups`` (so ``isinstance`` checks, ``state_dict`` and
    ``load_state_dict`` work as before). Horovod must be initialised. The allreduces start
    during ``loss.backward()``; ``step()`` waits for them. With one rank (and
    ``HOROVOD_ELASTIC`` unset) no hooks are installed and ``step()`` is the wrapped step.

    Args:
        optimizer: the ``torch.optim.Optimizer`` to wrap (its state is not carried over).
        named_parameters: ``(name, parameter)`` tuples naming every parameter of
            ``optimizer``, e.g. ``model.named_parameters()``; the names label the allreduces
            and must be the same on every rank. Default: positional names.
        compression: ``Compression.none`` (default), ``Compression.fp16`` or
            ``Compression.bf16`` (casts for the allreduce), or a compressor with state,
            ``hvd.PowerSGD(...)`` or ``hvd.TopK(...)``, which combines all the gradients of a
            step at once in ``synchronize()`` (``op`` Average or Sum; no
            ``gradient_predivide_factor``) and whose state is part of ``state_dict()``.
        backward_passes_per_step: number of backward passes accumulated locally before the
            gradients are allreduced (positive int, default 1).
        op: ``Average`` (default), ``Sum``, ``Min``, ``Max`` or ``Product``; or ``Adasum``:
            with more than one rank, each rank then steps locally during backward and the
            parameter changes are combined with Adasum in ``step()`` (groups, predivide and
            ``sparse_as_dense`` do not apply; ``synchronize()`` does nothing).
        gradient_predivide_factor: with ``Average``, gradients are divided by this factor
            before the sum and multiplied by ``factor / size`` after it (default 1.0).
        num_groups: deprecated spelling of an int ``groups``.
        groups: a positive int k (split the trainable parameters into k contiguous groups of
            near-equal length, in rank 0's order) or a list of lists of parameters; each group
            is allreduced with one grouped allreduce once all its gradients are ready.
            Parameters in no group are allreduced alone. Default: no groups.
        sparse_as_dense: convert sparse gradients to dense before the allreduce, and the
            averaged result back to a sparse gradient (of the same sparse_dim, holding the
            slices that are not all zero) before the wrapped optimizer's step, so that
            optimizers taking only sparse gradients (``torch.optim.SparseAdam``) work. Otherwise
            a sparse gradient is reduced by allgathering its indices and values
            (``sparse_allreduce_async``; ``op`` Average or Sum, not in a group).
        process_set: the ``ProcessSet`` to reduce over (default: all ranks).

    Returns:
        The distributed optimizer.

    Raises:
        ValueError: ``gradient_predivide_factor != 1.0`` with an op other than ``Average``; a
            stateful compressor with an op other than Average or Sum, or with a predivide factor;
            ``backward_passes_per_step`` not a positive int; bad ``groups`` (not a positive int
            or a list of lists of tensors, or a tensor listed twice); ``named_parameters``
            entries that are not tuples, duplicate names, or parameters left unnamed; Horovod
            is not initialised.
        NotImplementedError: ``op`` is ``Adasum`` with more than one rank and a process set
            other than the global one.
    """
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError('gradient_predivide_factor is only supported with op=Average, got '
                         f'op={op!r} and gradient_predivide_factor={gradient_predivide_factor}.')
    check_optimizer_options(compression, op, gradient_predivide_factor)
    if num_groups != 0:
        warnings.warn('Parameter `num_groups` has been replaced by `groups` and will be '
                      'removed.', DeprecationWarning, stacklevel=2)
        if groups is None:
            groups = num_groups
    _check_backward_passes(backward_passes_per_step)
    if groups is not None:
        _check_groups(groups)

    # size() first: it raises a clear ValueError when Horovod is not initialised.
    if op == Adasum and size() > 1:
        check_adasum_process_set(process_set, 'DistributedOptimizer')
        cls = type(optimizer.__class__.__name__,
                   (_DistributedAdasumOptimizer, optimizer.__class__), {'__module__': __name__})
        return cls(optimizer.param_groups, named_parameters, compression,
                   backward_passes_per_step, process_set, optimizer.defaults)
    cls = type(optimizer.__class__.__name__, (_DistributedOptimizer, optimizer.__class__),
               {'__module__': __name__})
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, groups, sparse_as_dense, process_set,
               optimizer.defaults)
