"""The project's shared collective test body (horovod_testing.collectives), run through
horovod.torch with a torch tensor adapter, at 1, 2 and 3 ranks."""

import numpy as np
import pytest
import torch
from horovod_testing import run_ranks
from horovod_testing.collectives import run_collective_suite


class TorchAdapter:
    """Runs the shared checks through horovod.torch's public functions on CPU tensors."""

    allreduce_dtypes = ['int32', 'int64', 'float16', 'bfloat16', 'float32', 'float64']
    gather_dtypes = ['uint8', 'int8', 'int16', 'int32', 'int64', 'float16', 'bfloat16', 'float32',
                     'float64', 'bool']

    def __init__(self):
        import horovod.torch as hvd
        self.hvd = hvd

    def init(self):
        self.hvd.init()

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

    def allreduce(self, tensor, op, prescale, postscale, name, inplace):
        fn = self.hvd.allreduce_ if inplace else self.hvd.allreduce
        return fn(tensor, name=name, op=op, prescale_factor=prescale, postscale_factor=postscale)

    def grouped_allreduce(self, tensors, op, name, inplace):
        fn = self.hvd.grouped_allreduce_ if inplace else self.hvd.grouped_allreduce
        return fn(tensors, name=name, op=op)

    def allgather(self, tensor, name):
        return self.hvd.allgather(tensor, name=name)

    def broadcast(self, tensor, root_rank, name, inplace):
        fn = self.hvd.broadcast_ if inplace else self.hvd.broadcast
        return fn(tensor, root_rank, name=name)


@pytest.mark.parametrize('np_', [1, 2, 3])
def test_shared_collective_suite(np_):
    results = run_ranks(np_, run_collective_suite, TorchAdapter)
    for counts in results:
        assert counts == results[0]
        assert all(cases > 0 for cases in counts.values()), counts
