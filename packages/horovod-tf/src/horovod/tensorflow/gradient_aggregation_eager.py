"""The eager form of local gradient aggregation. The graph-safe ``LocalGradientAggregationHelper``
serves both modes here; this class keeps upstream's name and signature."""

from horovod.tensorflow.gradient_aggregation import LocalGradientAggregationHelper
from horovod.tensorflow.mpi_ops import global_process_set


class LocalGradientAggregationHelperEager(LocalGradientAggregationHelper):
    """``LocalGradientAggregationHelper`` for Keras optimizers, with upstream's eager signature;
    see that class for the arguments and behaviour."""

    def __init__(self, backward_passes_per_step, allreduce_func, sparse_as_dense, average_aggregated_gradients,
                 process_set=global_process_set, scale_local_gradients=True):
        super().__init__(backward_passes_per_step, allreduce_func, sparse_as_dense, average_aggregated_gradients,
                         optimizer_type=LocalGradientAggregationHelper._OPTIMIZER_TYPE_KERAS,
                         process_set=process_set, scale_local_gradients=scale_local_gradients)
