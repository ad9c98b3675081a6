"""An elastic TensorFlow 2 training script for test_elastic.py (run under horovodrun).

Linear regression in float64 (a Keras Dense layer) on N fixed samples, trained by a
``tf.function`` step with ``hvd.DistributedGradientTape`` and Keras SGD with momentum. Every
step trains on one global batch of G samples whatever the world size: the epoch's permutation
``perm[step * G:(step + 1) * G]``, split evenly over the ranks. The average of the ranks' mean
gradients is then the global batch's mean gradient, so the weights after every step equal those
of a single process (the test's numpy reference) however the world changed, as long as every
committed step is trained exactly once. The state (model, optimizer, epoch, step) is committed
after every step; the step's function has a batch dimension of unknown size, so one trace serves
every world size.

Lines: ``STEP {rank, size, pid, host, epoch, batch}`` after each step, ``FINAL {rank, size,
weights}`` at the end. argv: epochs; env STEP_SLEEP (seconds per step).
"""

import json
import os
import sys
import time

import numpy as np
import tensorflow as tf

import horovod.tensorflow as hvd

N, G, LR, MOMENTUM = 48, 8, 0.05, 0.5
EPOCHS = int(sys.argv[1])
STEP_SLEEP = float(os.environ.get("STEP_SLEEP", "0.1"))

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)
hvd.init()

rng = np.random.default_rng(1)
X = rng.standard_normal((N, 3))
Y = X @ np.array([1.5, -2.0, 0.5]) + 0.1

keras = tf.keras
model = keras.Sequential([keras.Input((3,), dtype="float64"),
                          keras.layers.Dense(1, dtype="float64", kernel_initializer="zeros")])
optimizer = keras.optimizers.SGD(LR, momentum=MOMENTUM)
state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=0, step=0)


@tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float64), tf.TensorSpec([None], tf.float64)])
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x)[:, 0] - y) ** 2)
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))


def log(kind, **fields):
    fields.update(rank=hvd.rank(), size=hvd.size(), pid=os.getpid(),
                  host=os.environ.get("HOROVOD_HOSTNAME"))
    print(kind + " " + json.dumps(fields), flush=True)


@hvd.elastic.run
def train(state):
    while state.epoch < EPOCHS:
        perm = np.random.default_rng([7, state.epoch]).permutation(N)
        while state.step < N // G:
            share = G // hvd.size()
            batch = perm[state.step * G:(state.step + 1) * G][hvd.rank() * share:(hvd.rank() + 1) * share]
            train_step(X[batch], Y[batch])
            log("STEP", epoch=state.epoch, batch=state.step)
            state.step += 1
            time.sleep(STEP_SLEEP)
            state.commit()
        state.epoch += 1
        state.step = 0
        state.commit()


train(state)
log("FINAL", weights=[float(v) for v in np.concatenate([w.reshape(-1) for w in model.get_weights()])])
