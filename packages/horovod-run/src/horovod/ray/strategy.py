"""Where the workers go: Ray placement groups and one actor per rank.

* :class:`PGStrategy` (``num_workers``): a ``PACK`` placement group of one bundle per worker, or
  the placement group the caller runs in.
* :class:`ColocatedStrategy` (``num_hosts`` x ``num_workers_per_host``): a ``STRICT_SPREAD``
  placement group of one bundle per host; bundle ``b`` holds ranks ``b * num_workers_per_host``
  to ``(b + 1) * num_workers_per_host - 1``.

Actors are created in rank order, and rank ``i`` is the ``i``-th actor created.
"""

import collections
import logging
from typing import Dict, List, Optional, Tuple

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from horovod.ray.utils import map_blocking
from horovod.ray.worker import BaseHorovodWorker

logger = logging.getLogger(__name__)


def _format_resources(resources: Dict[str, float]) -> str:
    return "{%s}" % ", ".join("%s: %g" % (k, v) for k, v in sorted(resources.items())
                              if not k.startswith("node:") and not k.endswith("memory"))


def create_placement_group(resources_per_bundle: Dict[str, float], num_bundles: int, pg_timeout: float,
                           pg_strategy: str) -> Tuple[PlacementGroup, List[Dict[str, float]]]:
    """Create a placement group of ``num_bundles`` bundles of ``resources_per_bundle`` with
    ``pg_strategy`` and wait up to ``pg_timeout`` seconds for it; return ``(pg, bundles)``.

    Raises:
        TimeoutError: the group was not placed in time (it is removed). The message gives what was
            requested and what the cluster has available.
        ValueError: a bundle asks for nothing.
    """
    resources = {k: v for k, v in resources_per_bundle.items() if v}
    if not resources:
        raise ValueError("a placement group bundle must ask for some resource, got %r"
                         % (resources_per_bundle,))
    bundles = [dict(resources) for _ in range(num_bundles)]
    pg = placement_group(bundles, strategy=pg_strategy)
    ready, _ = ray.wait([pg.ready()], timeout=pg_timeout)
    if not ready:
        available = ray.available_resources()
        total = ray.cluster_resources()
        remove_placement_group(pg)
        requested = collections.Counter()
        for bundle in bundles:
            requested.update(bundle)
        raise TimeoutError(
            "Placement group creation timed out after %g s: Ray could not place %d bundle(s) of %s "
            "with strategy %s (%s in all%s). The cluster has %s available of %s in total (%d alive "
            "node(s)). Make more resources available (add nodes, or let the autoscaler add them), "
            "ask for fewer workers or resources, or raise placement_group_timeout_s."
            % (pg_timeout, num_bundles, _format_resources(resources), pg_strategy,
               _format_resources(dict(requested)),
               ", on %d different nodes" % num_bundles if pg_strategy == "STRICT_SPREAD" else "",
               _format_resources(available), _format_resources(total),
               sum(1 for n in ray.nodes() if n.get("Alive", n.get("alive")))))
    return pg, bundles


class BaseStrategy:
    """Creates the placement group (or uses the caller's) and the workers; releases them."""

    def __init__(self, settings, num_workers: int, use_gpu: bool, cpus_per_worker: float,
                 gpus_per_worker: int):
        self.settings = settings
        self.num_workers = num_workers
        self.use_gpu = use_gpu
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = gpus_per_worker
        self._created_placement_group = None
        self.placement_group = None
        self.workers: List = []

    def _bundle_index(self, rank: int) -> int:
        raise NotImplementedError

    def _make_placement_group(self):
        raise NotImplementedError

    def create_workers(self) -> List:
        """Create the placement group (unless one is given) and one actor per rank, in rank order."""
        self._make_placement_group()
        remote_cls = ray.remote(BaseHorovodWorker)
        for rank in range(self.num_workers):
            strategy = PlacementGroupSchedulingStrategy(
                self.placement_group, placement_group_bundle_index=self._bundle_index(rank),
                placement_group_capture_child_tasks=False)
            worker = remote_cls.options(
                num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker * int(self.use_gpu),
                scheduling_strategy=strategy).remote(world_rank=rank, world_size=self.num_workers)
            self.workers.append(worker)
        return self.workers

    def gpu_env(self, node_ids: List[str]) -> List[Dict[str, str]]:
        """Per rank: ``CUDA_VISIBLE_DEVICES`` = the GPUs Ray gave the workers of its node (empty
        dicts without GPUs)."""
        if not self.use_gpu:
            return [{} for _ in self.workers]
        gpu_ids = map_blocking(lambda w: w.get_gpu_ids.remote(), self.workers)
        by_node = collections.defaultdict(set)
        for node, ids in zip(node_ids, gpu_ids, strict=True):
            by_node[node].update(ids)
        self._check_gpus(node_ids, gpu_ids)
        return [{"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in sorted(by_node[node]))}
                for node in node_ids]

    def _check_gpus(self, node_ids, gpu_ids):
        pass

    def shutdown(self):
        """Kill the workers and remove the placement group if this strategy created it."""
        for worker in self.workers:
            try:
                ray.kill(worker)
            except Exception:  # already dead, or Ray is gone
                pass
        self.workers = []
        if self._created_placement_group is not None:
            try:
                remove_placement_group(self._created_placement_group)
            except Exception:
                pass
            self._created_placement_group = None
        self.placement_group = None


class PGStrategy(BaseStrategy):
    """``num_workers`` workers in a ``PACK`` placement group of one bundle each, or anywhere in
    ``placement_group`` (the caller's) when it is given."""

    def __init__(self, settings, num_workers: int, use_gpu: bool, cpus_per_worker: float,
                 gpus_per_worker: int, placement_group: Optional[PlacementGroup] = None):
        super().__init__(settings, num_workers, use_gpu, cpus_per_worker, gpus_per_worker)
        self._given_placement_group = placement_group

    def _make_placement_group(self):
        if self._given_placement_group is not None:
            logger.info("horovod.ray: the workers go into the placement group this code runs in; pass "
                        "use_current_placement_group=False to RayExecutor to make a new one instead")
            self.placement_group = self._given_placement_group
            return
        self.placement_group, _ = create_placement_group(
            {"CPU": self.cpus_per_worker, "GPU": self.gpus_per_worker * int(self.use_gpu)},
            self.num_workers, self.settings.placement_group_timeout_s, "PACK")
        self._created_placement_group = self.placement_group

    def _bundle_index(self, rank: int) -> int:
        return -1 if self._created_placement_group is None else rank


class ColocatedStrategy(BaseStrategy):
    """``num_workers_per_host`` workers on each of ``num_hosts`` different Ray nodes."""

    def __init__(self, settings, num_hosts: int, num_workers_per_host: int, use_gpu: bool,
                 cpus_per_worker: float, gpus_per_worker: int):
        super().__init__(settings, num_hosts * num_workers_per_host, use_gpu, cpus_per_worker,
                         gpus_per_worker)
        self.num_hosts = num_hosts
        self.num_workers_per_host = num_workers_per_host

    def _make_placement_group(self):
        self.placement_group, _ = create_placement_group(
            {"CPU": self.cpus_per_worker * self.num_workers_per_host,
             "GPU": self.gpus_per_worker * self.num_workers_per_host * int(self.use_gpu)},
            self.num_hosts, self.settings.placement_group_timeout_s, "STRICT_SPREAD")
        self._created_placement_group = self.placement_group

    def _bundle_index(self, rank: int) -> int:
        return rank // self.num_workers_per_host

    def _check_gpus(self, node_ids, gpu_ids):
        by_node = collections.defaultdict(list)
        for node, ids in zip(node_ids, gpu_ids, strict=True):
            by_node[node].extend(ids)
        for node, ids in by_node.items():
            if len(set(ids)) != len(ids) or len(ids) != self.num_workers_per_host * self.gpus_per_worker:
                raise RuntimeError("Ray gave the workers on node %s the GPUs %s: expected %d distinct ids"
                                   % (node, ids, self.num_workers_per_host * self.gpus_per_worker))
