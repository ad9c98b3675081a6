"""Data-parallel training of a small neural network on scikit-learn's digits (8x8 images of the
digits 0-9, shipped inside scikit-learn) with Horovod on a Ray cluster.

The training function runs on every Horovod worker (one Ray actor per rank). It uses only numpy
and horovod.common's collectives: each rank computes the gradient of its share of every global
minibatch, one allreduce sums the shares, and every rank applies the same update from the same
initial parameters (same seed), so the parameters stay identical on all ranks. With a framework
you would write the same with ``horovod.torch`` (``hvd.DistributedOptimizer``) instead.

Run it against a running cluster, or let it start a local one::

    python ray_digits.py --address auto --num-hosts 2 --workers-per-host 2
    python ray_digits.py --address local --num-workers 2

Needs ``pip install "horovod-run[ray]" scikit-learn``.
"""

import argparse
import hashlib

import numpy as np


def load_data(seed=0):
    """The digits (features scaled to [0, 1]) in a seeded order: 1400 training and 397 test
    images, as ``(X_train, y_train, X_test, y_test)`` (float64 (n, 64) arrays, int labels)."""
    from sklearn.datasets import load_digits
    X, y = load_digits(return_X_y=True)
    X = X / 16.0
    order = np.random.default_rng(seed).permutation(len(X))
    X, y = X[order], y[order]
    return X[:1400], y[:1400], X[1400:], y[1400:]


def sgd(rank, size, allreduce_sum, epochs=30, batch_size=64, learning_rate=0.5, hidden=64, seed=0):
    """Minibatch SGD of a 64-``hidden``-10 tanh network with softmax cross-entropy, as rank
    ``rank`` of ``size``: each global batch of ``batch_size`` samples is split over the ranks,
    and ``allreduce_sum(vector)`` must return the sum of every rank's vector (the identity for
    one process).

    Returns:
        ``(params, test_accuracy)``: the final parameters (a list of float64 arrays W1, b1, W2,
        b2) and the accuracy (float) on the 397 test images.
    """
    X_train, y_train, X_test, y_test = load_data(seed)
    n_train = len(X_train)
    init = np.random.default_rng(seed + 1)
    params = [init.standard_normal((64, hidden)) / np.sqrt(64), np.zeros(hidden),
              init.standard_normal((hidden, 10)) / np.sqrt(hidden), np.zeros(10)]
    shapes = [p.shape for p in params]
    flat = np.concatenate([p.ravel() for p in params])

    def unflatten(vector):
        out, offset = [], 0
        for shape in shapes:
            count = int(np.prod(shape))
            out.append(vector[offset:offset + count].reshape(shape))
            offset += count
        return out

    def forward(W1, b1, W2, b2, x):
        h = np.tanh(x @ W1 + b1)
        return h, h @ W2 + b2

    for epoch in range(epochs):
        shuffled = np.random.default_rng(seed + 100 + epoch).permutation(n_train)
        for step in range(n_train // batch_size):
            batch = shuffled[step * batch_size:(step + 1) * batch_size][rank::size]
            W1, b1, W2, b2 = unflatten(flat)
            x, labels = X_train[batch], y_train[batch]
            h, z = forward(W1, b1, W2, b2, x)
            z = z - z.max(axis=1, keepdims=True)
            p = np.exp(z)
            p /= p.sum(axis=1, keepdims=True)
            p[np.arange(len(labels)), labels] -= 1
            d = p / batch_size  # this rank's share of the global batch's mean
            dh = (d @ W2.T) * (1 - h * h)
            grad = np.concatenate([(x.T @ dh).ravel(), dh.sum(axis=0), (h.T @ d).ravel(), d.sum(axis=0)])
            flat = flat - learning_rate * allreduce_sum(grad)

    params = [p.copy() for p in unflatten(flat)]
    accuracy = float((forward(*params, X_test)[1].argmax(axis=1) == y_test).mean())
    return params, accuracy


def train_digits(epochs=30, batch_size=64, learning_rate=0.5, hidden=64, seed=0):
    """The function every Horovod worker runs: :func:`sgd` with Horovod's allreduce.

    Args:
        epochs (int): passes over the 1400 training images.
        batch_size (int): global minibatch size (samples per step, all ranks together).
        learning_rate (float): SGD step size.
        hidden (int): hidden units.
        seed (int): seed of the data order and of the initial parameters (the same on every rank).

    Returns:
        dict: ``rank``, ``size``, ``local_rank``, ``local_size``, ``cross_rank``, ``cross_size``,
        ``hostname``, ``test_accuracy`` (float), ``params_sha256`` (hex digest of the final
        parameters) and ``params`` (list of float64 arrays).
    """
    import socket

    from horovod.common import ops
    from horovod.common.basics import HorovodBasics

    hvd = HorovodBasics()
    hvd.init()

    def allreduce_sum(vector):
        ops.wait(ops.allreduce_async([vector], [vector], ["digits.grad"], HorovodBasics.Sum))
        return vector

    params, accuracy = sgd(hvd.rank(), hvd.size(), allreduce_sum, epochs=epochs, batch_size=batch_size,
                           learning_rate=learning_rate, hidden=hidden, seed=seed)
    digest = hashlib.sha256(b"".join(p.tobytes() for p in params)).hexdigest()
    result = {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
              "local_size": hvd.local_size(), "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(),
              "hostname": socket.gethostname(), "test_accuracy": accuracy, "params_sha256": digest,
              "params": params}
    hvd.shutdown()
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="auto",
                        help="Ray cluster address: auto (a running cluster), local (start one here), or host:port")
    parser.add_argument("--num-workers", type=int, help="workers, packed on as few nodes as fit")
    parser.add_argument("--num-hosts", type=int, default=2, help="Ray nodes to spread the workers over")
    parser.add_argument("--workers-per-host", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()

    import ray

    from horovod.ray import RayExecutor

    ray.init(address=args.address)
    settings = RayExecutor.create_settings(timeout_s=120)
    if args.num_workers:
        executor = RayExecutor(settings, num_workers=args.num_workers, cpus_per_worker=1)
    else:
        executor = RayExecutor(settings, num_hosts=args.num_hosts, num_workers_per_host=args.workers_per_host,
                               cpus_per_worker=1)
    executor.start()
    try:
        results = executor.run(train_digits, kwargs={"epochs": args.epochs})
    finally:
        executor.shutdown()
    for r in results:
        print("rank %d of %d (local %d of %d, cross %d of %d): test accuracy %.4f, parameters %s"
              % (r["rank"], r["size"], r["local_rank"], r["local_size"], r["cross_rank"], r["cross_size"],
                 r["test_accuracy"], r["params_sha256"][:16]))
    assert len({r["params_sha256"] for r in results}) == 1, "the ranks ended with different parameters"


if __name__ == "__main__":
    main()
