"""The first elastic Ray executor, :class:`ElasticRayExecutor` (deprecated: use
``RayExecutor(settings, min_workers=...)``, which it now drives).

Its settings are a launcher :class:`~horovod.runner.elastic.settings.ElasticSettings` and its
resources are counted per *slot*; both are translated to :class:`~horovod.ray.RayExecutor`'s
elastic mode (:mod:`horovod.ray.elastic_v2`).
"""

import os
import warnings
from typing import Any, Callable, List, Optional

from horovod.common.rendezvous import make_secret_key
from horovod.ray.elastic_v2 import ElasticAdapter, ElasticParams
from horovod.ray.elastic_v2 import RayHostDiscovery as _RayHostDiscoveryV2
from horovod.runner.common.util.timeout import Timeout
from horovod.runner.elastic.settings import ElasticSettings

_DEPRECATED = ("ElasticRayExecutor is deprecated since Horovod 0.25.0 and will be removed; use "
               "horovod.ray.RayExecutor(settings, min_workers=..., max_workers=...) instead")


class RayHostDiscovery(_RayHostDiscoveryV2):
    """:class:`horovod.ray.elastic_v2.RayHostDiscovery` with per-slot argument names.

    Args:
        use_gpu: count GPUs too.
        cpus_per_slot: CPUs of one slot (> 0).
        gpus_per_slot: GPUs of one slot (>= 1) with ``use_gpu``.
    """

    def __init__(self, use_gpu: bool = False, cpus_per_slot: float = 1, gpus_per_slot: Optional[int] = 1):
        super().__init__(use_gpu=use_gpu, cpus_per_worker=cpus_per_slot, gpus_per_worker=gpus_per_slot)


class ElasticRayExecutor:
    """Deprecated: an elastic Horovod job on a Ray cluster, one worker per slot.

    Args:
        settings: from :meth:`create_settings`.
        use_gpu: give each worker ``gpus_per_slot`` GPUs (default 1).
        cpus_per_slot: CPUs of one worker (> 0).
        gpus_per_slot: GPUs of one worker; only with ``use_gpu``.
        env_vars: extra environment variables of the workers (str values).
        override_discovery: discover the hosts from the Ray cluster (:class:`RayHostDiscovery`);
            False keeps ``settings.discovery``.

    Raises:
        ValueError: as :class:`~horovod.ray.RayExecutor`'s checks, with the per-slot names.
    """

    @staticmethod
    def create_settings(min_num_proc: int = 1, max_num_proc: Optional[int] = None, reset_limit: Optional[int] = None,
                        elastic_timeout: int = 600, timeout_s: int = 30, ssh_identity_file: Optional[str] = None,
                        nics: Optional[str] = None, min_np=None, max_np=None, **kwargs) -> ElasticSettings:
        """Settings of an :class:`ElasticRayExecutor`: a runner ``ElasticSettings`` with a new
        secret. ``min_np``/``max_np`` are deprecated aliases (``DeprecationWarning``) of
        ``min_num_proc``/``max_num_proc``; ``timeout_s`` is the workers' start timeout (seconds);
        ``ssh_identity_file`` defaults to ``~/ray_bootstrap_key.pem``.

        Args:
            min_num_proc (int): the fewest workers the job runs with.
            max_num_proc (int): the most workers; None for as many as slots are discovered.
            reset_limit (int): how many times the job may be reset; None for no limit.
            elastic_timeout (int): seconds to wait for ``min_num_proc`` slots after a reset.
            timeout_s (int): the workers' start timeout, seconds.
            ssh_identity_file (str): the key of the Ray nodes' ssh.
            nics (str or set): the network interfaces the workers use; None for all.
            min_np, max_np: deprecated aliases of ``min_num_proc`` and ``max_num_proc``.
            **kwargs: other fields of ``ElasticSettings`` (e.g. ``verbose``, ``cooldown_range``).
        """
        if min_np is not None:
            warnings.warn("min_np is deprecated, use min_num_proc", DeprecationWarning, stacklevel=2)
            min_num_proc = min_np
        if max_np is not None:
            warnings.warn("max_np is deprecated, use max_num_proc", DeprecationWarning, stacklevel=2)
            max_num_proc = max_np
        if ssh_identity_file is None:
            ssh_identity_file = os.path.expanduser("~/ray_bootstrap_key.pem")
        if isinstance(nics, str):
            nics = {nics}
        start_timeout = Timeout(timeout_s, message="Timed out waiting for {activity}. Please check connectivity "
                                                   "between the Ray nodes, or raise timeout_s.")
        kwargs.setdefault("verbose", 1)
        return ElasticSettings(discovery=None, min_num_proc=min_num_proc, max_num_proc=max_num_proc,
                               elastic_timeout=elastic_timeout, reset_limit=reset_limit, num_proc=min_num_proc,
                               ssh_identity_file=ssh_identity_file, nics=nics, key=make_secret_key(),
                               start_timeout=start_timeout, **kwargs)

    def __init__(self, settings: ElasticSettings, use_gpu: bool = False, cpus_per_slot: int = 1,
                 gpus_per_slot: Optional[int] = None, env_vars: dict = None, override_discovery=True):
        warnings.warn(_DEPRECATED, DeprecationWarning, stacklevel=2)
        if gpus_per_slot is not None and not use_gpu:
            raise ValueError("gpus_per_slot=%r is set but use_gpu is False; set use_gpu=True to give workers GPUs"
                             % (gpus_per_slot,))
        if use_gpu and isinstance(gpus_per_slot, int) and gpus_per_slot < 1:
            raise ValueError("gpus_per_slot must be at least 1 when use_gpu is True, got %d" % gpus_per_slot)
        self.settings = settings
        self.params = ElasticParams(cpus_per_worker=cpus_per_slot, use_gpu=use_gpu, gpus_per_worker=gpus_per_slot,
                                    min_workers=settings.min_num_proc, max_workers=settings.max_num_proc,
                                    reset_limit=settings.reset_limit, elastic_timeout=settings.elastic_timeout,
                                    override_discovery=override_discovery)
        if override_discovery:
            settings.discovery = RayHostDiscovery(use_gpu=use_gpu, cpus_per_slot=cpus_per_slot,
                                                  gpus_per_slot=self.params.gpus_per_worker or 1)
        self.env_vars = dict(env_vars or {})
        self.adapter: Optional[ElasticAdapter] = None

    @property
    def driver(self):
        """The elastic driver of the job (after :meth:`start`), or None."""
        return self.adapter.driver if self.adapter is not None else None

    def start(self):
        """Start the rendezvous server and the driver; wait for ``min_num_proc`` slots (see
        :meth:`horovod.ray.RayExecutor.start`).

        Raises:
            RuntimeError: the executor is already started, or the driver could not start.
        """
        if self.adapter is not None:
            raise RuntimeError("the ElasticRayExecutor is already started")
        self.adapter = ElasticAdapter(self.settings, self.params)
        try:
            self.adapter.start(extra_env_vars=self.env_vars)
        except BaseException:
            self.adapter.shutdown()
            self.adapter = None
            raise

    def run(self, worker_fn: Callable[[], Any], callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """``worker_fn()`` on every worker, as :meth:`horovod.ray.RayExecutor.run` in elastic mode:
        the values of the last round's workers in rank order.

        Args:
            worker_fn: a function of no arguments, run on every worker.
            callbacks: functions called on the driver with every result a worker sends through
                ``horovod.ray.ray_logger``.

        Raises:
            RuntimeError: the executor is not started, or the job failed.
        """
        if self.adapter is None:
            raise RuntimeError("the ElasticRayExecutor is not started: call start() first")
        return self.adapter.run(worker_fn, callbacks=callbacks)

    def shutdown(self):
        """Stop the driver, the workers and the rendezvous server."""
        if self.adapter is not None:
            self.adapter.shutdown()
            self.adapter = None
