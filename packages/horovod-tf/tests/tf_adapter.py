"""Adapters that run the project's shared collective suite (horovod_testing.collectives) through
horovod.tensorflow: eagerly, and inside tf.function (every call traced into a graph, so the
two-node start/wait bridge is what runs)."""

import numpy as np
import tensorflow as tf


class EagerAdapter:
    """The shared checks through horovod.tensorflow's public functions, eagerly."""

    allreduce_dtypes = ['uint8', 'int8', 'int32', 'int64', 'float16', 'float32', 'float64']
    gather_dtypes = allreduce_dtypes + ['uint16', 'int16', 'bool']
    alltoall_dtypes = gather_dtypes
    reducescatter_dtypes = ['int32', 'int64', 'float16', 'float32', 'float64']

    def __init__(self):
        import horovod.tensorflow as hvd
        self.hvd = hvd

    def init(self, process_sets=None):
        self.hvd.init(process_sets=process_sets)

    def shutdown(self):
        self.hvd.shutdown()

    def add_process_set(self, ranks):
        return self.hvd.add_process_set(ranks)

    def remove_process_set(self, process_set):
        return self.hvd.remove_process_set(process_set)

    def rank(self):
        return self.hvd.rank()

    def size(self):
        return self.hvd.size()

    def tensor(self, array, dtype):
        return tf.constant(np.array(array, dtype=dtype))

    def to_numpy(self, tensor):
        return np.asarray(tensor.numpy())

    def _set(self, process_set):
        return self.hvd.global_process_set if process_set is None else process_set

    def _call(self, fn, *args):
        return fn(*args)

    def allreduce(self, tensor, op, prescale, postscale, name, inplace, process_set=None):
        # TF tensors are immutable: there is no in-place allreduce; both forms return a new tensor.
        return self._call(lambda x: self.hvd.allreduce(x, name=name, op=op, prescale_factor=prescale,
                                                       postscale_factor=postscale,
                                                       process_set=self._set(process_set)), tensor)

    def grouped_allreduce(self, tensors, op, name, inplace, process_set=None):
        return self._call(lambda *xs: self.hvd.grouped_allreduce(list(xs), name=name, op=op,
                                                                 process_set=self._set(process_set)), *tensors)

    def allgather(self, tensor, name, process_set=None):
        return self._call(lambda x: self.hvd.allgather(x, name=name, process_set=self._set(process_set)), tensor)

    def grouped_allgather(self, tensors, name, process_set=None):
        return self._call(lambda *xs: self.hvd.grouped_allgather(list(xs), name=name,
                                                                 process_set=self._set(process_set)), *tensors)

    def broadcast(self, tensor, root_rank, name, inplace, process_set=None):
        if inplace and tensor.dtype not in (tf.uint16,):
            variable = tf.Variable(tensor)
            if tf.executing_eagerly() or not isinstance(self, GraphAdapter):
                return self.hvd.broadcast_(variable, root_rank, name=name, process_set=self._set(process_set))
        return self._call(lambda x: self.hvd.broadcast(x, root_rank, name=name,
                                                       process_set=self._set(process_set)), tensor)

    def alltoall(self, tensor, splits, name, process_set=None):
        ps = self._set(process_set)
        if splits is not None:
            return self._call(lambda x: self.hvd.alltoall(x, splits=splits, name=name, process_set=ps), tensor)
        output = self._call(lambda x: self.hvd.alltoall(x, name=name, process_set=ps), tensor)
        # With splits=None every sender sends dim0 / n rows to each member: gather the senders'
        # row counts to know what came from whom.
        n = ps.size()
        sent = self.hvd.allgather(tf.reshape(tf.shape(tensor)[0] // n, [1]), name=f'{name}.rows', process_set=ps)
        return output, sent

    def reducescatter(self, tensor, op, name, process_set=None, prescale=1.0, postscale=1.0):
        return self._call(lambda x: self.hvd.reducescatter(x, name=name, op=op, process_set=self._set(process_set),
                                                           prescale_factor=prescale, postscale_factor=postscale),
                          tensor)

    def grouped_reducescatter(self, tensors, op, name, process_set=None):
        return self._call(lambda *xs: self.hvd.grouped_reducescatter(list(xs), op=op,
                                                                     process_set=self._set(process_set)), *tensors)

    def join(self):
        return int(self.hvd.join())


class GraphAdapter(EagerAdapter):
    """The same checks with every collective traced into a fresh tf.function; fewer dtypes, since
    each call is a new trace."""

    allreduce_dtypes = ['float32']
    gather_dtypes = ['int64', 'bool']
    alltoall_dtypes = ['float32']
    reducescatter_dtypes = ['float32']

    def _call(self, fn, *args):
        return tf.function(fn, autograph=False)(*args)
