"""A job of horovod_testing.run_ranks leaves nothing in the temporary folder: neither its own
files nor what the ranks make with tempfile, whether the ranks succeed or fail."""

import os
import tempfile

import pytest

from horovod_testing import RanksFailed, run_ranks


def _make_temporary_files(fail_rank):
    import horovod.common as hvd_common  # noqa: F401 - a real rank imports the core
    folder = tempfile.mkdtemp(prefix='left-by-rank-')
    with open(os.path.join(folder, 'data'), 'w') as f:
        f.write('x')
    rank = int(os.environ['HOROVOD_RANK'])
    if rank == fail_rank:
        raise RuntimeError(f'rank {rank} fails on purpose')
    return folder


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """tempfile's folder (this process's and the ranks') is an empty folder of the test's."""
    folder = tmp_path / 'tmp'
    folder.mkdir()
    monkeypatch.setenv('TMPDIR', str(folder))
    monkeypatch.setattr(tempfile, 'tempdir', None)  # gettempdir() caches its answer
    return folder


@pytest.mark.parametrize('np_', [2, 3])
def test_run_ranks_leaves_nothing(private_tmp, np_):
    folders = run_ranks(np_, _make_temporary_files, -1)
    assert len(set(folders)) == np_
    for folder in folders:
        assert not os.path.exists(folder)
    assert list(private_tmp.iterdir()) == []


def test_run_ranks_leaves_nothing_when_a_rank_fails(private_tmp):
    with pytest.raises(RanksFailed, match='rank 1 fails on purpose'):
        run_ranks(2, _make_temporary_files, 1)
    assert list(private_tmp.iterdir()) == []


def test_run_ranks_leaves_nothing_when_the_payload_fails(private_tmp):
    with pytest.raises(Exception):  # noqa: B017 - whatever pickling raises
        run_ranks(2, lambda lock: None, __import__('threading').Lock())
    assert list(private_tmp.iterdir()) == []
