"""ZeroRedundancyOptimizer: optimizer state sharded across the ranks of a process set (ZeRO stage 1).

Algorithm (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", SC 2020, stage 1 "optimizer state partitioning"): every parameter has one owner rank;
only the owner keeps that parameter's optimizer state and runs the optimizer on it. A step is

1. reduce-scatter: every rank lays its gradients out in flat buffers of ``bucket_bytes`` (one
   dtype each; a large parameter spans several), ordered by owner and padded so that each
   owner's part has the same length; one reducescatter with ``Average`` per buffer leaves each
   rank the averaged gradients of the parameters it owns;
2. the wrapped optimizer (built over the owned parameters only) steps them;
3. gather: the owners' updated parameters, laid out in the same buffers, are gathered on every
   rank (each owner broadcasts its part in place, which receives what an allgather would without
   a new buffer per exchange) and copied back into the parameters, so that every rank ends the
   step with the same model.

Communication volume equals one allreduce (a reduce-scatter plus an allgather's worth of
broadcasts); the memory for optimizer state is about 1/N of the unsharded optimizer's on each of
the N ranks.
"""

import io

import torch

from horovod.common.process_sets import global_process_set
from horovod.torch.mpi_ops import (
    Average,
    allgather_async,
    alltoall_async,
    broadcast_async_,
    reducescatter_async,
    synchronize,
)


def partition_parameters(numels, size):
    """Assigns parameters to owner ranks by a greedy size balance.

    Parameters are taken one parameter group after the other; within a group, in order of
    decreasing element count (ties: the earlier parameter first). Each goes, whole, to the rank
    that owns the fewest elements so far (ties: the lowest rank). Taking groups in order means
    that adding a group (``add_param_group``) leaves the owners of the earlier parameters
    unchanged. A parameter larger than 1/size of the model bounds the balance: the rank that owns
    it holds at least its state.

    Args:
        numels: list of parameter groups, each a list of element counts (ints >= 0).
        size (int): number of ranks, >= 1.

    Returns:
        list of lists of int: the owner rank (0..size-1) of every parameter, shaped like ``numels``.

    Raises:
        ValueError: ``size`` is not a positive int.
    """
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"partition_parameters expects a positive number of ranks, got {size!r}")
    loads = [0] * size
    owners = []
    for group in numels:
        group_owners = [0] * len(group)
        for i in sorted(range(len(group)), key=lambda i: (-group[i], i)):
            rank = min(range(size), key=lambda r: (loads[r], r))
            group_owners[i] = rank
            loads[rank] += group[i]
        owners.append(group_owners)
    return owners


def _state_to_bytes(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def _state_from_bytes(data):
    return torch.load(io.BytesIO(data.numpy().tobytes()), map_location="cpu", weights_only=True)


class ZeroRedundancyOptimizer(torch.optim.Optimizer):
    """Shards the state of ``optimizer_class`` across the ranks of ``process_set`` (ZeRO stage 1).

    Use it instead of ``hvd.DistributedOptimizer(optimizer_class(params, **defaults))``: call
    ``backward()`` as usual on each rank's data, then ``step()``, which averages the gradients
    over the set, steps each rank's shard and gathers the updated parameters back, so every rank
    ends each step with the same parameters as ``DistributedOptimizer`` would give. Each rank
    keeps the state (for Adam: the two moments) of only the parameters it owns, about 1/N of the
    total for a set of N ranks. Algorithm: Rajbhandari et al., 2020 (ZeRO), stage 1; see the
    module docstring. Owners are chosen by :func:`partition_parameters` (greedy size balance,
    whole parameters).

    After ``step()`` an owned parameter's ``.grad`` holds the gradient averaged over the set; the
    other parameters keep this rank's own gradient. A parameter with ``requires_grad`` whose
    gradient is None takes part with zeros (as in ``DistributedOptimizer``); parameters without
    ``requires_grad`` are left alone. Learning-rate schedulers work on ``param_groups`` as usual.

    Args:
        params: an iterable of tensors or of dicts (parameter groups), as for any
            ``torch.optim.Optimizer``; every member of the set must pass parameters of the same
            shapes and dtypes in the same order (float16, float32 or float64).
        optimizer_class: a ``torch.optim.Optimizer`` subclass (e.g. ``torch.optim.AdamW``),
            built on each rank over the parameters it owns.
        process_set (ProcessSet): the ranks that train together (default: all ranks). This rank
            must be a member.
        **defaults: keyword arguments for ``optimizer_class`` (``lr``, ``betas``, ...), the
            defaults of every parameter group.

    Raises:
        ValueError: ``optimizer_class`` is not an Optimizer subclass, no parameters, a parameter
            that is not a floating-point leaf tensor of a supported dtype, or this rank is not in
            ``process_set``.
    """

    #: Bytes of gradients (of parameters) in one reducescatter (one round of broadcasts): the
    #: step's staging buffer is this large. Set it on the class or on an instance.
    bucket_bytes = 16 * 2**20

    def __init__(self, params, optimizer_class, process_set=global_process_set, **defaults):
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise ValueError("ZeroRedundancyOptimizer expects optimizer_class to be a torch.optim.Optimizer "
                             f"subclass (e.g. torch.optim.AdamW), got {optimizer_class!r}")
        if process_set.ranks and not process_set.included():
            raise ValueError(f"ZeroRedundancyOptimizer: this rank is not a member of {process_set}")
        self.optimizer_class = optimizer_class
        self.process_set = process_set
        self._local = None
        self._consolidated = None
        self._staging_buffers = {}
        self._building = True
        super().__init__(params, defaults)
        self._building = False
        self._build_local()

    # The partition and the local optimizer.

    def _set_size_and_rank(self):
        return self.process_set.size(), self.process_set.rank()

    def add_param_group(self, param_group):
        """Adds a parameter group (a dict with ``params`` and options) on every rank; its
        parameters are given owners after those of the existing groups, whose state stays where
        it is.

        Args:
            param_group (dict): ``params`` (an iterable of tensors) and the optimizer's options
                for them, as ``torch.optim.Optimizer.add_param_group`` takes it.

        Raises:
            ValueError: as for ``torch.optim.Optimizer.add_param_group`` (a parameter in two
                groups), or a parameter of an unsupported dtype.
        """
        super().add_param_group(param_group)
        for p in self.param_groups[-1]["params"]:
            if p.dtype not in (torch.float16, torch.float32, torch.float64):
                raise ValueError("ZeroRedundancyOptimizer expects float16, float32 or float64 parameters, "
                                 f"got one of dtype {p.dtype}")
        if not self._building:
            self._extend_local()

    def _owners(self):
        size, _ = self._set_size_and_rank()
        numels = [[p.numel() if p.requires_grad else 0 for p in g["params"]] for g in self.param_groups]
        return partition_parameters(numels, size)

    def _options(self, group):
        return {k: v for k, v in group.items() if k != "params"}

    def _local_groups(self, owners, rank):
        return [dict(self._options(g), params=[p for p, o in zip(g["params"], owner, strict=True)
                                               if o == rank and p.requires_grad])
                for g, owner in zip(self.param_groups, owners, strict=True)]

    def _build_local(self):
        """(Re)builds the wrapped optimizer over the parameters this rank owns, at the current size
        of the process set; its state starts empty. A group this rank owns nothing of stays, empty,
        so that group indices match ``param_groups``."""
        size, rank = self._set_size_and_rank()
        self._size = size
        self._owner = self._owners()
        self._local = self.optimizer_class(self._local_groups(self._owner, rank), **self.defaults)
        for group in self.param_groups:
            for key, value in self._local.defaults.items():
                group.setdefault(key, value)
        # The optimizer's own state is the local one: ``opt.state`` shows what this rank holds.
        self.state = self._local.state
        self._consolidated = None

    def _extend_local(self):
        _, rank = self._set_size_and_rank()
        self._owner = self._owners()
        self._local.add_param_group(self._local_groups(self._owner, rank)[-1])
        for key, value in self._local.defaults.items():
            self.param_groups[-1].setdefault(key, value)

    def _sync_options(self):
        # Schedulers and users change options on self.param_groups: pass them on.
        for group, local in zip(self.param_groups, self._local.param_groups, strict=True):
            for key, value in group.items():
                if key != "params":
                    local[key] = value

    # The step.

    def _buckets(self):
        """The exchanges of a step, each ``(dtype, device, parts, length)``: ``parts[r]`` lists the
        ``(parameter, start, stop)`` element ranges of the parameters rank ``r`` owns that this
        exchange carries, and ``length`` is the padded length of one part (elements).

        Per dtype and device, every owner's parameters form one stream of elements, in order;
        exchange ``k`` carries elements ``[k * length, (k + 1) * length)`` of every owner's stream
        (a parameter may span exchanges), with ``length = bucket_bytes / size / element size``.
        So every exchange moves ``bucket_bytes`` and a step's staging buffers stay that small,
        whatever the size of the parameters; only the owners' last exchanges are padded."""
        streams = {}
        for group, owners in zip(self.param_groups, self._owner, strict=True):
            for p, owner in zip(group["params"], owners, strict=True):
                if p.requires_grad and p.numel() > 0:
                    streams.setdefault((p.dtype, p.device), [[] for _ in range(self._size)])[owner].append(p)
        buckets = []
        for (dtype, device), lists in streams.items():
            element_size = torch.empty((), dtype=dtype).element_size()
            length = max(1, self.bucket_bytes // (self._size * element_size))
            totals = [sum(p.numel() for p in ps) for ps in lists]
            longest = max(totals)
            # Known while the stream is at most one exchange long: the padding to trim.
            length = min(length, longest)
            cursors = [[0, 0] for _ in lists]  # per owner: index of the parameter, elements of it done
            for _ in range(-(-longest // length)):
                parts = []
                for r, ps in enumerate(lists):
                    part, room = [], length
                    index, done = cursors[r]
                    while room and index < len(ps):
                        take = min(room, ps[index].numel() - done)
                        part.append((ps[index], done, done + take))
                        room -= take
                        done += take
                        if done == ps[index].numel():
                            index, done = index + 1, 0
                    cursors[r] = [index, done]
                    parts.append(part)
                buckets.append((dtype, device, parts, length))
        return buckets

    def _staging(self, dtype, device, elements):
        """A reused flat buffer of at least ``elements`` elements (one per dtype and device)."""
        buffer = self._staging_buffers.get((dtype, device))
        if buffer is None or buffer.numel() < elements:
            buffer = torch.empty(elements, dtype=dtype, device=device)
            self._staging_buffers[(dtype, device)] = buffer
        return buffer[:elements]

    @staticmethod
    def _pack(flat, parts, length, values):
        """Writes each part's ranges of ``values(p)`` into ``flat`` (part ``i`` at ``i * length``),
        zeros in the padding."""
        for i, part in enumerate(parts):
            offset = i * length
            for p, start, stop in part:
                value = values(p)
                target = flat[offset:offset + stop - start]
                if value is None:
                    target.zero_()
                else:
                    target.copy_(value.reshape(-1)[start:stop])
                offset += stop - start
            flat[offset:(i + 1) * length].zero_()

    @staticmethod
    def _unpack(flat, part, into):
        """Copies ``flat``'s elements, in order, into the ranges of ``into(p)`` that ``part`` lists."""
        offset = 0
        for p, start, stop in part:
            into(p).view(-1)[start:stop].copy_(flat[offset:offset + stop - start])
            offset += stop - start

    def _check_size(self):
        size, _ = self._set_size_and_rank()
        if size != self._size:
            raise RuntimeError(f"ZeroRedundancyOptimizer: the process set now has {size} ranks, the partition "
                               f"was made for {self._size}; call load_state_dict (or use hvd.elastic."
                               "TorchState, which does) to reshard")

    @torch.no_grad()
    def step(self, closure=None):
        """Averages the gradients over the set, steps this rank's shard and gathers the updated
        parameters on every rank. Collective: every member must call it.

        Args:
            closure: optional callable that re-evaluates the model and returns the loss (run
                with gradients enabled, before the collectives).

        Returns:
            the closure's loss, or None.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_size()
        self._sync_options()
        _, rank = self._set_size_and_rank()
        if self._size == 1:
            self._local.step()
            self._consolidated = None
            return loss
        buckets = self._buckets()
        # Owned parameters need a gradient to receive the average (zeros where backward gave none).
        for _, _, parts, _ in buckets:
            for p, _, _ in parts[rank]:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
        for i, (dtype, device, parts, length) in enumerate(buckets):
            flat = self._staging(dtype, device, self._size * length)
            self._pack(flat, parts, length, lambda p: p.grad)
            mine = synchronize(reducescatter_async(flat, name=f"ZeroRedundancyOptimizer.grads.{i}", op=Average,
                                                   process_set=self.process_set))
            self._unpack(mine, parts[rank], lambda p: p.grad)
            # Freed before the next exchange's output is allocated: with two alive at a time,
            # glibc's heaps fragmented and the resident memory grew by ~50 MB a step (Gloo, 128 MiB
            # model, benchmarks/zero_memory_bench.py).
            del mine
        self._local.step()
        self._consolidated = None
        # Gather the updated parameters: each owner broadcasts its part, in place, into a slot of a
        # reused buffer. An allgather would move the same bytes but return a buffer the engine
        # allocates anew for every exchange, which raised the peak resident memory by several
        # exchanges' worth (benchmarks/zero_memory_bench.py).
        ranks = self.process_set.ranks or list(range(self._size))
        for i, (dtype, device, parts, length) in enumerate(buckets):
            flat = self._staging(dtype, device, self._size * length)
            self._pack(flat[rank * length:(rank + 1) * length], [parts[rank]], length, lambda p: p)
            handles = [broadcast_async_(flat[r * length:(r + 1) * length], root_rank=ranks[r],
                                        name=f"ZeroRedundancyOptimizer.params.{i}.{r}", process_set=self.process_set)
                       for r in range(self._size)]
            for handle in handles:
                synchronize(handle)
            for owner, part in enumerate(parts):
                if owner != rank:
                    self._unpack(flat[owner * length:(owner + 1) * length], part, lambda p: p)
        return loss

    # State: per-rank shards, consolidated, resharded.

    def _index(self):
        """param -> global index (the order of ``state_dict``'s ``params`` lists)."""
        return {p: i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}

    def local_state_dict(self):
        """The state this rank holds: ``{global parameter index: {name: value}}`` (tensors are the
        live state, not copies)."""
        index = self._index()
        return {index[p]: s for p, s in self._local.state.items()}

    def _full_param_groups(self):
        index = self._index()
        return [dict(self._options(g), params=[index[p] for p in g["params"]]) for g in self.param_groups]

    def _gathered_state_dict(self):
        """The whole state on every member of the set (collective; CPU tensors): what an elastic
        snapshot keeps, since after a reset the shards of departed ranks exist nowhere else."""
        self._check_size()
        data = _state_to_bytes(self.local_state_dict())
        sizes = synchronize(allgather_async(torch.tensor([data.numel()], dtype=torch.int64),
                                            name="ZeroRedundancyOptimizer.gather_sizes", process_set=self.process_set))
        gathered = synchronize(allgather_async(data, name="ZeroRedundancyOptimizer.gather",
                                               process_set=self.process_set))
        state = {}
        offset = 0
        for n in sizes.tolist():
            state.update(_state_from_bytes(gathered[offset:offset + n]))
            offset += n
        return {"state": dict(sorted(state.items())), "param_groups": self._full_param_groups()}

    def consolidate_state_dict(self, to=0):
        """Gathers every rank's shard of the state on global rank ``to``, for :meth:`state_dict`.
        Collective: every member of the set must call it. Only rank ``to`` receives the shards
        (an alltoall whose only non-empty block goes to it), as CPU tensors.

        Args:
            to (int): the global rank that receives the state; a member of the set.

        Raises:
            ValueError: ``to`` is not a member of the process set.
        """
        ranks = self.process_set.ranks or list(range(self._size))
        if to not in ranks:
            raise ValueError(f"consolidate_state_dict expects `to` to be a global rank in the process set {ranks}, "
                             f"got {to!r}")
        self._check_size()
        data = _state_to_bytes(self.local_state_dict())
        splits = [0] * self._size
        splits[ranks.index(to)] = data.numel()
        received, received_splits = synchronize(alltoall_async(data, splits=splits,
                                                               name="ZeroRedundancyOptimizer.consolidate",
                                                               process_set=self.process_set))
        if ranks.index(to) != self.process_set.rank():
            self._consolidated = None
            return
        state = {}
        offset = 0
        for n in received_splits.tolist():
            state.update(_state_from_bytes(received[offset:offset + n]))
            offset += n
        self._consolidated = {"state": dict(sorted(state.items())), "param_groups": self._full_param_groups()}

    def state_dict(self):
        """The whole optimizer's state, in ``torch.optim.Optimizer.state_dict`` format
        (``{'state': {index: {...}}, 'param_groups': [...]}``, indices over all parameters), so it
        loads into this class at any set size and also into a plain ``optimizer_class``.

        Returns the result of the last :meth:`consolidate_state_dict` on the rank it was sent to;
        with a set of one rank, the state at once.

        Raises:
            RuntimeError: this rank holds no consolidated state (call ``consolidate_state_dict(to=
                this rank)`` on every member first, after the last ``step``).
        """
        if self._size == 1 and self._consolidated is None:
            return {"state": {i: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
                              for i, s in sorted(self.local_state_dict().items())},
                    "param_groups": self._full_param_groups()}
        if self._consolidated is None:
            raise RuntimeError("ZeroRedundancyOptimizer.state_dict: this rank holds no consolidated state; call "
                               "consolidate_state_dict(to=<this rank>) on every rank of the set first (after the "
                               "last step)")
        return self._consolidated

    def load_state_dict(self, state_dict):
        """Loads a whole state (from :meth:`state_dict`, or from a plain optimizer of the same class
        over the same parameters), resharding it for the current size of the process set: each
        rank keeps the state of the parameters it now owns. Not a collective; every member must
        call it with the same state.

        Raises:
            ValueError: the number of groups, or of parameters in a group, differs from this
                optimizer's.
        """
        groups = state_dict.get("param_groups") if isinstance(state_dict, dict) else None
        if groups is None or "state" not in state_dict:
            raise ValueError("ZeroRedundancyOptimizer.load_state_dict expects a dict with 'state' and 'param_groups'")
        if len(groups) != len(self.param_groups) or any(
                len(saved["params"]) != len(g["params"]) for saved, g in zip(groups, self.param_groups, strict=True)):
            raise ValueError("ZeroRedundancyOptimizer.load_state_dict: the saved parameter groups have sizes "
                             f"{[len(g['params']) for g in groups]}, this optimizer's have "
                             f"{[len(g['params']) for g in self.param_groups]}")
        for saved, group in zip(groups, self.param_groups, strict=True):
            group.update({k: v for k, v in saved.items() if k != "params"})
        self._build_local()
        # Saved indices -> this optimizer's parameters (same group layout), then the wrapped
        # optimizer's own indices over the owned parameters.
        param_of = {}
        for saved, group in zip(groups, self.param_groups, strict=True):
            param_of.update(zip(saved["params"], group["params"], strict=True))
        local_index = {p: i for i, p in enumerate(p for g in self._local.param_groups for p in g["params"])}
        local_state = {local_index[param_of[i]]: s for i, s in state_dict["state"].items()
                       if param_of[i] in local_index}
        self._local.load_state_dict({
            "state": local_state,
            "param_groups": [dict(self._options(g), params=[local_index[p] for p in g["params"]])
                             for g in self._local.param_groups],
        })
        self.state = self._local.state
