"""``SyncBatchNorm``: batch normalisation whose statistics span the ranks of a process set.

Training on ``n`` ranks with ``B_r`` examples on rank ``r`` gives the output, running statistics
and input gradient of ``torch.nn.BatchNorm*d`` applied to the concatenation of all the ranks'
batches. The weight and bias gradients stay local: each rank's is its own examples' share, and
their sum over ranks (which ``DistributedOptimizer`` forms) is the single-process gradient.

Algorithm (the one of ``torch.nn.SyncBatchNorm``): each rank computes the per-channel mean and
inverse standard deviation of its batch; the ranks allgather these with their element counts
and combine them into the global mean and variance (the parallel variance formula of Chan,
Golub and LeVeque, "Algorithms for computing the sample variance", 1983). In backward, the
per-channel sums ``sum(dy)`` and ``sum(dy * (x - mean))`` are allreduced, which is all that the
input gradient needs besides local data.

CUDA tensors use torch's fused kernels (``torch.batch_norm_stats``,
``torch.batch_norm_gather_stats_with_counts``, ``torch.batch_norm_backward_reduce``,
``torch.batch_norm_backward_elemt``); torch has no CPU kernels for them, so CPU tensors (and
empty CUDA batches) use the same formulas written with tensor ops. The collectives carry only per-channel vectors, which
travel through CPU tensors whatever the input's device.
"""

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from horovod.torch.mpi_ops import (
    Sum,
    allgather_async,
    allreduce_async,
    global_process_set,
    synchronize,
)


def _reduce_dims(x):
    return [0, *range(2, x.dim())]


def _per_channel(v, x):
    """Reshapes a ``[C]`` vector to broadcast against ``x`` of shape ``[N, C, ...]``."""
    return v.reshape(1, -1, *([1] * (x.dim() - 2)))


def _stats_dtype(x):
    # Like the CUDA kernels, reduced precision inputs accumulate their statistics in float32.
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def _plain_stats(x, eps):
    var, mean = torch.var_mean(x.to(_stats_dtype(x)), dim=_reduce_dims(x), correction=0)
    return mean, torch.rsqrt(var + eps)


def _plain_gather_stats(x, mean_all, invstd_all, running_mean, running_var, momentum, eps,
                      counts):
    counts = counts.to(mean_all.dtype).unsqueeze(1)
    var_all = invstd_all.pow(-2) - eps
    total = counts.sum()
    mean = (counts * mean_all).sum(0) / total
    var = (counts * (var_all + (mean_all - mean).pow(2))).sum(0) / total
    with torch.no_grad():
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
        if running_var is not None:
            unbiased = var * (total / (total - 1))
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
    return mean, torch.rsqrt(var + eps)


def _plain_backward_reduce(dy, x, mean, invstd, weight, input_g, weight_g, bias_g):
    dims = _reduce_dims(x)
    dy = dy.to(mean.dtype)
    sum_dy = dy.sum(dims)
    sum_dy_xmu = (dy * (x.to(mean.dtype) - _per_channel(mean, x))).sum(dims)
    grad_weight = sum_dy_xmu * invstd if weight_g else None
    grad_bias = sum_dy if bias_g else None
    return sum_dy, sum_dy_xmu, grad_weight, grad_bias


def _plain_backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, counts):
    total = counts.sum().to(mean.dtype)
    scale = invstd if weight is None else invstd * weight.to(mean.dtype)
    xmu = x.to(mean.dtype) - _per_channel(mean, x)
    grad = (dy.to(mean.dtype) - _per_channel(sum_dy / total, x)
            - xmu * _per_channel(invstd.pow(2) * sum_dy_xmu / total, x)) * _per_channel(scale, x)
    return grad.to(x.dtype)


def _kernels(x):
    """(stats, gather_stats, backward_reduce, backward_elemt) for ``x``: torch's fused kernels
    for a non-empty CUDA tensor, else the same formulas in tensor ops (any device)."""
    if x.is_cuda and x.numel() > 0:
        return (torch.batch_norm_stats, torch.batch_norm_gather_stats_with_counts,
                torch.batch_norm_backward_reduce, torch.batch_norm_backward_elemt)
    return _plain_stats, _plain_gather_stats, _plain_backward_reduce, _plain_backward_elemt


def _allgather(tensor, name, process_set):
    """Starts an allgather of a small per-rank vector through a CPU copy."""
    return allgather_async(tensor.detach().cpu().contiguous(), name, process_set)


class _SyncBatchNormFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, process_set):
        x = x.contiguous()
        stats, gather_stats, _, _ = _kernels(x)
        channels = x.shape[1]
        count = x.numel() // channels
        mean, invstd = stats(x, eps)
        handles = [_allgather(torch.tensor([count], dtype=mean.dtype), 'sync_batch_norm.count',
                              process_set),
                   _allgather(mean, 'sync_batch_norm.mean', process_set),
                   _allgather(invstd, 'sync_batch_norm.invstd', process_set)]
        counts, mean_all, invstd_all = (synchronize(h).to(x.device) for h in handles)
        if int(counts.sum()) <= 1:
            raise ValueError('SyncBatchNorm expects more than 1 value per channel when training, '
                             f'summed over the process set; this rank has input size '
                             f'{list(x.shape)}.')
        # Ranks with an empty batch report NaN statistics; they carry no weight, leave them out.
        present = counts.view(-1) > 0
        mean_all = mean_all.view(-1, channels)[present]
        invstd_all = invstd_all.view(-1, channels)[present]
        mean, invstd = gather_stats(x, mean_all, invstd_all, running_mean, running_var, momentum,
                                    eps, counts.view(-1)[present])
        y = (x.to(mean.dtype) - _per_channel(mean, x)) * _per_channel(invstd, x)
        if weight is not None:
            y = y * _per_channel(weight.to(mean.dtype), x)
        if bias is not None:
            y = y + _per_channel(bias.to(mean.dtype), x)
        ctx.save_for_backward(x, weight, mean, invstd, counts.to(torch.int32).view(-1))
        ctx.process_set = process_set
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        x, weight, mean, invstd, counts = ctx.saved_tensors
        _, _, backward_reduce, backward_elemt = _kernels(x)
        grad_output = grad_output.contiguous()
        needs_input, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        sum_dy, sum_dy_xmu, grad_weight, grad_bias = backward_reduce(
            grad_output, x, mean, invstd, weight, needs_input, needs_weight and weight is not None,
            needs_bias and weight is not None)
        grad_input = None
        if needs_input:
            handles = [allreduce_async(t.detach().cpu().contiguous(), name=name, op=Sum,
                                       process_set=ctx.process_set)
                       for t, name in ((sum_dy, 'sync_batch_norm.sum_dy'),
                                       (sum_dy_xmu, 'sync_batch_norm.sum_dy_xmu'))]
            sum_dy, sum_dy_xmu = (synchronize(h).to(x.device) for h in handles)
            grad_input = backward_elemt(grad_output, x, mean, invstd, weight, sum_dy,
                                        sum_dy_xmu, counts)
        if weight is None:
            grad_weight = grad_bias = None
        return grad_input, grad_weight, grad_bias, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalisation over the concatenated batches of every rank of ``process_set``.

    A drop-in replacement for ``torch.nn.BatchNorm1d``/``2d``/``3d`` in data-parallel training
    (or build one from an existing model with :meth:`convert_sync_batchnorm`). In training, and
    in evaluation without running statistics, each forward pass allgathers three per-channel
    vectors and each backward pass allreduces two; every rank of the set must therefore call
    forward and backward the same number of times, in the same order. In evaluation with
    running statistics, or when the set has one rank, it is plain batch normalisation with no
    communication. Works on CPU and CUDA tensors.

    Args:
        num_features: C, the number of channels (dimension 1 of the input).
        eps: added to the variance for numerical stability (default 1e-5).
        momentum: weight of the current batch in the running statistics (default 0.1); None for
            a cumulative average over ``num_batches_tracked`` batches.
        affine: learn a per-channel weight and bias (default True).
        track_running_stats: keep running mean and variance (default True).
        process_set: the ``ProcessSet`` whose ranks share statistics (default: all ranks).

    The input is ``[N, C]`` or ``[N, C, *]`` (float16, bfloat16, float32 or float64); the output
    has the same shape and dtype. ``N`` may differ between ranks, even be 0 on some.

    Raises:
        ValueError: (from ``forward``) the input has fewer than 2 dimensions; in training, the
            whole set's batch has only one value per channel.
        HorovodInternalError: (from ``forward``) the ranks disagree on C or dtype, or Horovod
            was shut down.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f'SyncBatchNorm expects an input of 2 or more dimensions [N, C, ...], '
                             f'got {input.dim()}D input.')

    def forward(self, input):
        """Normalises ``input`` (``[N, C]`` or ``[N, C, *]``) with the statistics of the whole
        process set's batch in training (and updates the running statistics), with the running
        statistics in evaluation. Raises ``ValueError`` and ``HorovodInternalError`` as the class
        says."""
        self._check_input_dim(input)
        # How much the current batch weighs in the running statistics (as torch's _BatchNorm).
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else factor

        use_batch_stats = self.training or not self.track_running_stats
        if not use_batch_stats or self.process_set.size() == 1:
            return F.batch_norm(input, self.running_mean if self.track_running_stats else None,
                                self.running_var if self.track_running_stats else None,
                                self.weight, self.bias, use_batch_stats, factor, self.eps)
        # Running statistics are only updated in training (as torch's _BatchNorm).
        update = self.training and self.track_running_stats
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias,
                                            self.running_mean if update else None,
                                            self.running_var if update else None,
                                            self.eps, factor, self.process_set)

    @classmethod
    def convert_sync_batchnorm(cls, module, process_set=global_process_set):
        """Returns ``module`` with every ``torch.nn.modules.batchnorm._BatchNorm`` in it
        replaced by a :class:`SyncBatchNorm` holding the same parameters, buffers and mode.

        ``module`` itself is returned (modified in place) unless it is a batch norm layer, in
        which case the replacement is returned.

        Args:
            module (torch.nn.Module): the model or layer to convert.
            process_set: the ``ProcessSet`` whose ranks share the statistics of every converted
                layer (default: all ranks).
        """
        converted = module
        if isinstance(module, _BatchNorm) and not isinstance(module, cls):
            converted = cls(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats, process_set)
            if module.affine:
                with torch.no_grad():
                    converted.weight = module.weight
                    converted.bias = module.bias
            converted.running_mean = module.running_mean
            converted.running_var = module.running_var
            converted.num_batches_tracked = module.num_batches_tracked
            converted.train(module.training)
        for child_name, child in module.named_children():
            converted.add_module(child_name, cls.convert_sync_batchnorm(child, process_set))
        return converted
