"""horovod.keras on the Keras backends 'tensorflow' and 'torch' at np = 1, 2 and 3: every result
of the worker bodies (bodies.py) is compared with a numpy reference computed here."""

import numpy as np
import pytest
from bodies import B0, LR, W0, WORKERS, low_rank_grads, rank_data, rank_grads, topk_grads
from jobs import job_fixture

job = job_fixture(WORKERS)


def close(actual, expected, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=rtol, atol=atol)


def test_import_brings_only_the_backends_framework(job):
    backend, n, results = job('imports')
    assert [r['rank'] for r in results] == list(range(n))
    for r in results:
        assert r['size'] == n and r['keras_backend'] == backend
        assert not r['torch_before']
        if backend == 'tensorflow':
            assert not r['torch'] and not r['horovod.torch'] and r['horovod.tensorflow']
        else:
            assert r['horovod.torch'] and not r['horovod.tensorflow'] and not r['tensorflow']


def test_value_collectives(job):
    _, n, results = job('ops')
    xs = [np.arange(6, dtype=np.float32).reshape(2, 3) + r for r in range(n)]
    total = np.sum(xs, axis=0)
    parts = [np.arange(4 * n, dtype=np.float32).reshape(2 * n, 2) + r for r in range(n)]
    for rank, out in enumerate(results):
        close(out['average'], total / n)
        close(out['sum'], total)
        close(out['average_false'], total)
        close(out['scaled'], 0.25 * (2.0 * total))
        assert out['int_sum'].dtype == np.int32
        np.testing.assert_array_equal(out['int_sum'], [n * (n + 1) // 2, 10 * n])
        assert out['fp16'].dtype == np.float32
        close(out['fp16'], total / n, rtol=1e-3)
        # bfloat16 keeps 8 significant bits: the average of values below 8 is within 2^-8 of it.
        assert out['bf16'].dtype == np.float32
        close(out['bf16'], total / n, rtol=2 ** -8)
        np.testing.assert_array_equal(
            out['gather'], np.concatenate([np.full((r + 1, 2), r, np.float32) for r in range(n)]))
        np.testing.assert_array_equal(out['broadcast'], xs[n - 1])
        np.testing.assert_array_equal(out['reducescatter'],
                                      np.sum(parts, axis=0)[2 * rank:2 * rank + 2])
        floats, integer, doubles = out['broadcast_variables']
        np.testing.assert_array_equal(floats, np.full((2, 2), n - 1, np.float32))
        assert int(integer) == (n - 1) * 7
        assert doubles.dtype == np.float64
        np.testing.assert_array_equal(doubles, np.arange(3) * n)
        assert out['errors']['op_and_average'][0] == 'ValueError'
        assert 'supersedes average' in out['errors']['op_and_average'][1]
        assert out['errors']['global_variables'][0] == 'RuntimeError'
        assert 'BroadcastGlobalVariablesCallback' in out['errors']['global_variables'][1]


def test_distributed_optimizer_apply(job):
    _, n, results = job('optimizer_apply')
    gws = [rank_grads(r)[0] for r in range(n)]
    gbs = [rank_grads(r)[1] for r in range(n)]
    mean_w, mean_b = np.mean(gws, axis=0), np.mean(gbs, axis=0)
    for rank, out in enumerate(results):
        for case in ('average', 'predivide', 'groups_int', 'groups_list', 'apply_gradients'):
            w, b, iterations, cls, name = out[case]
            close(w, W0 - LR * mean_w)
            close(b, B0 - LR * mean_b)
            assert (iterations, cls, name) == (1, 'SGD', 'DistributedSGD'), case
        w, b, *_ = out['sum']
        close(w, W0 - LR * np.sum(gws, axis=0))
        close(b, B0 - LR * np.sum(gbs, axis=0))
        w, b, *_ = out['fp16']
        close(w, W0 - LR * mean_w, rtol=1e-3, atol=1e-3)
        close(b, B0 - LR * mean_b, rtol=1e-3, atol=1e-3)
        w, b, *_ = out['bf16']
        close(w, W0 - LR * mean_w, rtol=1e-2, atol=1e-2)
        close(b, B0 - LR * mean_b, rtol=1e-2, atol=1e-2)
        # The local variable's gradient stays on its rank, divided by the set size.
        w, b, *_ = out['local_bias']
        close(w, W0 - LR * mean_w)
        close(b, B0 - LR * gbs[rank] / n)
        w, b, *_ = out['none_bias_grad']
        close(w, W0 - LR * mean_w)
        np.testing.assert_array_equal(b, B0)
        for case, divisor in (('bpps2', 1.0), ('bpps2_average', 2.0)):
            (w1, b1, it1, c1), (w2, b2, it2, c2) = out[case]
            np.testing.assert_array_equal(w1, W0)
            np.testing.assert_array_equal(b1, B0)
            assert (it1, c1, it2, c2) == (1, 1, 2, 0), case
            summed_w = np.mean([rank_grads(r, 0)[0] + rank_grads(r, 1)[0] for r in range(n)], 0)
            summed_b = np.mean([rank_grads(r, 0)[1] + rank_grads(r, 1)[1] for r in range(n)], 0)
            close(w2, W0 - LR * summed_w / divisor)
            close(b2, B0 - LR * summed_b / divisor)


def mse_grads(x, y, w, b):
    """Gradients of Keras' 'mse' (mean over all elements) of ``x @ w + b`` against ``y``."""
    diff = (x.astype(np.float64) @ w + b) - y
    scale = 2.0 / diff.size
    return scale * x.T @ diff, scale * diff.sum(0)


def test_model_fit(job):
    _, n, results = job('fit')
    data = [rank_data(r) for r in range(n)]
    one = [mse_grads(x, y, W0, B0) for x, y in data]
    two = [[mse_grads(x[i:i + 2], y[i:i + 2], W0, B0) for i in (0, 2)] for x, y in data]
    for rank, out in enumerate(results):
        kernel, bias, iterations = out['one_step']
        close(kernel, W0 - LR * np.mean([g[0] for g in one], 0))
        close(bias, B0 - LR * np.mean([g[1] for g in one], 0))
        assert iterations == 1
        kernel, bias, iterations = out['bpps2']
        close(kernel, W0 - LR * np.mean([a[0] + c[0] for a, c in two], 0))
        close(bias, B0 - LR * np.mean([a[1] + c[1] for a, c in two], 0))
        assert iterations == 2
        kernel, bias, iterations = out['partial_local']
        close(kernel, W0 - LR * one[rank][0] / n)
        close(bias, B0 - LR * one[rank][1] / n)
    if n > 1:
        assert not np.array_equal(results[0]['partial_local'][0], results[1]['partial_local'][0])


def test_broadcast_global_variables_callback(job):
    # Ranks start from different weights; after the broadcast at the end of the first batch
    # they take the same averaged steps, so they end bitwise equal.
    _, n, results = job('callbacks')
    for out in results[1:]:
        for mine, rank0 in zip(out['final'], results[0]['final'], strict=True):
            np.testing.assert_array_equal(mine, rank0)
    if n > 1:
        assert not np.array_equal(results[0]['initial'][0], results[n - 1]['initial'][0])


def test_metric_average_callback(job):
    _, n, results = job('callbacks')
    for out in results:
        logs = out['schedule']['logs']
        assert len(logs) == 4
        for epoch, epoch_logs in enumerate(logs):
            assert epoch_logs['rank_metric'] == pytest.approx((n + 1) / 2.0)
            assert epoch_logs['loss'] == pytest.approx(
                np.mean([o['loss_before'][epoch] for o in results]), rel=1e-6)


def test_learning_rate_schedule_callback(job):
    _, _, results = job('callbacks')
    for out in results:
        record = out['schedule']
        # Epochs 1 and 2 (end excluded): 0.2 * 0.5 ** (epoch - 1), set at their first batch.
        close(record['lr'], [0.1, 0.1, 0.2, 0.2, 0.1, 0.1, 0.1, 0.1])
        # Momentum scaled by new/old lr in the batch where the rate changes, restored after it.
        close(record['momentum'], [0.9, 0.9, 1.8, 0.9, 0.45, 0.9, 0.9, 0.9])
        close(record['momentum_after'], [0.9] * 8)
        close([logs['lr'] for logs in record['logs']], [0.1, 0.2, 0.1, 0.1])


def test_learning_rate_warmup_callback(job):
    # Steps per epoch (2) come from fit's parameters; the rate of batch b of epoch e is
    # 0.4 / n * (e' * (n - 1) / 2 + 1) with e' = e + (b + 1) / 2, and stays after epoch 2.
    _, n, results = job('callbacks')
    ramp = [0.4 / n * (e * (n - 1) / 2.0 + 1.0) for e in (0.5, 1.0, 1.5, 2.0)]
    assert ramp[-1] == pytest.approx(0.4)
    for out in results:
        close(out['warmup'], ramp + [ramp[-1]] * 2)


def test_best_model_checkpoint(job):
    _, _, results = job('callbacks')
    for out in results:
        assert out['best_unset'] is not None and 'filepath' in out['best_unset']
        assert out['best'] == (True, True)
        assert 'initial_lr' in out['initial_lr_none']


def test_load_model(job):
    _, n, results = job('load_model')
    for out in results:
        assert not out['plain_distributed'] and out['plain_class'] == 'SGD'
        assert out['loaded_distributed'] and out['loaded_class'] == 'SGD'
        assert out['loaded_fp16_compression']
        assert len(out['loaded_optimizer']) == len(out['saved_optimizer']) >= 3
        for loaded, saved in zip(out['loaded_optimizer'], out['saved_optimizer'], strict=True):
            np.testing.assert_array_equal(loaded, saved)
        # The loaded model goes on exactly like the one that was saved: same reduced update.
        for loaded, original in zip(out['weights_after'], out['original_after'], strict=True):
            close(loaded, original)
    for out in results[1:]:
        for mine, rank0 in zip(out['weights_after'], results[0]['weights_after'], strict=True):
            np.testing.assert_array_equal(mine, rank0)


def test_wrong_arguments(job):
    _, _, results = job('errors')
    expected = {'adasum': 'op=Average or op=Sum', 'predivide_sum': 'requires op=Average',
                'bpps_zero': 'int >= 1', 'groups_bad': 'positive int',
                'not_optimizer': 'keras.optimizers.Optimizer', 'twice': 'already distributed',
                'partial_not_layer': 'Keras layer', 'legacy_opts': 'Keras 3',
                'stateful_predivide': 'no gradient_predivide_factor', 'not_a_compressor': 'hvd.PowerSGD'}
    for out in results:
        for label, words in expected.items():
            assert out[label] is not None and words in out[label], (label, out[label])
        assert out['class'] == ('Adam', 'mine', 'Adam', 0.25, True, True)


def test_tensorflow_specifics(job):
    backend, n, results = job('tensorflow_only')
    for out in results:
        if backend != 'tensorflow':
            assert "'tensorflow' backend" in out['tf_keras_import_error']
            continue
        expected = np.zeros((4, 2), np.float32)
        for r in range(n):
            expected[r % 4] -= np.array([1.0, 2.0]) * (r + 1) / n
        close(out['sparse'], expected)
        close(out['sparse_as_dense'], expected)
        w, b = out['tf_keras_step']
        close(w, W0 - LR * np.mean([rank_grads(r)[0] for r in range(n)], 0))
        close(b, B0 - LR * np.mean([rank_grads(r)[1] for r in range(n)], 0))
        close(out['tf_keras_allreduce'], [(n + 1) / 2.0])
        assert out['tf_keras_names'] == (True, True)


def _topk_reference(n, ratio=0.25, steps=2):
    """numpy's top-k with error feedback and op=Sum: the summed sparse gradient of each step and
    each rank's residual after the last step."""
    residuals = [np.zeros((4, 2), np.float32) for _ in range(n)]
    sums = []
    for step in range(steps):
        total = np.zeros(8, np.float32)
        for r in range(n):
            flat = (topk_grads(r, step) + residuals[r]).reshape(-1)
            k = max(1, int(np.ceil(ratio * flat.size)))
            chosen = np.argsort(-np.abs(flat))[:k]
            total[chosen] += flat[chosen]
            kept = flat.copy()
            kept[chosen] = 0.0
            residuals[r] = kept.reshape(4, 2)
        sums.append(total.reshape(4, 2))
    return sums, residuals


def test_compressors_with_state(job):
    backend, n, results = job('stateful')
    mean_w = [np.mean([low_rank_grads(r, s)[0] for r in range(n)], 0) for s in range(3)]
    mean_b = [np.mean([low_rank_grads(r, s)[1] for r in range(n)], 0) for s in range(3)]
    sums, residuals = _topk_reference(n)
    data = [rank_data(r) for r in range(n)]
    one = [mse_grads(x, y, W0, B0) for x, y in data]
    for rank, out in enumerate(results):
        # The averaged kernel gradient has rank 1 < r = 2: PowerSGD sends it whole.
        w, b, steps, q_names, residual_names = out['powersgd']
        close(w, -LR * np.sum(mean_w, 0), rtol=1e-5, atol=1e-5)
        close(b, -LR * np.sum(mean_b, 0))
        (w1, w2), kept = out['topk']
        if n == 1:
            # One rank outside an elastic job reduces nothing: the compressors are not called.
            assert (steps, q_names, residual_names, kept) == (0, [], [], {})
            close(w1, -LR * topk_grads(0, 0))
            close(w2, -LR * (topk_grads(0, 0) + topk_grads(0, 1)))
        else:
            assert steps == 3
            assert len(q_names) == 1 and q_names[0].endswith('.0.w') and residual_names == q_names, q_names
            close(w1, -LR * sums[0])
            close(w2, -LR * (sums[0] + sums[1]))
            (name, residual), = kept.items()
            assert name.endswith('.0.w'), name
            close(residual, residuals[rank])
        if backend == 'tensorflow' and n > 1:
            assert out['graph_error'] is not None and 'runs eagerly only' in out['graph_error'], out['graph_error']
        kernel, bias = out['fit']
        close(kernel, W0 - LR * np.mean([g[0] for g in one], 0))
        close(bias, B0 - LR * np.mean([g[1] for g in one], 0))
        # Rank 0's step and factors on every rank, no residuals; a reset empties them again.
        step, q, kept = out['synced']
        assert step == 10 and kept == {}, (step, kept)
        np.testing.assert_array_equal(q['layer'], np.zeros((2, 1), np.float32))
        assert out['after_reset'] == {}


def test_elastic_state_and_run(job):
    _, n, results = job('elastic')
    synced_w, synced_b = results[0]['synced'][0]
    np.testing.assert_array_equal(synced_w, W0)
    np.testing.assert_array_equal(synced_b, B0)
    trained = results[0]['after_fit'][2]
    for out in results:
        assert 'build' in out['unbuilt']
        (w, b), epoch = out['synced']
        np.testing.assert_array_equal(w, W0)
        np.testing.assert_array_equal(b, B0)
        assert epoch == 0  # rank 0's value
        for restored, synced in zip(out['restored'], (W0, B0), strict=True):
            np.testing.assert_array_equal(restored, synced)
        epoch, batch, weights = out['after_fit']
        assert (epoch, batch) == (2, 0)
        for mine, rank0 in zip(weights, trained, strict=True):
            np.testing.assert_array_equal(mine, rank0)
        # Committed at the last epoch end: restore gives the trained weights back.
        for restored, mine in zip(out['restored_after_fit'], weights, strict=True):
            np.testing.assert_array_equal(restored, mine)
        # The first attempt failed after changing the state; the retry starts from the commit.
        attempts, run_weights, average, size = out['run']
        assert attempts == [2, 2]
        for got, mine in zip(run_weights, weights, strict=True):
            np.testing.assert_array_equal(got, mine)
        assert size == n and average == pytest.approx((n + 1) / 2.0)
