"""The project's shared collective, join and process-set test bodies (horovod_testing), run
through horovod.torch with a torch tensor adapter."""

import numpy as np
import pytest
import torch
from horovod_testing import run_ranks
from horovod_testing.collectives import run_collective_suite, run_join_suite
from horovod_testing.process_sets import run_process_set_suite, run_static_process_set_suite


class TorchAdapter:
    """Runs the shared checks through horovod.torch's public functions on CPU tensors."""

    allreduce_dtypes = ['int32', 'int64', 'float16', 'bfloat16', 'float32', 'float64']
    gather_dtypes = ['uint8', 'int8', 'int16', 'int32', 'int64', 'float16', 'bfloat16', 'float32',
                     'float64', 'bool']

    reducescatter_dtypes = ['int32', 'int64', 'float16', 'bfloat16', 'float32', 'float64']
    alltoall_dtypes = gather_dtypes

    def __init__(self):
        import horovod.torch as hvd
        self.hvd = hvd

    def init(self, process_sets=None):
        self.hvd.init(process_sets=process_sets)

    def shutdown(self):
        self.hvd.shutdown()

    def add_process_set(self, ranks):
        return self.hvd.add_process_set(ranks)

    def remove_process_set(self, process_set):
        return self.hvd.remove_process_set(process_set)

    def rank(self):
        return self.hvd.rank()

    def size(self):
        return self.hvd.size()

    def tensor(self, array, dtype):
        return torch.from_numpy(np.array(array)).to(getattr(torch, dtype))

    def to_numpy(self, tensor):
        tensor = tensor.detach()
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.float()  # exact: every bfloat16 value is a float32 value
        return tensor.numpy()

    def _set(self, process_set):
        return self.hvd.global_process_set if process_set is None else process_set

    def allreduce(self, tensor, op, prescale, postscale, name, inplace, process_set=None):
        fn = self.hvd.allreduce_ if inplace else self.hvd.allreduce
        return fn(tensor, name=name, op=op, prescale_factor=prescale, postscale_factor=postscale,
                  process_set=self._set(process_set))

    def grouped_allreduce(self, tensors, op, name, inplace, process_set=None):
        fn = self.hvd.grouped_allreduce_ if inplace else self.hvd.grouped_allreduce
        return fn(tensors, name=name, op=op, process_set=self._set(process_set))

    def allgather(self, tensor, name, process_set=None):
        return self.hvd.allgather(tensor, name=name, process_set=self._set(process_set))

    def grouped_allgather(self, tensors, name, process_set=None):
        return self.hvd.grouped_allgather(tensors, name=name, process_set=self._set(process_set))

    def broadcast(self, tensor, root_rank, name, inplace, process_set=None):
        fn = self.hvd.broadcast_ if inplace else self.hvd.broadcast
        return fn(tensor, root_rank, name=name, process_set=self._set(process_set))

    def alltoall(self, tensor, splits, name, process_set=None):
        # Through the handle so that the received splits come back with splits=None too.
        handle = self.hvd.alltoall_async(tensor, splits, name=name,
                                         process_set=self._set(process_set))
        return self.hvd.synchronize(handle)

    def reducescatter(self, tensor, op, name, process_set=None, prescale=1.0, postscale=1.0):
        return self.hvd.reducescatter(tensor, name=name, op=op, process_set=self._set(process_set),
                                      prescale_factor=prescale, postscale_factor=postscale)

    def grouped_reducescatter(self, tensors, op, name, process_set=None):
        return self.hvd.grouped_reducescatter(tensors, name=name, op=op,
                                              process_set=self._set(process_set))

    def barrier(self, process_set=None):
        self.hvd.barrier(process_set=self._set(process_set))

    def join(self):
        return self.hvd.join()


@pytest.mark.parametrize('np_', [1, 2, 3, 4])
def test_shared_collective_suite(np_):
    results = run_ranks(np_, run_collective_suite, TorchAdapter)
    for counts in results:
        assert counts == results[0]
        assert all(cases > 0 for cases in counts.values()), counts


@pytest.mark.parametrize('np_', [2, 3])
def test_shared_join_suite(np_):
    results = run_ranks(np_, run_join_suite, TorchAdapter, timeout=180)
    for last, cases, _ in results:
        # Rank r joins after 2r steps, so the last rank joins last.
        assert last == np_ - 1, results
        assert cases > 0
    assert len({second for _, _, second in results}) == 1 and results[0][2] in range(1, np_)


@pytest.mark.parametrize('np_', [2, 3, 4])
def test_shared_dynamic_process_set_suite(np_):
    results = run_ranks(np_, run_process_set_suite, TorchAdapter, timeout=240)
    for counts in results:
        assert counts['registry'] == 8 and counts['concurrent'] == 40, counts
        assert counts['member_ops'] + counts['non_member_ops'] > 0, counts


@pytest.mark.parametrize('np_', [2, 3])
def test_shared_static_process_set_suite(np_):
    results = run_ranks(np_, run_static_process_set_suite, TorchAdapter, timeout=240)
    for counts in results:
        assert counts['registry'] == 6, counts
        assert counts['member_ops'] > 50 and counts['non_member_ops'] == 6, counts
