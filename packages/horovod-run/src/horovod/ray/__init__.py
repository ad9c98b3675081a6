"""Horovod on a Ray cluster: :class:`RayExecutor` places one Ray actor per Horovod rank and runs
functions on all of them (docs/ray.md).

Ray is an optional extra of horovod-run: ``pip install "horovod-run[ray]"``. Static jobs
(``num_workers``, or ``num_hosts`` x ``num_workers_per_host``) and elastic ones
(``RayExecutor(settings, min_workers=..., max_workers=...)``; the older
:class:`~horovod.ray.elastic.ElasticRayExecutor` is deprecated).
"""

try:
    import ray  # noqa: F401
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # noqa: F401
except ImportError as e:
    raise ImportError(
        'horovod.ray needs Ray 2.10 or newer, an optional extra of horovod-run: '
        'pip install "horovod-run[ray]" (could not import it: %s)' % e) from e

from horovod.ray.runner import RayExecutor  # noqa: E402
from horovod.ray.worker import BaseHorovodWorker  # noqa: E402
from horovod.ray.elastic import ElasticRayExecutor  # noqa: E402

__all__ = ["RayExecutor", "BaseHorovodWorker", "ElasticRayExecutor"]
