"""DistributedTrainer and DistributedOptimizer against single-process references.

Each rank trains on its own batch; the reference is plain MXNet in one process: a gluon
Trainer (no kvstore) on the concatenation of the batches of the ranks that average together,
or the wrapped optimizer applied to the mean gradient. Both start from the same parameters.
"""

import warnings

import numpy as np
import pytest
from horovod_testing.collectives import rank_input
from jobs import SIZES, results, worker

STEPS = 3
BATCH = 4


def _net(freeze_bias=False):
    """A two-layer net with parameters fixed by numpy (the same in every process)."""
    import mxnet as mx
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(6, activation='tanh', in_units=5), mx.gluon.nn.Dense(3, in_units=6))
    net.initialize()
    rng = np.random.default_rng(7)
    for param in _ordered(net):
        param.set_data(mx.nd.array(rng.uniform(-0.5, 0.5, size=param.shape)))
    if freeze_bias:
        _ordered(net)[-1].grad_req = 'null'
    return net


def _ordered(net):
    # In creation order: names carry a per-process counter, so two nets' names sort alike only
    # while the counters have the same number of digits.
    return list(net.collect_params().values())


def _batch(rank, step):
    x = rank_input(rank, 'float32', (BATCH, 5), salt=70 + step).astype(np.float32) / 3
    y = (rank_input(rank, 'int32', (BATCH,), salt=80 + step) % 3).astype(np.float32)
    return x, y


def _train(net, trainer, ranks_data):
    """STEPS steps; ``ranks_data(step)`` gives the (x, y) this process trains on."""
    import mxnet as mx
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    for step in range(STEPS):
        x, y = ranks_data(step)
        with mx.autograd.record():
            loss = loss_fn(net(mx.nd.array(x)), mx.nd.array(y))
        loss.backward()
        trainer.step(BATCH)
    return [p.data().asnumpy() for p in _ordered(net)]


def _reference(ranks, optimizer, optimizer_params, freeze_bias=False):
    """Plain gluon on the batches of ``ranks`` concatenated, with a step over all of them."""
    import mxnet as mx
    net = _net(freeze_bias)
    trainer = mx.gluon.Trainer(net.collect_params(), optimizer, dict(optimizer_params),
                               kvstore=None)
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    for step in range(STEPS):
        xs = [_batch(r, step)[0] for r in ranks]
        ys = [_batch(r, step)[1] for r in ranks]
        with mx.autograd.record():
            loss = loss_fn(net(mx.nd.array(np.concatenate(xs))), mx.nd.array(np.concatenate(ys)))
        loss.backward()
        trainer.step(BATCH * len(ranks))
    return [p.data().asnumpy() for p in _ordered(net)]


def _max_error(actual, expected):
    return max(float(np.max(np.abs(a - e))) for a, e in zip(actual, expected, strict=True))


@worker
def trainer_cases():
    """Max abs difference from the reference, per configuration."""
    import horovod.mxnet as hvd
    import mxnet as mx
    rank, size = hvd.rank(), hvd.size()
    everyone = list(range(size))
    sgd = ('sgd', {'learning_rate': 0.5, 'momentum': 0.9})
    adam = ('adam', {'learning_rate': 0.05})
    errors = {}

    def run(key, optimizer, ranks=everyone, freeze_bias=False, **options):
        net = _net(freeze_bias)
        trainer = hvd.DistributedTrainer(net.collect_params(), optimizer[0], dict(optimizer[1]),
                                         **options)
        got = _train(net, trainer, lambda step: _batch(rank, step))
        errors[key] = _max_error(got, _reference(ranks, *optimizer, freeze_bias=freeze_bias))

    run('sgd', sgd)
    run('adam_groups', adam, num_groups=2)
    run('adam_groups_many', adam, num_groups=10)
    run('fp16', sgd, compression=hvd.Compression.fp16)
    run('predivide', sgd, gradient_predivide_factor=4.0)
    run('frozen_bias', sgd, freeze_bias=True)
    run('prefix', sgd, prefix='solo.')

    # Two trainers in one program, on two nets, their allreduces told apart by their prefixes.
    nets = [_net(), _net()]
    trainers = [hvd.DistributedTrainer(n.collect_params(), 'sgd', dict(sgd[1]), prefix=p)
                for n, p in zip(nets, ('a.', 'b.'), strict=True)]
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    for step in range(STEPS):
        for net, trainer in zip(nets, trainers, strict=True):
            x, y = _batch(rank, step)
            with mx.autograd.record():
                loss = loss_fn(net(mx.nd.array(x)), mx.nd.array(y))
            loss.backward()
            trainer.step(BATCH)
    reference = _reference(everyone, *sgd)
    errors['two_trainers'] = max(_max_error([p.data().asnumpy() for p in _ordered(n)], reference)
                                 for n in nets)

    # A list of parameters (sorted by name) and a DistributedOptimizer (unwrapped, warned).
    net = _net()
    wrapped = hvd.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.5, momentum=0.9))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        trainer = hvd.DistributedTrainer(list(reversed(_ordered(net))), wrapped)
    errors['list_and_wrapped_optimizer'] = _max_error(
        _train(net, trainer, lambda step: _batch(rank, step)), _reference(everyone, *sgd))
    errors['warned'] = 0.0 if any('DistributedOptimizer' in str(w.message) for w in caught) else 1.0

    # A process set of all ranks but the last: it averages within; the last trains alone.
    if size > 1:
        subset = hvd.add_process_set(everyone[:-1])
        ranks = everyone[:-1] if rank in subset.ranks else [rank]
        run('process_set', sgd, ranks=ranks, process_set=subset)
        hvd.remove_process_set(subset)

    # The distributed result really differs from training alone (so the checks above can fail).
    alone = _reference([rank], *sgd)
    errors['alone_differs'] = _max_error(alone, _reference(everyone, *sgd))
    return errors


@worker
def optimizer_cases():
    """DistributedOptimizer through MXNet's updater: per-index and aggregated updates."""
    import horovod.mxnet as hvd
    import mxnet as mx
    rank, size = hvd.rank(), hvd.size()
    shapes = [(3,), (2, 2), (5,), (1,)]

    def grads_of(r, step):
        return [rank_input(r, 'float32', s, salt=90 + 10 * step + i).astype(np.float32)
                for i, s in enumerate(shapes)]

    def weights():
        return [mx.nd.array(np.full(s, 0.5, np.float32)) for s in shapes]

    def reference(optimizer, ranks=range(size)):
        ws = weights()
        update = mx.optimizer.get_updater(optimizer)
        for step in range(STEPS):
            mean = [np.mean([grads_of(r, step)[i] for r in ranks], axis=0)
                    for i in range(len(shapes))]
            for i, (w, g) in enumerate(zip(ws, mean, strict=True)):
                update(i, mx.nd.array(g), w)
        return [w.asnumpy() for w in ws]

    errors = {}
    cases = {
        'sgd': (lambda: mx.optimizer.SGD(learning_rate=0.3, momentum=0.5), {}),
        'predivide': (lambda: mx.optimizer.SGD(learning_rate=0.3), {'gradient_predivide_factor': 2.0}),
        'adam': (lambda: mx.optimizer.Adam(learning_rate=0.1), {}),
    }
    for key, (make, options) in cases.items():
        ws = weights()
        update = mx.optimizer.get_updater(hvd.DistributedOptimizer(make(), **options))
        for step in range(STEPS):
            for i, (w, g) in enumerate(zip(ws, grads_of(rank, step), strict=True)):
                update(i, mx.nd.array(g), w)
        errors[key] = _max_error([w.asnumpy() for w in ws], reference(make()))

    # Aggregated updates (lists of indices), one allreduce per gradient or grouped.
    for num_groups in (0, 2):
        ws = weights()
        sgd = mx.optimizer.SGD(learning_rate=0.3, momentum=0.5)
        sgd.aggregate_num = 4  # updates of up to 4 indices go to the optimizer as lists
        optimizer = hvd.DistributedOptimizer(sgd, num_groups=num_groups)
        update = mx.optimizer.get_updater(optimizer)
        for step in range(STEPS):
            update(list(range(len(shapes))), [mx.nd.array(g) for g in grads_of(rank, step)], ws)
        errors[f'aggregated_{num_groups}'] = _max_error(
            [w.asnumpy() for w in ws],
            reference(mx.optimizer.SGD(learning_rate=0.3, momentum=0.5)))
    # A process set of all ranks but the last: its members average within it, the last rank
    # updates with its own gradients.
    if size > 1:
        subset = hvd.add_process_set(list(range(size - 1)))
        ws = weights()
        update = mx.optimizer.get_updater(hvd.DistributedOptimizer(
            mx.optimizer.SGD(learning_rate=0.3, momentum=0.5), process_set=subset))
        for step in range(STEPS):
            for i, (w, g) in enumerate(zip(ws, grads_of(rank, step), strict=True)):
                update(i, mx.nd.array(g), w)
        ranks = subset.ranks if rank in subset.ranks else [rank]
        errors['process_set'] = _max_error([w.asnumpy() for w in ws], reference(
            mx.optimizer.SGD(learning_rate=0.3, momentum=0.5), ranks))
        hvd.remove_process_set(subset)
    # Attributes read and written through the wrapper reach the wrapped optimizer.
    optimizer = hvd.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.3))
    optimizer.set_learning_rate(0.7)
    optimizer.wd = 0.25
    errors['delegation'] = float(abs(optimizer._optimizer.learning_rate - 0.7)
                                 + abs(optimizer._optimizer.wd - 0.25)
                                 + abs(optimizer.learning_rate - 0.7))
    # MXNet's updaters pickle the optimizer when saving states with dump_optimizer=True.
    update = mx.optimizer.get_updater(optimizer)
    update.set_states(update.get_states(dump_optimizer=True))
    restored = update.optimizer
    errors['pickled'] = (0.0 if isinstance(restored, hvd.DistributedOptimizer)
                         and restored.learning_rate == 0.7 and restored.wd == 0.25 else 1.0)
    return errors


TOLERANCE = {'fp16': 2e-2}


@pytest.mark.parametrize('np_', SIZES)
def test_distributed_trainer_matches_single_process(np_):
    for errors in results(trainer_cases, np_):
        alone = errors.pop('alone_differs')
        if np_ > 1:
            assert alone > 1e-3, 'the ranks train on data that makes no difference'
        for key, error in errors.items():
            assert error <= TOLERANCE.get(key, 1e-5), (key, errors)
        assert ('process_set' in errors) == (np_ > 1)


@pytest.mark.parametrize('np_', SIZES)
def test_distributed_optimizer_matches_single_process(np_):
    for errors in results(optimizer_cases, np_):
        assert set(errors) == {'sgd', 'predivide', 'adam', 'aggregated_0', 'aggregated_2',
                               'delegation', 'pickled'} | ({'process_set'} if np_ > 1 else set())
        for key, error in errors.items():
            assert error <= 1e-5, (key, errors)
