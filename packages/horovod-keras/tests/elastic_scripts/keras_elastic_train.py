"""An elastic Keras 3 training script for test_elastic.py (run under horovodrun; the backend
comes from KERAS_BACKEND).

Linear regression in float64 (a Dense layer, mean squared error) on N fixed samples with
``model.fit`` and ``hvd.DistributedOptimizer(SGD with momentum)``. Every step trains on one
global batch of G samples whatever the world size: the samples ``order[k * G:(k + 1) * G]``
split evenly over the ranks (each rank fits its share, unshuffled, in batches of G / size), so
the weights equal those of a single process (the test's numpy reference) however the world
changed, as long as every committed epoch is trained exactly once. The elastic callbacks keep
``state.epoch`` and ``state.batch`` and commit at every epoch end (Keras 3 always starts an epoch
at its first batch, so a reset must fall on an epoch boundary for the replay to be exact); fit
starts at ``initial_epoch=state.epoch``.

MODULE picks the Horovod module: ``horovod.keras`` (default) or ``horovod.tensorflow.keras``.
Lines: ``STEP {rank, size, pid, host, epoch, batch, state_epoch}`` after each batch, ``FINAL
{rank, size, weights, epoch}`` at the end. argv: epochs; env STEP_SLEEP (seconds per batch).
"""

import importlib
import json
import os
import sys
import time

import keras
import numpy as np

hvd = importlib.import_module(os.environ.get("MODULE", "horovod.keras"))

N, G, LR, MOMENTUM = 48, 8, 0.05, 0.5
EPOCHS = int(sys.argv[1])
STEP_SLEEP = float(os.environ.get("STEP_SLEEP", "0.1"))

hvd.init()
keras.config.set_floatx("float64")  # the loss and the learning rate too, not only the layer

rng = np.random.default_rng(1)
X = rng.standard_normal((N, 3))
Y = X @ np.array([1.5, -2.0, 0.5]) + 0.1
ORDER = np.random.default_rng(7).permutation(N)

model = keras.Sequential([keras.Input((3,), dtype="float64"),
                          keras.layers.Dense(1, dtype="float64", kernel_initializer="zeros")])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=MOMENTUM)),
              loss="mse", jit_compile=False)
state = hvd.elastic.KerasState(model, epoch=0, batch=0)


def log(kind, **fields):
    fields.update(rank=hvd.rank(), size=hvd.size(), pid=os.getpid(),
                  host=os.environ.get("HOROVOD_HOSTNAME"))
    print(kind + " " + json.dumps(fields), flush=True)


class StepLog(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        log("STEP", epoch=self.epoch, batch=batch, state_epoch=state.epoch)
        time.sleep(STEP_SLEEP)


@hvd.elastic.run
def train(state):
    share = G // hvd.size()
    mine = np.concatenate([ORDER[k * G:(k + 1) * G][hvd.rank() * share:(hvd.rank() + 1) * share]
                           for k in range(N // G)])
    model.fit(X[mine], Y[mine, None], batch_size=share, epochs=EPOCHS, initial_epoch=state.epoch,
              shuffle=False, verbose=0,
              callbacks=[hvd.elastic.UpdateBatchStateCallback(state),
                         hvd.elastic.UpdateEpochStateCallback(state), StepLog(),
                         hvd.elastic.CommitStateCallback(state, batches_per_commit=10 ** 6)])


train(state)
log("FINAL", weights=[float(v) for v in np.concatenate([w.reshape(-1) for w in model.get_weights()])],
    epoch=state.epoch)
