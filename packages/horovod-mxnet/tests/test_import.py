"""Importing horovod.mxnet imports no other framework, and exports the upstream surface."""

import subprocess
import sys

# Runs in a fresh interpreter: a finder placed first on sys.meta_path records (and refuses)
# every attempt to import torch or tensorflow, installed or not.
PROBE = r'''
import sys

attempts = []


class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'tensorflow', 'keras', 'jax'):
            attempts.append(name)
            raise ImportError(f'{name} refused by the test')
        return None


sys.meta_path.insert(0, Refuse())
import horovod.mxnet as hvd
import horovod.mxnet.mpi_ops

names = ['init', 'shutdown', 'size', 'rank', 'local_rank', 'local_size', 'cross_rank',
         'cross_size', 'is_initialized', 'mpi_built', 'gloo_built', 'nccl_built', 'ProcessSet',
         'global_process_set', 'add_process_set', 'remove_process_set', 'Average', 'Sum',
         'Adasum', 'Min', 'Max', 'Product', 'Compression', 'allreduce', 'allreduce_',
         'grouped_allreduce', 'grouped_allreduce_', 'allgather', 'grouped_allgather',
         'broadcast', 'broadcast_', 'alltoall', 'reducescatter', 'grouped_reducescatter',
         'broadcast_object', 'allgather_object', 'DistributedOptimizer', 'DistributedTrainer',
         'broadcast_parameters']
missing = [n for n in names if not hasattr(hvd, n)]
extra = [hasattr(hvd.mpi_ops, 'handle_average_backwards_compatibility'),
         hasattr(hvd.mpi_ops._basics, '_get_process_set_ids_and_ranks'),
         hvd.Compression.fp16 is not hvd.Compression.none]
import mxnet as mx
try:
    hvd.Compression.bf16.compress(mx.nd.ones((2,)))
    extra.append('bf16 compress did not raise')
except ValueError as error:
    extra.append('no bfloat16' in str(error) or str(error))
print(attempts, missing, extra)
'''


def test_import_alone_and_surface():
    done = subprocess.run([sys.executable, '-c', PROBE], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == '[] [] [True, True, True, True]', done.stdout + done.stderr
