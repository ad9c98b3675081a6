"""Data-parallel ``model.fit`` of a small CNN on scikit-learn's digits with horovod.keras.

The digits data set (1,797 8x8 grey-scale images of handwritten digits) ships with scikit-learn,
so nothing is downloaded. Keras runs on the backend ``KERAS_BACKEND`` names ('tensorflow' or
'torch'). Run on two processes with

    KERAS_BACKEND=torch horovodrun -np 2 -H localhost:2 python keras_digits.py

or on one with ``python keras_digits.py``. Every rank trains on its own shard of the training
set; ``hvd.DistributedOptimizer`` averages the gradients, and the callbacks start every rank
from rank 0's weights, warm the learning rate up, and average the epoch metrics over the ranks.
After training the script checks that every rank holds bitwise-identical weights (exit status 1
if not); rank 0 saves the model, loads it back with ``hvd.load_model`` and ends by printing the
test accuracy.

Options that exercise more of horovod.keras:

* ``--backward-passes-per-step N``: the optimizer sums the gradients of N batches locally and
  allreduces and applies them once every N batches.
* ``--fp16-allreduce``: gradients travel as float16 (``hvd.Compression.fp16``).
"""

import argparse
import os
import sys
import tempfile

import keras
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import horovod.keras as hvd


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--epochs', type=int, default=6, help='passes over the training set')
    parser.add_argument('--batch-size', type=int, default=32, help='examples per step per rank')
    parser.add_argument('--lr', type=float, default=0.002,
                        help='learning rate for one process; scaled by the number of ranks')
    parser.add_argument('--warmup-epochs', type=int, default=1,
                        help='epochs over which the scaled learning rate is reached')
    parser.add_argument('--seed', type=int, default=42, help='seed for the split and the model')
    parser.add_argument('--backward-passes-per-step', type=int, default=1,
                        help='batches whose gradients are summed before each allreduce')
    parser.add_argument('--fp16-allreduce', action='store_true',
                        help='compress gradients to float16 for the allreduce')
    parser.add_argument('--checkpoint', default=os.path.join(tempfile.gettempdir(),
                                                             'keras_digits.keras'),
                        help='where rank 0 saves the trained model (.keras)')
    args = parser.parse_args()
    if args.backward_passes_per_step < 1:
        parser.error('--backward-passes-per-step must be at least 1')
    if not args.checkpoint.endswith('.keras'):
        parser.error('--checkpoint must end in .keras')
    return args


def load_data(seed):
    digits = load_digits()
    images = (digits.images[..., np.newaxis] / 16.0).astype('float32')
    labels = digits.target.astype('int64')
    return train_test_split(images, labels, test_size=0.2, random_state=seed, stratify=labels)


def make_model():
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding='same', activation='relu'),
        keras.layers.Conv2D(32, 3, padding='same', activation='relu'),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation='relu'),
        keras.layers.Dense(10),
    ])


def weights_identical(model):
    """Whether every rank holds bitwise the same weights as rank 0."""
    flat = np.concatenate([np.asarray(w).reshape(-1).astype('float64')
                           for w in model.get_weights()])
    reference = keras.ops.convert_to_numpy(hvd.broadcast(flat, root_rank=0, name='final_weights'))
    same = np.array([int(np.array_equal(flat, reference))], dtype='int32')
    agreeing = keras.ops.convert_to_numpy(hvd.allreduce(same, op=hvd.Sum, name='weights_identical'))
    return int(agreeing[0]) == hvd.size()


def main():
    args = parse_args()
    hvd.init()
    keras.utils.set_random_seed(args.seed + hvd.rank())

    x_train, x_test, y_train, y_test = load_data(args.seed)
    # Each rank trains on every size-th example, starting at its rank; all shards are cut to
    # the same length so that every rank takes the same number of steps.
    shard = len(x_train) // hvd.size()
    x_shard = x_train[hvd.rank()::hvd.size()][:shard]
    y_shard = y_train[hvd.rank()::hvd.size()][:shard]

    model = make_model()
    # Averaged gradients over size() ranks act like a size() times larger batch, hence the larger
    # learning rate, reached gradually by the warm-up callback.
    scaled_lr = args.lr * hvd.size()
    optimizer = hvd.DistributedOptimizer(
        keras.optimizers.Adam(learning_rate=scaled_lr),
        compression=hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none,
        backward_passes_per_step=args.backward_passes_per_step)
    # XLA cannot compile Horovod's collectives, which run outside the TensorFlow graph.
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=['accuracy'], jit_compile=False)

    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Before the checkpoint, so that it sees the metrics averaged over the ranks.
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr,
                                                 warmup_epochs=args.warmup_epochs,
                                                 verbose=1 if hvd.rank() == 0 else 0),
    ]
    if hvd.rank() == 0:
        best = hvd.callbacks.BestModelCheckpoint(monitor='val_loss')
        best.filepath = args.checkpoint[:-len('.keras')] + '-best.keras'
        callbacks.append(best)
    # Each rank validates on its own share of the test set; the metric callback averages them.
    model.fit(x_shard, y_shard, batch_size=args.batch_size, epochs=args.epochs,
              validation_data=(x_test[hvd.rank()::hvd.size()], y_test[hvd.rank()::hvd.size()]),
              callbacks=callbacks, verbose=2 if hvd.rank() == 0 else 0)

    if not weights_identical(model):
        print(f'rank {hvd.rank()}: weights differ between ranks after training', file=sys.stderr)
        sys.exit(1)

    _, test_accuracy = model.evaluate(x_test, y_test, verbose=0)
    if hvd.rank() == 0:
        model.save(args.checkpoint)
        restored = hvd.load_model(args.checkpoint)
        _, restored_accuracy = restored.evaluate(x_test, y_test, verbose=0)
        if restored_accuracy != test_accuracy:
            print(f'the model loaded from {args.checkpoint} scores {restored_accuracy:.4f}, the '
                  f'trained one {test_accuracy:.4f}', file=sys.stderr)
            sys.exit(1)
        print(f'model saved to {args.checkpoint} and loaded back with '
              f'{type(restored.optimizer).__name__} ({restored.optimizer._name})')
        print(f'weights identical on all {hvd.size()} ranks')
        print(f'test accuracy: {test_accuracy:.4f}', flush=True)


if __name__ == '__main__':
    main()
