"""A sampler that partitions a dataset over the current ranks and resumes mid-epoch."""

import math
import random

import torch.utils.data

from horovod.torch.mpi_ops import rank, size


class ElasticSampler(torch.utils.data.Sampler):
    """Splits the not-yet-processed indices of an epoch evenly over the ranks.

    After a reset (ranks added or removed) the samples already processed in this epoch, as
    recorded by :meth:`record_batch`, are skipped and the rest is repartitioned over the new
    world size. Each rank gets ``ceil(remaining / size)`` indices; the remaining list is padded by
    repeating its head so that every rank gets the same number.

    Args:
        dataset: any object with ``len()``.
        shuffle (bool): shuffle the indices each epoch with ``random.Random(seed + epoch)``.
        seed (int): base seed; must be the same on every rank.

    Raises:
        ValueError: from ``size()``/``rank()`` if Horovod is not initialised.
    """

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices = set()
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self.processed_num = 0
        self.reset()

    def set_epoch(self, epoch):
        """Starts epoch ``epoch`` (int) from its beginning."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Records that every rank processed one more batch of ``batch_size`` samples.

        Args:
            batch_idx (int): index of the batch in the epoch (unused; kept for the upstream API).
            batch_size (int): samples per rank in that batch.
        """
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self):
        """Returns ``{'epoch': int, 'processed_num': int}``."""
        return dict(epoch=self.epoch, processed_num=self.processed_num)

    def load_state_dict(self, state_dict):
        """Restores the epoch and progress from :meth:`state_dict` output, then repartitions."""
        self.epoch = state_dict['epoch']
        self.processed_num = state_dict['processed_num']
        self.reset()

    def reset(self):
        """Re-reads the world size and rank and recomputes this rank's share of the epoch."""
        self.num_replicas = size()
        self.rank = rank()

        indices = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(indices)
        self.remaining_indices = indices[self.processed_num:]

        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        indices = list(self.remaining_indices)
        padding = self.total_size - len(indices)
        while padding > 0 and indices:
            head = indices[:padding]
            indices += head
            padding -= len(head)
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self):
        return self.num_samples
