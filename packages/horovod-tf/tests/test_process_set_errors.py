"""A rank outside a process set keeps its gradients (DistributedGradientTape and the TF/Keras
DistributedOptimizer return them unchanged), and what the engine refuses when an operation is
submitted (an unknown or unregistered process set, this rank outside the set, bad alltoall
splits) is catchable as tf.errors.InvalidArgumentError, which is also ValueError."""

import numpy as np
import pytest

from horovod_testing import run_ranks


def _caught(call):
    import tensorflow as tf
    try:
        call()
    except Exception as e:  # noqa: BLE001 - the test looks at the type
        return {'invalid_argument': isinstance(e, tf.errors.InvalidArgumentError),
                'value_error': isinstance(e, ValueError), 'type': type(e).__name__, 'message': str(e)}
    return None


def body():
    import tensorflow as tf

    import horovod.tensorflow as hvd
    import os
    n = int(os.environ['HOROVOD_SIZE'])
    subset = hvd.ProcessSet(list(range(n - 1)))  # the last rank is outside
    hvd.init(process_sets=[subset])
    r = hvd.rank()
    out = {}
    v = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(v * v) * (r + 1)
    out['tape'] = hvd.DistributedGradientTape(tape, process_set=subset).gradient(loss, [v])[0].numpy()

    opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(1.0), process_set=subset)
    w = tf.Variable([0.0, 0.0])
    opt.apply_gradients([(tf.constant([1.0, 2.0]) * (r + 1), w)])
    out['keras_optimizer'] = w.numpy()

    errors = {}
    if r == n - 1:
        errors['outside'] = _caught(lambda: hvd.allreduce(tf.ones(2), name='outside', process_set=subset))
    errors['unregistered'] = _caught(lambda: hvd.allreduce(tf.ones(2), process_set=hvd.ProcessSet([0])))
    unknown = hvd.ProcessSet([0])
    unknown.process_set_id = 999
    errors['unknown_id'] = _caught(lambda: hvd.allreduce(tf.ones(2), name='unknown', process_set=unknown))
    errors['splits_sum'] = _caught(lambda: hvd.alltoall(tf.ones(4), splits=[1] * n + [1], name='badsplits'))
    errors['splits_negative'] = _caught(lambda: hvd.alltoall(tf.ones(4), splits=[5] + [-1] * (n - 1),
                                                             name='negsplits'))
    errors['splits_rank2'] = _caught(lambda: hvd.alltoall(tf.ones(4), splits=tf.ones((2, 2), tf.int32)))
    out['errors'] = errors
    # Still in step after the refused submissions.
    out['after'] = hvd.allreduce(tf.constant([float(r)]), op=hvd.Sum, name='after').numpy()
    return out


@pytest.mark.parametrize('np_', [2, 3])
def test_outside_process_set_and_enqueue_errors(np_):
    results = run_ranks(np_, body, timeout=300)
    members = np_ - 1
    average = np.mean([2 * np.array([1.0, 2.0]) * (r + 1) for r in range(members)], axis=0)
    average_step = np.mean([np.array([1.0, 2.0]) * (r + 1) for r in range(members)], axis=0)
    for r, out in enumerate(results):
        local = 2 * np.array([1.0, 2.0]) * (r + 1)
        np.testing.assert_allclose(out['tape'], local if r == np_ - 1 else average)
        np.testing.assert_allclose(out['keras_optimizer'],
                                   -np.array([1.0, 2.0]) * (r + 1) if r == np_ - 1 else -average_step)
        expected = {'unregistered', 'unknown_id', 'splits_sum', 'splits_negative', 'splits_rank2'}
        if r == np_ - 1:
            expected.add('outside')
        assert set(out['errors']) == expected
        for what, caught in out['errors'].items():
            assert caught is not None, f'rank {r}: {what} raised nothing'
            assert caught['invalid_argument'] and caught['value_error'], (r, what, caught)
        assert out['after'] == [sum(range(np_))]
