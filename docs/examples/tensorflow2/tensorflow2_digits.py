"""Data-parallel training of a small CNN on scikit-learn's digits with horovod.tensorflow, in a
custom training loop with ``hvd.DistributedGradientTape``.

The digits data set (1,797 8x8 grey-scale images of handwritten digits) ships with scikit-learn,
so nothing is downloaded. Run on two processes with

    horovodrun -np 2 -H localhost:2 python tensorflow2_digits.py

or on one with ``python tensorflow2_digits.py``. Every rank trains on its own shard of the
training set inside a ``tf.function``; the tape averages the gradients over the ranks. After
training, the script checks that every rank holds bitwise-identical weights (exit status 1 if
not), and rank 0 ends by printing the test accuracy.

Options that exercise more of horovod.tensorflow:

* ``--fp16-allreduce``: gradients travel as float16 (``hvd.Compression.fp16``).
* ``--sync-bn``: adds batch normalisation after each convolution, with statistics computed over
  all ranks' batches (``hvd.SyncBatchNormalization``).
* ``--eager``: run the training step eagerly instead of inside ``tf.function``.
"""

import argparse
import sys

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import horovod.tensorflow as hvd


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--epochs', type=int, default=10, help='passes over the training set')
    parser.add_argument('--batch-size', type=int, default=32, help='examples per step per rank')
    parser.add_argument('--lr', type=float, default=0.05,
                        help='learning rate for one process; scaled by the number of ranks')
    parser.add_argument('--seed', type=int, default=42, help='seed for the split and the model')
    parser.add_argument('--fp16-allreduce', action='store_true',
                        help='compress gradients to float16 for the allreduce')
    parser.add_argument('--sync-bn', action='store_true',
                        help='add batch normalisation synchronised across ranks')
    parser.add_argument('--eager', action='store_true', help='run the training step eagerly')
    return parser.parse_args()


def build_model(sync_bn):
    def norm():
        return hvd.SyncBatchNormalization() if sync_bn else tf.keras.layers.Identity()

    return tf.keras.Sequential([
        tf.keras.Input((8, 8, 1)),
        tf.keras.layers.Conv2D(16, 3, padding='same'), norm(), tf.keras.layers.ReLU(),
        tf.keras.layers.Conv2D(32, 3, padding='same'), norm(), tf.keras.layers.ReLU(),
        tf.keras.layers.MaxPooling2D(2),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation='relu'),
        tf.keras.layers.Dense(10),
    ])


def load_data(seed):
    digits = load_digits()
    images = (digits.images[..., None] / 16.0).astype(np.float32)
    labels = digits.target.astype(np.int64)
    return train_test_split(images, labels, test_size=0.2, random_state=seed, stratify=labels)


def metric_average(value, name):
    """Averages a Python float over all ranks."""
    return float(hvd.allreduce(tf.constant(value, tf.float64), name=name))


def evaluate(model, x, y):
    logits = model(x, training=False)
    loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
    accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.float64))
    return float(loss), float(accuracy)


def check_identical_weights(model):
    """True when every rank holds bitwise the same weights (batch norm statistics included) as
    rank 0."""
    flat = tf.concat([tf.reshape(tf.cast(w, tf.float64), [-1]) for w in model.weights], 0)
    reference = hvd.broadcast(flat, root_rank=0, name='final_weights')
    same = tf.constant([int(bool(tf.reduce_all(tf.equal(flat, reference))))], tf.int32)
    return bool(hvd.allreduce(same, op=hvd.Min, name='weights_identical')[0])


def main():
    args = parse_args()
    hvd.init()
    tf.keras.utils.set_random_seed(args.seed)

    x_train, x_test, y_train, y_test = load_data(args.seed)
    # Each rank trains on every size-th example, starting at its rank.
    x_shard, y_shard = x_train[hvd.rank()::hvd.size()], y_train[hvd.rank()::hvd.size()]

    model = build_model(args.sync_bn)
    # Averaged gradients over size() ranks act like a size() times larger batch, hence the
    # larger learning rate.
    optimizer = tf.keras.optimizers.SGD(learning_rate=args.lr * hvd.size(), momentum=0.9)
    optimizer.build(model.trainable_variables)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    # Every rank starts from rank 0's initial weights.
    hvd.broadcast_variables(model.variables, root_rank=0)

    def train_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    if not args.eager:
        train_step = tf.function(train_step)

    # Every rank must take the same number of steps; shards may differ by one example, so the
    # step count comes from the shortest shard.
    steps = (len(x_train) // hvd.size()) // args.batch_size
    rng = np.random.default_rng(args.seed + hvd.rank())
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(x_shard))
        for step in range(steps):
            index = order[step * args.batch_size:(step + 1) * args.batch_size]
            train_step(tf.constant(x_shard[index]), tf.constant(y_shard[index]))
        train_loss, train_accuracy = evaluate(model, x_shard, y_shard)
        train_loss = metric_average(train_loss, 'train_loss')
        train_accuracy = metric_average(train_accuracy, 'train_accuracy')
        if hvd.rank() == 0:
            print(f'epoch {epoch:2d}: train loss {train_loss:.4f}, train accuracy {train_accuracy:.4f}',
                  flush=True)

    if not check_identical_weights(model):
        print(f'rank {hvd.rank()}: weights differ between ranks after training', file=sys.stderr)
        sys.exit(1)

    test_loss, test_accuracy = evaluate(model, x_test, y_test)
    if hvd.rank() == 0:
        print(f'weights identical on all {hvd.size()} ranks')
        print(f'test loss: {test_loss:.4f}')
        print(f'test accuracy: {test_accuracy:.4f}', flush=True)


if __name__ == '__main__':
    main()
