"""The Keras-backend layer: the few tensor operations horovod.keras needs, one module per Keras
backend, each over its framework's Horovod package (``horovod.tensorflow`` or ``horovod.torch``).

Every backend module offers the same names:

* ``NAME``: the Keras backend name it serves.
* ``keras``: the Keras module running on that backend (the shared implementation in
  :mod:`horovod._keras` takes Keras from here or from its caller, never imports it itself).
* ``framework``: the framework's Horovod module (basics such as ``init``/``rank`` come from it,
  so that its per-process state is reset by its own ``init``).
* ``Compression``: that module's gradient compressors.
* ``grouped_allreduce(tensors, op, prescale_factor, postscale_factor, process_set, name)``:
  a list of backend tensors reduced together; returns new tensors of the same shapes and dtypes.
  Works where Keras calls the optimizer (inside ``tf.function`` on TensorFlow).
* ``allreduce``, ``allgather``, ``broadcast``, ``reducescatter``: one backend tensor each.
* ``to_tensor(array)`` / ``to_numpy(tensor)``: conversions for eager values.
* ``dense(grad)``: a dense tensor for a gradient that may be sparse; ``is_sparse(grad)``.

Only the module for the backend Keras runs on is imported, so a TensorFlow job never imports
torch and a PyTorch job never imports horovod.tensorflow.
"""

import importlib

BACKENDS = {"tensorflow": "horovod._keras.backend.tensorflow",
            "torch": "horovod._keras.backend.torch"}


def load(keras_backend_name):
    """Returns the backend module for Keras backend ``keras_backend_name``.

    Raises:
        ImportError: the backend is not one Horovod supports ('tensorflow', 'torch'), or its
            framework or Horovod package is not installed.
    """
    if keras_backend_name not in BACKENDS:
        raise ImportError(
            f"horovod.keras supports the Keras backends {sorted(BACKENDS)}, but Keras runs on "
            f"{keras_backend_name!r}; set KERAS_BACKEND=tensorflow or KERAS_BACKEND=torch before "
            "importing keras.")
    return importlib.import_module(BACKENDS[keras_backend_name])
