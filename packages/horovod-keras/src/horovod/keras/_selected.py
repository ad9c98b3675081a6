"""The Horovod layer of the Keras backend in use ('tensorflow' or 'torch', as
``keras.backend.backend()`` says), loaded once; the package, its callbacks and its elastic module
all take it from here."""

import keras

from horovod._keras import backend as _backend_layer

backend = _backend_layer.load(keras.backend.backend())
