"""Data-parallel training of a small gluon network on scikit-learn's digits with horovod.mxnet.

The digits data set (1,797 8x8 grey-scale images of handwritten digits) ships with scikit-learn,
so nothing is downloaded. Run on two processes with

    horovodrun -np 2 -H localhost:2 python mxnet_digits.py

or on one with ``python mxnet_digits.py``. Needs MXNet 1.9.1 (``pip install mxnet==1.9.1
'numpy<1.24'``). Every rank trains on its own shard of the training set; gradients are averaged
by ``hvd.DistributedTrainer``. The network's input size is left for gluon to infer, so the
initial parameters are broadcast from rank 0 when they are created, at the first forward pass.
After training, the script checks that every rank holds bitwise-identical parameters (exit
status 1 if not), and rank 0 writes the parameters to a file and ends by printing the test
accuracy.

Options that exercise more of horovod.mxnet:

* ``--fp16-allreduce``: gradients travel as float16 (``hvd.Compression.fp16``).
* ``--num-groups N``: gradients go in N grouped allreduces instead of one per parameter.
"""

import argparse
import os
import sys
import tempfile

import horovod.mxnet as hvd
import mxnet as mx
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--epochs', type=int, default=10, help='passes over the training set')
    parser.add_argument('--batch-size', type=int, default=32, help='examples per step per rank')
    parser.add_argument('--lr', type=float, default=0.05,
                        help='learning rate for one process; scaled by the number of ranks')
    parser.add_argument('--seed', type=int, default=42, help='seed for the split and the model')
    parser.add_argument('--fp16-allreduce', action='store_true',
                        help='compress gradients to float16 for the allreduce')
    parser.add_argument('--num-groups', type=int, default=0,
                        help='grouped allreduces per step (0: one per parameter)')
    parser.add_argument('--checkpoint', default=os.path.join(tempfile.gettempdir(),
                                                             'mxnet_digits.params'),
                        help='where rank 0 writes the trained parameters')
    return parser.parse_args()


def build_net():
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(128, activation='relu'),
            mx.gluon.nn.Dense(64, activation='relu'),
            mx.gluon.nn.Dense(10))
    return net


def load_data(seed):
    digits = load_digits()
    images = (digits.data / 16.0).astype(np.float32)
    labels = digits.target.astype(np.float32)
    return train_test_split(images, labels, test_size=0.2, random_state=seed, stratify=labels)


def metric_average(value, name):
    """Averages a Python float over all ranks."""
    return hvd.allreduce(mx.nd.array([value], dtype='float64'), name=name).asscalar()


def evaluate(net, x, y):
    logits = net(mx.nd.array(x))
    loss = mx.gluon.loss.SoftmaxCrossEntropyLoss()(logits, mx.nd.array(y)).mean().asscalar()
    accuracy = float((logits.argmax(axis=1).asnumpy() == y).mean())
    return float(loss), accuracy


def check_identical_parameters(net):
    """Returns True when every rank holds bitwise the same parameters as rank 0."""
    params = net.collect_params()
    flat = mx.nd.concat(*[params[k].data().reshape((-1,)).astype('float64')
                          for k in sorted(params.keys())], dim=0)
    reference = hvd.broadcast(flat, root_rank=0, name='final_parameters')
    same = mx.nd.array([int(np.array_equal(flat.asnumpy(), reference.asnumpy()))],
                       dtype='int32')
    return bool(hvd.allreduce(same, op=hvd.Min, name='parameters_identical').asscalar())


def main():
    args = parse_args()
    hvd.init()
    mx.random.seed(args.seed + hvd.rank())  # ranks start apart; the broadcast aligns them

    x_train, x_test, y_train, y_test = load_data(args.seed)
    # Each rank trains on every size-th example, starting at its rank.
    x_shard, y_shard = x_train[hvd.rank()::hvd.size()], y_train[hvd.rank()::hvd.size()]

    net = build_net()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    params = net.collect_params()
    hvd.broadcast_parameters(params, root_rank=0)
    # Averaged gradients over size() ranks act like a size() times larger batch, hence the
    # larger learning rate.
    trainer = hvd.DistributedTrainer(
        params, 'sgd', {'learning_rate': args.lr * hvd.size(), 'momentum': 0.9},
        compression=hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none,
        num_groups=args.num_groups)
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()

    # Every rank must take the same steps with batches of the same size (the gradient sum is
    # divided by it): shards may differ by one example, so an epoch covers as many examples as
    # the shortest shard has.
    shortest = len(x_train) // hvd.size()
    steps = -(-shortest // args.batch_size)
    rng = np.random.default_rng(args.seed + hvd.rank())
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(x_shard))[:shortest]
        for step in range(steps):
            index = order[step * args.batch_size:(step + 1) * args.batch_size]
            with mx.autograd.record():
                loss = loss_fn(net(mx.nd.array(x_shard[index])), mx.nd.array(y_shard[index]))
            loss.backward()
            trainer.step(len(index))
        train_loss, train_accuracy = evaluate(net, x_shard, y_shard)
        train_loss = metric_average(train_loss, 'train_loss')
        train_accuracy = metric_average(train_accuracy, 'train_accuracy')
        if hvd.rank() == 0:
            print(f'epoch {epoch:2d}: train loss {train_loss:.4f}, '
                  f'train accuracy {train_accuracy:.4f}', flush=True)

    if not check_identical_parameters(net):
        print(f'rank {hvd.rank()}: parameters differ between ranks after training',
              file=sys.stderr)
        sys.exit(1)

    test_loss, test_accuracy = evaluate(net, x_test, y_test)
    if hvd.rank() == 0:
        net.save_parameters(args.checkpoint)
        print(f'parameters written to {args.checkpoint}')
        print(f'parameters identical on all {hvd.size()} ranks')
        print(f'test loss: {test_loss:.4f}')
        print(f'test accuracy: {test_accuracy:.4f}', flush=True)


if __name__ == '__main__':
    main()
