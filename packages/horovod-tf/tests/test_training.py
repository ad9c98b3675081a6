"""Tapes, optimizers, the TF1 hook, variable and object broadcast, SyncBatchNormalization, and
error cases; see workers.py for the bodies (which compare with references and raise)."""


def test_distributed_gradient_tape(result):
    n, values = result('tape')
    for v in values:
        # The allgather path keeps IndexedSlices; sparse_as_dense makes them dense.
        assert v['average.eager'] and v['average.graph'] and not v['sparse_as_dense.graph'], v
        assert v['py_nodes.None'] == 2 and v['py_nodes.2'] == 4, v


def test_distributed_optimizer(result):
    n, values = result('optimizer')
    for v in values:
        assert v == {'eager.iterations': 2, 'graph.iterations': 2, 'fit_identical': True, 'legacy': True}, v


def test_objects_variables_and_runtime_ops(result):
    n, values = result('objects_and_variables')
    assert [v[:2] for v in values] == [[r, n] for r in range(n)]


def test_sync_batch_normalization(result):
    n, values = result('sync_batch_norm')
    assert values == [True] * n


def test_errors(result):
    n, values = result('errors')
    for v in values:
        assert v['after'] is True
        assert v['xla'] == 'ValueError' and v['sparse_adasum'] == 'NotImplementedError'
        assert v['adasum'] == {1: [1.0, 0.0], 2: [1.0, 1.0], 3: 'NotImplementedError'}[n], v
        if n > 1:
            assert v['is_internal_error'] is True
            assert v['eager_mismatch'] == 'FailedPreconditionError'
            assert v['root_mismatch'] == 'FailedPreconditionError'
            assert v['graph_mismatch'] == 'FailedPreconditionError', v


def test_elastic_state_and_run(result):
    n, values = result('elastic')
    assert values == [([(0, 0.0), (1, 1.0)], 4, 0)] * n


def test_error_types_in_every_mode(result):
    n, values = result('error_types')
    if n == 1:
        assert values == [None]
        return
    for rank, seen in enumerate(values):
        # 15 mismatches, 5 refused arguments (+1 on the ranks outside the set [0]).
        assert len(seen) == 20 + (rank != 0), seen
        for case, modes in seen.items():
            assert set(modes) == {'eager', 'function', 'session'}, (case, modes)
            expected = 'InvalidArgumentError' if case in (
                'broadcast_root_outside', 'alltoall_splits_sum', 'alltoall_splits_negative',
                'alltoall_splits_tensor', 'unknown_process_set', 'outside_process_set') else 'FailedPreconditionError'
            assert set(modes.values()) == {expected}, (case, modes)


def test_indexed_slices_average_every_dtype(result):
    n, values = result('sparse_average')
    # 7 dtypes x (alone, mixed with a dense tensor) x (eager, tf.function, TF1 session).
    assert values == [7 * 2 * 3] * n
