"""Elastic mode of :class:`~horovod.ray.RayExecutor` (``RayExecutor(settings, min_workers=...)``).

The launcher's elastic machinery does the work, unchanged: a
:class:`~horovod.runner.elastic.driver.ElasticDriver` polls a host discovery (by default
:class:`RayHostDiscovery`: the alive nodes of the Ray cluster and their CPUs/GPUs), assigns
slots, decides resets, blacklists the hosts of failed workers, and answers the workers through
the launcher's authenticated rendezvous server with the elastic handler
(:mod:`horovod.runner.elastic.rendezvous`). Where ``horovodrun`` starts a process per slot, this
adapter starts a Ray actor (:class:`~horovod.ray.worker.BaseHorovodWorker`) pinned to the slot's
Ray node, gives it the environment of an elastic ``horovodrun`` worker (``HOROVOD_ELASTIC=1``)
and runs the user's function in it. A training function written with ``hvd.elastic.run`` and a
state object (``horovod.common.elastic.State``) then survives workers and nodes coming and
going: survivors roll back to the last commit, new workers receive the state from rank 0.

Hosts are named by Ray node id (hex), not by IP: several Ray nodes may share one machine.
"""

import functools
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import ray
from ray.exceptions import GetTimeoutError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from horovod.common.rendezvous import SECRET_ENV
from horovod.ray import ray_logger
from horovod.ray.adapter import Adapter, BaseParams
from horovod.ray.utils import detect_nics
from horovod.ray.worker import BaseHorovodWorker
from horovod.runner import gloo_run
from horovod.runner.elastic.discovery import HostDiscovery, HostManager
from horovod.runner.elastic.driver import ElasticDriver
from horovod.runner.elastic.rendezvous import create_rendezvous_handler
from horovod.runner.http.http_server import RendezvousServer
from horovod.runner.util import network
from horovod.runner.common.util import env_names

logger = logging.getLogger(__name__)

# How often a worker's thread looks at its actor and at the driver's events (seconds).
POLL_INTERVAL_S = 0.1
# The least time a new worker actor gets to answer its first call (seconds); settings.timeout_s
# when larger.
PING_TIMEOUT_S = 10

# What a worker returns when the driver removed its slot (hvd.elastic.run exits with status 0).
_REMOVED = "__horovod_ray_worker_removed__"


def _alive(node: Dict[str, Any]) -> bool:
    return bool(node.get("Alive", node.get("alive", False)))


class RayHostDiscovery(HostDiscovery):
    """The hosts of an elastic job: the alive nodes of the Ray cluster.

    A node has ``CPU // cpus_per_worker`` slots, at most ``GPU // gpus_per_worker`` with
    ``use_gpu``; nodes without a slot are left out. A node is named by its Ray node id (hex; the
    ``NodeID`` of ``ray.nodes()``), or by its ``NodeManagerAddress`` when the entry has no id.
    Resources are the nodes' totals: other work on a node can make a slot wait for its CPUs.

    Args:
        use_gpu: count GPUs too.
        cpus_per_worker: CPUs of one slot (> 0).
        gpus_per_worker: GPUs of one slot (>= 1) with ``use_gpu``.

    Raises:
        ValueError: a non-positive ``cpus_per_worker``, or ``gpus_per_worker`` < 1 with ``use_gpu``.
    """

    def __init__(self, use_gpu: bool = False, cpus_per_worker: float = 1, gpus_per_worker: Optional[int] = 1):
        if not isinstance(cpus_per_worker, (int, float)) or cpus_per_worker <= 0:
            raise ValueError("an elastic Ray job needs cpus_per_worker > 0 to count the slots of a node, got %r"
                             % (cpus_per_worker,))
        if gpus_per_worker is None:
            gpus_per_worker = 1
        if use_gpu and (not isinstance(gpus_per_worker, (int, float)) or gpus_per_worker < 1):
            raise ValueError("gpus_per_worker must be at least 1 with use_gpu, got %r" % (gpus_per_worker,))
        self.use_gpu = use_gpu
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = gpus_per_worker
        # Of the last poll: host name -> Ray node id (hex) and -> node IP.
        self.node_ids: Dict[str, str] = {}
        self.node_ips: Dict[str, str] = {}

    def find_available_hosts_and_slots(self) -> Dict[str, int]:
        """``{host: slots}`` of the alive Ray nodes now (``ray.nodes()``, read once)."""
        host_slots, node_ids, node_ips = {}, {}, {}
        for node in ray.nodes():
            if not _alive(node):
                continue
            resources = node.get("Resources") or {}
            slots = int(resources.get("CPU", 0) // self.cpus_per_worker)
            if self.use_gpu:
                slots = min(slots, int(resources.get("GPU", 0) // self.gpus_per_worker))
            if slots <= 0:
                continue
            node_id = node.get("NodeID")
            host = node_id or node["NodeManagerAddress"]
            host_slots[host] = slots
            node_ips[host] = node.get("NodeManagerAddress", host)
            if node_id:
                node_ids[host] = node_id
        self.node_ids, self.node_ips = node_ids, node_ips
        return host_slots


@dataclass
class ElasticParams(BaseParams):
    """The elastic parameters of :class:`~horovod.ray.RayExecutor` (see its docstring)."""

    min_workers: int = 1
    max_workers: Optional[int] = None
    reset_limit: Optional[int] = None
    cooldown_range: Optional[Tuple[int, int]] = None
    elastic_timeout: int = 600
    override_discovery: bool = True

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.min_workers, bool) or not isinstance(self.min_workers, int) or self.min_workers < 1:
            raise ValueError("min_workers must be a positive integer, got %r" % (self.min_workers,))
        if self.max_workers is not None and (isinstance(self.max_workers, bool) or not isinstance(self.max_workers, int)
                                             or self.max_workers < self.min_workers):
            raise ValueError("max_workers must be an integer of at least min_workers=%d, got %r"
                             % (self.min_workers, self.max_workers))
        if self.reset_limit is not None and (not isinstance(self.reset_limit, int) or self.reset_limit < 0):
            raise ValueError("reset_limit must be a non-negative integer or None, got %r" % (self.reset_limit,))
        if self.cooldown_range is not None:
            if len(self.cooldown_range) != 2:
                raise ValueError("cooldown_range must be (lower, upper) in seconds, got %r" % (self.cooldown_range,))
            HostManager(None, tuple(self.cooldown_range))  # raises ValueError on bad bounds
        if self.cpus_per_worker <= 0:
            raise ValueError("an elastic Ray job needs cpus_per_worker > 0, got %r" % (self.cpus_per_worker,))

    @property
    def elastic(self) -> bool:
        return True


def _elastic_call(fn, args, kwargs, on_executable, executable):
    """In the actor: run the user's function; ``(rank at the end, value)`` or :data:`_REMOVED`."""
    try:
        value = fn(executable) if on_executable else fn(*args, **kwargs)
    except SystemExit as e:
        if not e.code:
            return _REMOVED  # hvd.elastic.run: the driver removed this worker's slot
        raise
    return int(os.environ.get(env_names.RANK, "-1")), value


class ElasticAdapter(Adapter):
    """Elastic mode: workers started and stopped by the launcher's elastic driver.

    ``start()`` starts the rendezvous server and the driver, waits for ``min_workers`` slots (and 2
    hosts unless ``settings.nics`` is given, to find the network interfaces) and chooses the
    interfaces. Each ``run``/``execute`` is one elastic job: it ends when every worker of the
    last round has returned, or when the driver gives up (reset limit, no slots for
    ``elastic_timeout``, every worker failed).
    """

    def __init__(self, settings, params: ElasticParams):
        self.settings = settings
        self.params = params
        self.discovery = getattr(settings, "discovery", None)
        if self.discovery is None:
            raise ValueError("an elastic Ray job needs settings.discovery (a HostDiscovery) when "
                             "override_discovery is False")
        self.driver: Optional[ElasticDriver] = None
        self.rendezvous: Optional[RendezvousServer] = None
        self.run_vars: Optional[Dict[str, str]] = None
        self.nics: Optional[List[str]] = None
        self._started = False
        self._executable = (None, None, None)
        self._extra_env_vars: Dict[str, str] = {}
        self._lock = threading.Lock()
        self._actors: Dict[Tuple[str, int], Any] = {}
        self._gpu_ids: Dict[Tuple[str, int], List[int]] = {}
        self._values: Dict[str, Tuple[int, Any]] = {}
        self._errors: Dict[str, str] = {}
        self._call = None
        self._pump = None

    # --- set-up -------------------------------------------------------------------------------

    def _verbose(self) -> int:
        return self.settings.verbose or 0

    def _timeout_s(self) -> float:
        timeout = getattr(self.settings, "timeout_s", None)
        if timeout is None:
            start_timeout = getattr(self.settings, "start_timeout", None)
            timeout = getattr(start_timeout, "seconds", None) or 0
        return max(PING_TIMEOUT_S, timeout)

    def _pinning(self, host: str) -> Dict[str, Any]:
        node_id = getattr(self.discovery, "node_ids", {}).get(host)
        if node_id:
            return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}
        return {"resources": {"node:%s" % host: 0.01}}

    def _host_ip(self, host: str) -> str:
        return getattr(self.discovery, "node_ips", {}).get(host, host)

    def _detect_nics(self, hosts: List[str]) -> List[str]:
        ips = [self._host_ip(h) for h in hosts]
        if not network.filter_local_addresses(ips) or self.settings.nics:
            return detect_nics(self.settings, ips)
        # One zero-CPU actor per host finds the interface holding its node's IP.
        probes = [ray.remote(BaseHorovodWorker).options(num_cpus=0, **self._pinning(h)).remote() for h in hosts]
        try:
            return detect_nics(self.settings, ips, probes)
        finally:
            for probe in probes:
                ray.kill(probe)

    def _prepare(self):
        """Rendezvous server, driver, ``min_workers`` slots, interfaces and run variables."""
        if self.driver is not None:
            return
        p = self.params
        self.rendezvous = RendezvousServer(verbose=max(0, self._verbose() - 1))
        self.driver = ElasticDriver(self.rendezvous, self.discovery, p.min_workers, p.max_workers,
                                    timeout=p.elastic_timeout, reset_limit=p.reset_limit,
                                    cooldown_range=tuple(p.cooldown_range) if p.cooldown_range else None,
                                    verbose=self._verbose())
        port = self.rendezvous.start(create_rendezvous_handler(self.driver))
        current = self.driver.wait_for_available_slots(p.min_workers,
                                                       min_hosts=gloo_run._get_min_start_hosts(self.settings))
        if self.nics is None:
            self.nics = self._detect_nics(current.host_assignment_order)
        try:
            driver_ip = network.get_driver_ip(self.nics)
        except RuntimeError:  # this process's machine lacks the workers' interface
            driver_ip = ray.util.get_node_ip_address()
        self.run_vars = gloo_run.create_run_env_vars(driver_ip, self.nics, port, elastic=True)

    def _teardown_driver(self):
        if self.driver is not None:
            self.driver.stop()
            self.driver.wait_for_workers()
            self.driver = None
        with self._lock:
            actors = list(self._actors.values())
            self._actors.clear()
        for actor in actors:
            try:
                ray.kill(actor)
            except Exception:
                pass
        if self.rendezvous is not None:
            self.rendezvous.stop()
            self.rendezvous = None

    def start(self, executable_cls: type = None, executable_args: Optional[List] = None,
              executable_kwargs: Optional[Dict] = None, extra_env_vars: Optional[Dict] = None):
        self._executable = (executable_cls, executable_args, executable_kwargs)
        self._extra_env_vars = {str(k): str(v) for k, v in (extra_env_vars or {}).items()}
        self._started = True
        try:
            self._prepare()
        except BaseException:
            self._teardown_driver()
            raise

    # --- one worker ---------------------------------------------------------------------------

    def _worker_env(self, slot_info, gpu_ids: List[int]) -> Dict[str, str]:
        env = gloo_run.create_worker_env(self._extra_env_vars, slot_info, self.run_vars,
                                         **{env_names.ELASTIC_TIMEOUT: str(self.params.elastic_timeout)},
                                         **{SECRET_ENV: self.rendezvous.secret.hex()})
        if self.params.use_gpu:
            # The GPUs of every worker of this node that runs now, this one's included (spec §5).
            with self._lock:
                ids = set(gpu_ids)
                for (host, _), others in self._gpu_ids.items():
                    if host == slot_info.hostname:
                        ids.update(others)
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in sorted(ids))
        return env

    def _run_slot(self, slot_info, events) -> Tuple[int, float]:
        """The driver's ``create_worker_fn``: one actor for ``slot_info`` until it returns, fails,
        or one of ``events`` (the job stopped, the host was blacklisted) is set."""
        p = self.params
        key = (slot_info.hostname, slot_info.local_rank)
        name = "%s[%d]" % key
        where = "worker %s (Ray node %s, IP %s)" % (name, slot_info.hostname, self._host_ip(slot_info.hostname))
        actor = ray.remote(BaseHorovodWorker).options(
            num_cpus=p.cpus_per_worker, num_gpus=p.gpus_per_worker * int(p.use_gpu),
            **self._pinning(slot_info.hostname)).remote(world_rank=slot_info.rank, world_size=slot_info.size)
        with self._lock:
            self._actors[key] = actor
        try:
            try:
                self._wait_started(actor, slot_info.hostname, events)
                gpu_ids = ray.get(actor.get_gpu_ids.remote()) if p.use_gpu else []
                with self._lock:
                    self._gpu_ids[key] = gpu_ids
                ray.get([actor.update_env_vars.remote(self._worker_env(slot_info, gpu_ids)),
                         actor.start_executable.remote(*self._executable),
                         actor.set_queue.remote(self._pump.queue if self._pump else None)])
            except (GetTimeoutError, RayError) as e:
                self._record_error(name, "%s did not start: %s" % (where, e))
                return 1, time.time()
            ref = actor.execute.remote(self._call)
            while True:
                ready, _ = ray.wait([ref], timeout=POLL_INTERVAL_S)
                if ready:
                    try:
                        outcome = ray.get(ref)
                    except RayError as e:
                        self._record_error(name, "%s failed: %s" % (where, e))
                        return 1, time.time()
                    if outcome != _REMOVED:
                        with self._lock:
                            self._values[name] = outcome
                    return 0, time.time()
                if any(event.is_set() for event in events):
                    return 1, time.time()
        finally:
            with self._lock:
                if self._actors.get(key) is actor:
                    del self._actors[key]
                self._gpu_ids.pop(key, None)
            try:
                ray.kill(actor)
            except Exception:
                pass

    def _host_gone(self, host: str) -> bool:
        """Whether the last poll of a :class:`RayHostDiscovery` no longer lists ``host``."""
        return isinstance(self.discovery, RayHostDiscovery) and host not in self.discovery.node_ips

    def _wait_started(self, actor, host: str, events):
        """Wait for the new actor's first answer: at most ``timeout_s`` (``PING_TIMEOUT_S`` at
        least), less when its node leaves the cluster or the driver stops the job meanwhile.

        Raises:
            GetTimeoutError: it did not answer in time, or its node or job went away (message says).
        """
        ref = actor.hostname.remote()
        deadline = time.monotonic() + self._timeout_s()
        while not ray.wait([ref], timeout=POLL_INTERVAL_S)[0]:
            if self._host_gone(host):
                raise GetTimeoutError("its Ray node left the cluster before the actor started")
            if any(event.is_set() for event in events):
                raise GetTimeoutError("the job stopped, or the node was blacklisted, before the actor started")
            if time.monotonic() > deadline:
                raise GetTimeoutError("no answer within %g s (settings.timeout_s)" % self._timeout_s())
        ray.get(ref)

    def _record_error(self, name: str, text: str):
        with self._lock:
            self._errors[name] = text
        if self._verbose():
            print("horovod.ray elastic: %s" % text, file=sys.stderr, flush=True)

    # --- jobs ---------------------------------------------------------------------------------

    def _run_job(self, call, callbacks) -> List[Any]:
        if not self._started:
            raise RuntimeError("the RayExecutor is not started: call start() first")
        self._prepare()
        self._call = call
        self._values, self._errors = {}, {}
        self._pump = ray_logger.start_pump(callbacks)
        driver = self.driver
        try:
            driver.start(self.params.min_workers, self._run_slot)
            results = driver.get_results()
        finally:
            self._teardown_driver()
            if self._pump is not None:
                self._pump.stop()
                self._pump = None
        if results.error_message:
            raise RuntimeError(results.error_message)
        failed = sorted((timestamp, name, code) for name, (code, timestamp) in results.worker_results.items()
                        if code != 0)
        if failed:
            _, name, code = failed[0]
            message = gloo_run.JOB_FAILED_MESSAGE.format(rank=name, code=gloo_run.describe_exit_code(code),
                                                         host=self._host_ip(name.rpartition("[")[0]))
            if name in self._errors:
                message += self._errors[name]
            raise RuntimeError(message)
        values = [self._values[name] for name, (code, _) in results.worker_results.items()
                  if code == 0 and name in self._values]
        return [value for _, value in sorted(values, key=lambda rank_value: rank_value[0])]

    def run(self, fn: Callable[..., Any], args: Optional[List] = None, kwargs: Optional[Dict] = None,
            callbacks: Optional[List[Callable]] = None) -> List[Any]:
        return self._run_job(functools.partial(_elastic_call, fn, list(args or []), dict(kwargs or {}), False),
                             callbacks)

    def execute(self, fn: Callable[[Any], Any], callbacks: Optional[List[Callable]] = None) -> List[Any]:
        return self._run_job(functools.partial(_elastic_call, fn, [], {}, True), callbacks)

    def run_remote(self, fn, args=None, kwargs=None):
        raise NotImplementedError("run_remote is not supported in elastic mode: elastic workers are started "
                                  "and stopped by the driver, so there are no object refs to return; use run")

    def execute_single(self, fn):
        raise NotImplementedError("execute_single is not supported in elastic mode; use execute")

    def shutdown(self):
        self._started = False
        self._teardown_driver()
