"""Data-parallel training of a small multi-layer perceptron on scikit-learn's digits, as Horovod
ranks on the executors of a Spark application (``horovod.spark.run``).

The digits data set (1,797 8x8 grey-scale images of handwritten digits) ships inside
scikit-learn, so nothing is downloaded. The model is plain numpy: one hidden layer of ReLU units
and a softmax output, trained by mini-batch SGD. Every rank trains on its own shard of the
training set; after each batch the ranks average their gradients with one Horovod allreduce
(``horovod.common``), so every rank applies the same update and ends with the same parameters.

Run it on a Spark cluster (executors with Python, numpy, scikit-learn and horovod-run[spark]):

    python spark_digits.py --master spark://HOST:7077 --num-proc 4

or on this machine with ``--master local[2] --num-proc 2``. The driver prints each rank's place
(host, local and cross rank), its test accuracy and a digest of its parameters, and exits with
status 1 unless every rank holds the same parameters.
"""

import argparse
import hashlib
import os

import numpy as np


def train(epochs=30, batch_size=16, lr=0.05, hidden=64, seed=42):
    """One Horovod rank's training; returns its place, test accuracy and parameter digest.

    Args:
        epochs: passes over the training set.
        batch_size: examples per step per rank (the global batch is ``size`` times larger).
        lr: learning rate for one process; scaled by the number of ranks.
        hidden: units of the hidden layer.
        seed: seed of the train/test split and of the initial parameters.

    Returns a dict: ``rank, size, local_rank, local_size, cross_rank, cross_size, host``
    (HOROVOD_HOSTNAME: the Spark executor host), ``accuracy`` (float, on the held-out quarter of
    the data), ``digest`` (hex SHA-256 of the parameters' float64 bytes).
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from horovod.common import ops
    from horovod.common.basics import HorovodBasics

    hvd = HorovodBasics()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()

    X, y = load_digits(return_X_y=True)
    X = X / 16.0
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=seed, stratify=y)
    X_shard, y_shard = X_train[rank::size], y_train[rank::size]

    rng = np.random.default_rng(seed)
    params = [rng.normal(0, np.sqrt(2.0 / 64), (64, hidden)), np.zeros(hidden),
              rng.normal(0, np.sqrt(1.0 / hidden), (hidden, 10)), np.zeros(10)]
    # Rank 0's initial parameters everywhere (they are equal already here; a model initialised
    # from an unseeded generator would need this).
    ops.wait(ops.broadcast_async(params, ["digits.init.%d" % i for i in range(4)], 0))

    def forward(W1, b1, W2, b2, inputs):
        h = np.maximum(inputs @ W1 + b1, 0.0)
        logits = h @ W2 + b2
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        return h, p / p.sum(axis=1, keepdims=True)

    steps = len(X_train) // (size * batch_size)
    order_rng = np.random.default_rng(seed + 1 + rank)
    scaled_lr = lr * size
    for _ in range(epochs):
        order = order_rng.permutation(len(X_shard))
        for step in range(steps):
            batch = order[step * batch_size:(step + 1) * batch_size]
            xb, yb = X_shard[batch], y_shard[batch]
            W1, b1, W2, b2 = params
            h, p = forward(W1, b1, W2, b2, xb)
            d_logits = p
            d_logits[np.arange(len(yb)), yb] -= 1.0
            d_logits /= len(yb)
            d_h = (d_logits @ W2.T) * (h > 0)
            grads = [xb.T @ d_h, d_h.sum(axis=0), h.T @ d_logits, d_logits.sum(axis=0)]
            flat = np.concatenate([g.ravel() for g in grads])
            ops.wait(ops.allreduce_async([flat], [flat], ["digits.grad"], HorovodBasics.Average))
            offset = 0
            for param in params:
                param -= scaled_lr * flat[offset:offset + param.size].reshape(param.shape)
                offset += param.size

    _, p = forward(*params, X_test)
    accuracy = float((p.argmax(axis=1) == y_test).mean())
    digest = hashlib.sha256(b"".join(np.ascontiguousarray(param).tobytes() for param in params)).hexdigest()
    result = {"rank": rank, "size": size, "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
              "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(),
              "host": os.environ.get("HOROVOD_HOSTNAME"), "accuracy": accuracy, "digest": digest}
    hvd.shutdown()
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", default="local[2]", help="the Spark master URL")
    parser.add_argument("--num-proc", type=int, default=None,
                        help="Horovod ranks, one Spark task each (default: the default parallelism)")
    parser.add_argument("--epochs", type=int, default=30, help="passes over the training set")
    parser.add_argument("--start-timeout", type=int, default=120,
                        help="seconds for all Spark tasks to start")
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    import horovod.spark

    spark = (SparkSession.builder.master(args.master).appName("horovod.spark digits")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    try:
        results = horovod.spark.run(train, kwargs={"epochs": args.epochs}, num_proc=args.num_proc,
                                    start_timeout=args.start_timeout, verbose=0)
    finally:
        spark.stop()
    for r in results:
        print("rank %(rank)d of %(size)d on host %(host)s (local rank %(local_rank)d of %(local_size)d, "
              "cross rank %(cross_rank)d of %(cross_size)d): test accuracy %(accuracy).4f, parameters %(digest).12s"
              % r)
    if len({r["digest"] for r in results}) != 1:
        print("the ranks' parameters differ")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
