"""Keras backend 'tensorflow': tensors are TensorFlow tensors, collectives go through
horovod.tensorflow, whose ops also work inside the ``tf.function`` that ``model.fit`` traces."""

try:
    import horovod.tensorflow as framework
except ImportError as e:
    raise ImportError("horovod.keras on the Keras backend 'tensorflow' needs horovod-tf: "
                      "pip install horovod-tf") from e

import keras  # noqa: F401  (this layer's ``keras``, see horovod._keras.backend)
import tensorflow as tf

NAME = "tensorflow"
Compression = framework.Compression


def grouped_allreduce(tensors, op, prescale_factor=1.0, postscale_factor=1.0,
                      process_set=framework.global_process_set, name=None):
    return list(framework.grouped_allreduce(
        list(tensors), op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
        process_set=process_set, name=name))


def allreduce(tensor, op, prescale_factor=1.0, postscale_factor=1.0,
              process_set=framework.global_process_set, name=None):
    return framework.allreduce(tensor, op=op, prescale_factor=prescale_factor,
                               postscale_factor=postscale_factor, process_set=process_set,
                               name=name)


def allgather(tensor, process_set=framework.global_process_set, name=None):
    return framework.allgather(tensor, name=name, process_set=process_set)


def broadcast(tensor, root_rank, process_set=framework.global_process_set, name=None):
    return framework.broadcast(tensor, root_rank, name=name, process_set=process_set)


def reducescatter(tensor, op, process_set=framework.global_process_set, name=None):
    return framework.reducescatter(tensor, op=op, name=name, process_set=process_set)


def to_tensor(array):
    return tf.convert_to_tensor(array)


def to_numpy(tensor):
    return tensor.numpy()


def dense(grad):
    # Embedding lookups give tf.IndexedSlices; the dense form is the full-shape gradient.
    return tf.convert_to_tensor(grad) if isinstance(grad, tf.IndexedSlices) else grad


def is_sparse(grad):
    return isinstance(grad, tf.IndexedSlices)
