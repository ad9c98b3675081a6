"""Every collective, eagerly and inside tf.function, against numpy references (the shared suite),
their registered gradients, process sets and join; see workers.py for the bodies."""


def test_import_does_not_import_other_frameworks(result):
    _, values = result('import_without_torch')
    assert values == [{'torch_imported': False, 'mxnet_imported': False}] * len(values)


def test_shared_collective_suite_eager_and_graph(result):
    n, values = result('collectives')
    assert len(values) == n
    for counts in values:
        assert counts == values[0]
        for mode in ('eager', 'graph'):
            assert counts[mode] and all(c > 0 for c in counts[mode].values()), counts
            assert 'check_alltoall' in counts[mode] and 'check_grouped_reducescatter' in counts[mode]


def test_gradients_of_every_op(result):
    n, values = result('gradients')
    # 2 allreduce ops, grouped, 2 allgathers, broadcast, alltoall, 2 reducescatters; eager + graph.
    assert values == [2 * 9] * n


def test_outputs_are_64_byte_aligned(result):
    _, values = result('alignment')
    assert all(v == [0, 0] for v in values), values


def test_reduce_eager_and_graph(result):
    n, values = result('reduce')
    for value in values:
        assert value['checked'] == 2 * n
        assert 'not a member of process set' in value['refused'], value['refused']


def test_bfloat16_bit_for_bit(result):
    """bfloat16 tensors reduce to numpy's float32 reduction rounded once, eagerly and in
    tf.function (where they reach the engine as numpy arrays); the body checked the moves."""
    from horovod_testing.bfloat16 import check
    _, values = result('bfloat16')
    for mode in ('eager', 'graph'):
        check([value[mode] for value in values])


def test_stateful_compression(result):
    """PowerSGD, TopK and Cast through the tape and the optimizer, eagerly (the body compared
    them with numpy references and checked the refusal inside tf.function)."""
    _, values = result('stateful_compression')
    assert values == [{'powersgd': 40, 'topk': 1, 'optimizer_step': 1, 'elastic_state': 2}] * len(values), values


def test_dynamic_process_sets(result):
    n, values = result('process_sets')
    if n == 1:
        assert values == [None]
        return
    for counts in values:
        assert counts['registry'] == 8 and counts['concurrent'] == 40, counts
        assert counts['member_ops'] + counts['non_member_ops'] > 0, counts
    # Ranks 0 and n - 1 (n > 2), or rank 1 alone (n = 2), ran the graph-mode ops on a set.
    members = [0, n - 1] if n > 2 else [n - 1]
    assert [c['graph_member_ops'] for c in values] == [3 if r in members else 0 for r in range(n)]


def test_join(result):
    n, values = result('join')
    if n == 1:
        assert values == [None]
        return
    for last, cases, _ in values:
        assert last == n - 1 and cases > 0, values
    assert len({second for _, _, second in values}) == 1 and values[0][2] in range(1, n)
