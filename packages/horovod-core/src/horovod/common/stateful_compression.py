"""Gradient compressors that keep state across steps and run their own collectives: PowerSGD
(low-rank) and top-k, both with error feedback, written once for every framework.

A stateful compressor replaces the allreduce of a set of gradients as a whole: ``reduce``
takes every gradient of a step at once, runs the collectives it needs (two fused allreduces for
PowerSGD, fused allgathers for top-k) and returns the combined gradients. It keeps per-parameter
state, keyed by the parameter's name: the error-feedback residuals (what was not sent, added to
the next step's gradient) and, for PowerSGD, the right factors reused as the next step's starting
point (warm start). ``state_dict``/``load_state_dict`` save and restore it; after a change of the
world size (an elastic reset) ``reset_residuals`` zeroes the residuals on every rank, since the
residuals of ranks that left are lost and the others would otherwise be applied unevenly.

The same classes serve every framework (``horovod.torch`` and ``horovod.tensorflow`` export
them): the algorithms touch tensors only through the :class:`TensorOps` of the gradients'
framework, which its binding registers when imported (``horovod.torch.stateful_compression``,
``horovod.tensorflow.stateful_compression``). Tensors support ``+``, ``-``, ``*``, ``/`` by a
number and ``@`` in every framework used.
"""

import math
import zlib

from horovod.common.api import Average, Sum, global_process_set, rank


class TensorOps:
    """What the compressors need of a framework, as static methods of its subclass (registered
    with :func:`register`); tensors are the framework's:

    - ``grouped_allreduce(tensors, op=, name=, process_set=)`` and
      ``grouped_allgather(tensors, name=, process_set=)``: the binding's collectives;
    - ``require_eager(what)``: raises where the compressor named ``what`` cannot run (TensorFlow:
      inside a graph); here it does nothing;
    - ``is_floating(tensor)``, ``dtype(tensor)``, ``shape(tensor)`` (a tuple of ints);
    - ``reshape(tensor, shape)`` (-1 once at most), ``cast(tensor, dtype)``,
      ``transpose(matrix)`` (2-D);
    - ``factor_dtype(dtype)``: the dtype PowerSGD's factors of a ``dtype`` gradient are computed
      in (float64 for float64, float32 for the others);
    - ``orthonormal(matrix)``: Q of the reduced QR decomposition of an n x r matrix, n >= r;
    - ``gaussian(rows, columns, seed, like)``: a standard normal matrix from the int ``seed``, the
      same in every process, in the dtype and on the device of the tensor ``like``;
    - ``top_k_abs(flat, k)``: the indices (integers, any order) of the ``k`` entries of largest
      magnitude of a 1-D tensor; ``take(flat, indices)``: ``flat[indices]``;
      ``zero_at(flat, indices)``: a copy of ``flat`` with those entries zero; ``int32(indices)``;
    - ``scatter_add(size, indices, values, dtype)``: a 1-D ``dtype`` tensor of ``size`` zeros with
      ``values`` added at ``indices`` (repeated indices add up);
    - ``contiguous(tensor)``, ``detach(tensor)`` (no autograd history), ``copy(tensor)`` (one that
      later in-place changes do not reach): here the tensor itself.
    """

    require_eager = staticmethod(lambda what: None)
    contiguous = detach = copy = staticmethod(lambda tensor: tensor)


# (tensor types, TensorOps) per registered framework.
_FRAMEWORKS = []


def register(tensor_types, ops):
    """Registers ``ops`` (a :class:`TensorOps` subclass) for tensors that are instances of
    ``tensor_types`` (a type or a tuple of types); a framework's binding calls it once."""
    _FRAMEWORKS.append((tensor_types, ops))


def ops_for(tensor):
    """The :class:`TensorOps` registered for ``tensor``'s framework.

    Raises:
        ValueError: no imported Horovod binding registered the tensor's type.
    """
    for types, ops in _FRAMEWORKS:
        if isinstance(tensor, types):
            return ops
    raise ValueError(f"a stateful compressor takes the tensors of a framework whose Horovod binding is imported "
                     f"(horovod.torch, horovod.tensorflow); got {type(tensor).__name__}")


def check_optimizer_options(compression, op, gradient_predivide_factor):
    """Refuses what a distributed optimizer or tape cannot combine with ``compression`` when it is
    a compressor with state: an ``op`` other than Average or Sum, or a predivide factor (the
    compressor reduces the gradients as they are). Does nothing for a cast.

    Raises:
        ValueError: naming the compressor, ``op`` and ``gradient_predivide_factor``.
    """
    if getattr(compression, "stateful", False) and (op not in (Average, Sum) or gradient_predivide_factor != 1.0):
        raise ValueError(f"a stateful compressor ({type(compression).__name__}) combines gradients with "
                         f"op=Average or Sum and no gradient_predivide_factor, got op={op!r} and "
                         f"gradient_predivide_factor={gradient_predivide_factor}.")


class StatefulCompressor:
    """Interface of a compressor with state. ``reduce(named_grads, op, process_set)`` returns
    the combined gradients; ``state_dict()``/``load_state_dict(state)`` save and restore the
    state; ``step`` counts the calls of ``reduce``. A compressor implements ``_combine`` (what
    ``reduce`` does once it checked its arguments) and the state methods."""

    stateful = True

    def __init__(self):
        self.step = 0

    def reduce(self, named_grads, op=Average, process_set=global_process_set):
        """Combines the gradients of every rank of ``process_set``, as the compressor's class
        describes, and counts the step.

        Args:
            named_grads: list of ``(name, gradient)``: a name unique to the parameter, the same
                on every rank, and its dense gradient tensor (any shape, floating point), of a
                framework whose Horovod binding is imported. Every rank of the set passes the same
                names, shapes and dtypes, in the same order.
            op: ``hvd.Average`` (default) or ``hvd.Sum``.
            process_set: the ranks that take part (default: all).

        Returns:
            The list of combined gradients (new tensors of the gradients' shapes and dtypes), in
            the order of ``named_grads``.

        Raises:
            ValueError: ``op`` is neither Average nor Sum, a gradient is not floating point or of
                no registered framework, or (TensorFlow) the call is inside a graph.
        """
        ops = self._start(named_grads, op)
        if not named_grads:
            return []
        return self._combine(ops, named_grads, op, process_set)

    def _combine(self, ops, named_grads, op, process_set):
        """What ``reduce`` does after its checks, for at least one gradient; ``ops`` is their
        framework's TensorOps."""
        raise NotImplementedError

    def state_dict(self):
        """The state as a dict of tensors and numbers (part of the optimizer's state_dict).

        Raises:
            NotImplementedError: here, in the interface; a compressor overrides it.
        """
        raise NotImplementedError

    def load_state_dict(self, state):
        """Restores ``state``, what :meth:`state_dict` returned.

        Raises:
            NotImplementedError: here, in the interface; a compressor overrides it.
        """
        raise NotImplementedError

    def reset_residuals(self):
        """Forgets the error-feedback residuals (every rank must call it).

        Raises:
            NotImplementedError: here, in the interface; a compressor overrides it.
        """
        raise NotImplementedError

    def sync(self, broadcast_object):
        """Gives every rank rank 0's state but the residuals, and empties the residuals: after an
        elastic reset the step and the factors are shared, while each rank's residuals are its
        own and those of ranks that left are lost. A collective: every rank calls it.

        Args:
            broadcast_object: the framework's ``broadcast_object(obj)``, returning rank 0's
                ``obj`` (picklable) on every rank.
        """
        shared = None
        if rank() == 0:
            shared = {k: v for k, v in self.state_dict().items() if k != "residuals"}
        self.load_state_dict(broadcast_object(shared))

    def _start(self, named_grads, op):
        """Checks the arguments of ``reduce``, counts the step and returns the gradients'
        :class:`TensorOps` (None for no gradients)."""
        if op not in (Average, Sum):
            raise ValueError(f"a stateful compressor combines gradients with hvd.Average or hvd.Sum, got op={op!r}")
        ops = ops_for(named_grads[0][1]) if named_grads else None
        for name, grad in named_grads:
            if not ops.is_floating(grad):
                raise ValueError(f"a stateful compressor needs floating-point gradients; {name} is {ops.dtype(grad)}")
        if ops is not None:
            ops.require_eager(type(self).__name__)
        self.step += 1
        return ops


class Cast(StatefulCompressor):
    """A cast (``hvd.Compression.none``, ``.fp16`` or ``.bf16``) in the interface of the
    compressors with state, for code that treats every compressor alike: ``reduce`` casts every
    gradient, allreduces them as one group and casts the results back. It keeps no state but the
    step count.

    Args:
        cast: an object with ``compress(tensor) -> (tensor, ctx)`` and
            ``decompress(tensor, ctx) -> tensor``, such as ``hvd.Compression.bf16``.

    Raises:
        ValueError: ``cast`` lacks ``compress`` or ``decompress``.
    """

    def __init__(self, cast):
        super().__init__()
        if not (callable(getattr(cast, "compress", None)) and callable(getattr(cast, "decompress", None))):
            raise ValueError(f"Cast needs a compressor with compress() and decompress(), such as "
                             f"hvd.Compression.bf16; got {cast!r}")
        self.cast = cast

    def _combine(self, ops, named_grads, op, process_set):
        compressed = [self.cast.compress(ops.contiguous(grad)) for _, grad in named_grads]
        reduced = ops.grouped_allreduce([tensor for tensor, _ in compressed], op=op, name=f"cast.{self.step}",
                                        process_set=process_set)
        return [self.cast.decompress(tensor, ctx) for tensor, (_, ctx) in zip(reduced, compressed, strict=True)]

    def state_dict(self):
        """``{"step": int}``."""
        return {"step": self.step}

    def load_state_dict(self, state):
        """Restores the step count from ``state``, what :meth:`state_dict` returned."""
        self.step = int(state["step"])

    def reset_residuals(self):
        """Nothing to forget: a cast keeps no residuals."""


class _ErrorFeedback(StatefulCompressor):
    """Residual bookkeeping shared by PowerSGD and top-k."""

    def __init__(self, error_feedback):
        super().__init__()
        self.error_feedback = error_feedback
        self.residuals = {}

    def _with_residual(self, ops, name, grad):
        if not self.error_feedback:
            return grad
        residual = self.residuals.get(name)
        if residual is None or ops.shape(residual) != ops.shape(grad):
            return grad
        return grad + ops.cast(residual, ops.dtype(grad))

    def _keep_residual(self, ops, name, residual):
        # ``residual`` is a new tensor the caller does not keep: no copy.
        if self.error_feedback:
            self.residuals[name] = ops.detach(residual)

    def reset_residuals(self):
        self.residuals = {}

    def _state(self):
        return {"step": self.step, "residuals": _copies(self.residuals)}

    def _load(self, state):
        self.step = int(state["step"])
        self.residuals = _copies(state.get("residuals", {}))


def _copies(tensors):
    """{name: copy of the tensor} for a dict of tensors."""
    return {k: ops_for(v).copy(v) for k, v in tensors.items()}


class PowerSGD(_ErrorFeedback):
    """Low-rank gradient compression by one step of power iteration per training step (Vogels,
    Karimireddy and Jaggi, 2019, "PowerSGD: Practical Low-Rank Gradient Compression for
    Distributed Optimization", Algorithm 1, with error feedback and warm start).

    A gradient of shape ``[n, ...]`` is seen as a matrix ``M`` of ``n`` rows and ``m`` columns
    (the other dimensions flattened). With ``Q`` an ``m x r`` matrix: ``P = M Q`` is averaged over
    the ranks and orthonormalised (QR), then ``Q = M^T P`` is averaged, and ``P Q^T`` is the
    result: ``(n + m) r`` values sent instead of ``n m``. With error feedback, what the rank's own
    share lost, ``M - P P^T M``, is kept and added to the next step's gradient; with warm start,
    the averaged ``Q`` starts the next step.
    When the combined gradient has rank <= ``r``, ``P Q^T`` is that gradient (up to rounding);
    with error feedback keep ``r`` above that rank: round-off left in the residuals needs a spare
    direction to be sent, or it accumulates (measured: with rank-2 gradients and r = 2 the result
    drifts by 1e-5 within 25 steps; with r = 3 it stays within 1e-10 over 100).

    Sent uncompressed, in one fused allreduce: vectors (biases) and scalars, matrices for which
    ``(n + m) r * min_compression_rate`` is not below ``n m``, and every gradient during the
    first ``start_iter`` steps.

    Args:
        rank: r, the rank of the approximation (int >= 1).
        start_iter: steps sent uncompressed before compression starts (int >= 0).
        min_compression_rate: how many times fewer values a matrix must send to be compressed
            (float >= 1).
        warm_start: reuse each matrix's ``Q`` from the previous step (else a new random one).
        error_feedback: add what was not sent to the next step's gradient.
        seed: seed of the initial ``Q`` matrices (the same on every rank).

    Raises:
        ValueError: an argument is out of its range.
    """

    def __init__(self, rank=1, start_iter=10, min_compression_rate=2.0, warm_start=True, error_feedback=True,
                 seed=0):
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
            raise ValueError(f"PowerSGD's rank must be an int >= 1, got {rank!r}")
        if not isinstance(start_iter, int) or isinstance(start_iter, bool) or start_iter < 0:
            raise ValueError(f"PowerSGD's start_iter must be an int >= 0, got {start_iter!r}")
        if not min_compression_rate >= 1:
            raise ValueError(f"PowerSGD's min_compression_rate must be >= 1, got {min_compression_rate!r}")
        super().__init__(error_feedback)
        self.rank = rank
        self.start_iter = start_iter
        self.min_compression_rate = float(min_compression_rate)
        self.warm_start = warm_start
        self.seed = seed
        self.q = {}

    def compressed(self, shape):
        """Whether a gradient of ``shape`` is sent as low-rank factors (once past start_iter)."""
        if len(shape) < 2:
            return False
        n, m = shape[0], math.prod(shape[1:])
        return (n + m) * self.rank * self.min_compression_rate < n * m

    def _initial_q(self, ops, name, like):
        # crc32, not hash(): Python randomises str hashes per process, and every rank needs the
        # same matrix.
        seed = zlib.crc32(f"{self.seed}:{name}:{self.step}".encode())
        return ops.gaussian(ops.shape(like)[1], self.rank, seed, like)

    def _combine(self, ops, named_grads, op, process_set):
        results = [None] * len(named_grads)
        plain, low = [], []
        for i, (_, grad) in enumerate(named_grads):
            if self.step > self.start_iter and self.compressed(ops.shape(grad)):
                low.append(i)
            else:
                plain.append(i)
        if plain:
            out = ops.grouped_allreduce([ops.contiguous(named_grads[i][1]) for i in plain], op=op,
                                        name=f"powersgd.plain.{self.step}", process_set=process_set)
            for i, tensor in zip(plain, out, strict=True):
                results[i] = tensor
        if not low:
            return results
        # The factors are computed in float32 at least (float64 stays float64).
        matrices, qs = [], []
        for i in low:
            name, grad = named_grads[i]
            dtype = ops.factor_dtype(ops.dtype(grad))
            matrix = ops.reshape(ops.cast(self._with_residual(ops, name, grad), dtype), (ops.shape(grad)[0], -1))
            q = self.q.get(name) if self.warm_start else None
            if q is None or ops.shape(q) != (ops.shape(matrix)[1], self.rank) or ops.dtype(q) != dtype:
                q = self._initial_q(ops, name, matrix)
            else:
                # The same span, better conditioned: the last step's Q can have nearly parallel
                # columns, and P = M Q would lose precision in its QR.
                q = ops.orthonormal(q)
            matrices.append(matrix)
            qs.append(q)
        ps = ops.grouped_allreduce([m @ q for m, q in zip(matrices, qs, strict=True)], op=Average,
                                   name=f"powersgd.p.{self.step}", process_set=process_set)
        ps = [ops.orthonormal(p) for p in ps]
        local_qs = [ops.transpose(m) @ p for m, p in zip(matrices, ps, strict=True)]
        qs = ops.grouped_allreduce(local_qs, op=Average, name=f"powersgd.q.{self.step}", process_set=process_set)
        scale = process_set.size() if op == Sum else 1
        for i, matrix, p, local_q, q in zip(low, matrices, ps, local_qs, qs, strict=True):
            name, grad = named_grads[i]
            shape = ops.shape(grad)
            # The error of this rank's own share, P (P^T M), as in the paper: zero when M's columns
            # lie in the span of P. Kept in the gradient's shape, as _with_residual adds it.
            self._keep_residual(ops, name, ops.reshape(matrix - p @ ops.transpose(local_q), shape))
            self.q[name] = q
            results[i] = ops.cast(ops.reshape((p @ ops.transpose(q)) * scale, shape), ops.dtype(grad))
        return results

    def state_dict(self):
        """``{"step": int, "residuals": {name: tensor}, "q": {name: tensor}}``: copies of the
        step count, this rank's residuals and the factors ``Q`` (``m x r``)."""
        return {**self._state(), "q": _copies(self.q)}

    def load_state_dict(self, state):
        """Restores ``state``, a dict from :meth:`state_dict` (missing residuals or factors
        start empty)."""
        self._load(state)
        self.q = _copies(state.get("q", {}))


class TopK(_ErrorFeedback):
    """Sends only the ``ratio`` largest-magnitude entries of each gradient, as (indices, values)
    by allgather; every rank adds all ranks' entries into a dense gradient (Aji and Heafield,
    2017, "Sparse Communication for Distributed Gradient Descent"; error feedback as in Stich,
    Cordonnier and Jaggi, 2018, "Sparsified SGD with Memory"). With error feedback, the entries
    not sent are kept and added to the next step's gradient.

    Each rank sends ``k = ceil(ratio * numel)`` (at least 1) int32 indices and values of the
    gradient's dtype per gradient, in one fused allgather for the indices and one for the values.

    Args:
        ratio: the share of entries sent (0 < ratio <= 1).
        error_feedback: add what was not sent to the next step's gradient.

    Raises:
        ValueError: ``ratio`` is not in (0, 1].
    """

    def __init__(self, ratio=0.01, error_feedback=True):
        if not 0 < ratio <= 1:
            raise ValueError(f"TopK's ratio must be in (0, 1], got {ratio!r}")
        super().__init__(error_feedback)
        self.ratio = ratio

    def _combine(self, ops, named_grads, op, process_set):
        indices, values = [], []
        for name, grad in named_grads:
            shape = ops.shape(grad)
            flat = ops.reshape(self._with_residual(ops, name, grad), (-1,))
            k = max(1, math.ceil(self.ratio * math.prod(shape)))
            chosen = ops.top_k_abs(flat, k)
            if self.error_feedback:
                self._keep_residual(ops, name, ops.reshape(ops.zero_at(flat, chosen), shape))
            indices.append(ops.int32(chosen))
            values.append(ops.contiguous(ops.take(flat, chosen)))
        all_indices = ops.grouped_allgather(indices, name=f"topk.indices.{self.step}", process_set=process_set)
        all_values = ops.grouped_allgather(values, name=f"topk.values.{self.step}", process_set=process_set)
        results = []
        for (_, grad), idx, val in zip(named_grads, all_indices, all_values, strict=True):
            shape = ops.shape(grad)
            dense = ops.scatter_add(math.prod(shape), idx, val, ops.dtype(grad))
            if op == Average:
                dense = dense / process_set.size()
            results.append(ops.reshape(dense, shape))
        return results

    def state_dict(self):
        """``{"step": int, "residuals": {name: tensor}}``: copies of the step count and this
        rank's residuals."""
        return self._state()

    def load_state_dict(self, state):
        """Restores ``state``, a dict from :meth:`state_dict` (missing residuals start empty)."""
        self._load(state)
