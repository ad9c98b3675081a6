"""The Lightning cluster environment of a Horovod job."""

import os

import torch
from lightning.fabric.plugins.environments import ClusterEnvironment
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning_utilities.core.rank_zero import rank_zero_only as utils_rank_zero_only

import horovod.torch as hvd
from horovod.lightning import _collectives


def init_horovod():
    """Starts Horovod once (``hvd.init()`` is idempotent) and points Lightning's rank-zero
    helpers at this rank."""
    hvd.init()
    rank_zero_only.rank = utils_rank_zero_only.rank = hvd.rank()


class HorovodEnvironment(ClusterEnvironment):
    """Ranks and sizes as Horovod sees them: processes are started outside Lightning (by
    ``horovodrun``, ``horovod.ray`` or ``horovod.spark.run``), one per device; Lightning's
    node is Horovod's host (``node_rank`` is ``hvd.cross_rank()``)."""

    @property
    def creates_processes_externally(self):
        return True

    @property
    def main_address(self):
        return os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1")

    @property
    def main_port(self):
        return int(os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT", "0"))

    @staticmethod
    def detect():
        return "HOROVOD_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ or "PMI_RANK" in os.environ

    def world_size(self):
        init_horovod()
        return hvd.size()

    def set_world_size(self, size):
        """Horovod decides the world size; Lightning's request is ignored."""

    def global_rank(self):
        init_horovod()
        return hvd.rank()

    def set_global_rank(self, rank):
        """Horovod decides the rank; Lightning's request is ignored."""

    def local_rank(self):
        init_horovod()
        return hvd.local_rank()

    def node_rank(self):
        init_horovod()
        return hvd.cross_rank()

    def validate_settings(self, num_devices, num_nodes):
        if num_devices != 1:
            raise ValueError("Horovod runs one process per device: use devices=1 and start N processes with "
                             f"`horovodrun -np N python train.py`; got devices={num_devices}")


class HorovodRanks:
    """What the Trainer's and Fabric's Horovod strategies share (a mixin placed before
    Lightning's ``ParallelStrategy``): one device per rank, ``cuda:hvd.local_rank()`` on GPUs;
    ``DistributedSampler`` over ``hvd.size()`` ranks; Horovod started at environment set-up;
    ``all_gather``, ``broadcast`` and ``barrier`` as Horovod collectives.

    Raises:
        ValueError: (at set-up) ``devices`` other than 1.
    """

    @property
    def is_distributed(self):
        return True

    @property
    def root_device(self):
        devices = self.parallel_devices or [torch.device("cpu")]
        if devices[0].type == "cuda":
            return torch.device("cuda", self.local_rank)
        return devices[0]

    @property
    def distributed_sampler_kwargs(self):
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def setup_environment(self):
        """Starts Horovod, checks one device per process, then Lightning's own set-up."""
        init_horovod()
        self.cluster_environment.validate_settings(len(self.parallel_devices or [None]), 1)
        super().setup_environment()

    def all_gather(self, tensor, group=None, sync_grads=False):
        """Every rank's ``tensor`` (same shape on every rank), stacked: shape ``(size, *shape)``."""
        return _collectives.all_gather(tensor, sync_grads)

    def broadcast(self, obj, src=0):
        """Rank ``src``'s picklable ``obj`` on every rank."""
        return _collectives.broadcast(obj, src)

    def barrier(self, name=None):
        """Waits until every rank reached it."""
        _collectives.barrier()
