"""``RayExecutor``: a Horovod job whose ranks are Ray actors (static mode).

``start()`` places one :class:`~horovod.ray.worker.BaseHorovodWorker` actor per rank (see
:mod:`horovod.ray.strategy`), groups the ranks by Ray node into local and cross ranks
(:class:`Coordinator`, through the launcher's :func:`~horovod.runner.common.util.hosts.get_host_assignments`),
starts the launcher's authenticated rendezvous server with a secret of this executor's own, and
gives every actor the environment a ``horovodrun`` worker gets (runner.md §4.1, built by
:mod:`horovod.runner.gloo_run`). ``hvd.init()`` in a function run on the workers then joins the job.
"""

import collections
import dataclasses
import functools
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError

from horovod.common.rendezvous import SECRET_ENV, RendezvousServer, make_secret_key
from horovod.ray import ray_logger
from horovod.ray.adapter import Adapter, BaseParams
from horovod.ray.strategy import ColocatedStrategy, PGStrategy
from horovod.ray.utils import detect_nics, map_blocking, nics_to_env_var
from horovod.runner import gloo_run
from horovod.runner.common.util import hosts
from horovod.runner.common.util.timeout import Timeout
from horovod.runner.common.util import env_names

logger = logging.getLogger(__name__)

# After the first failed rank, how long run() waits for the others' outcome before it reports: a
# killed actor often shows first as a collective error in its peers, and the dead actor is the news.
FAILURE_GRACE_S = 2.0


@dataclass
class MiniSettings:
    """Settings of a :class:`RayExecutor` (see :meth:`RayExecutor.create_settings`).

    ``key`` is a fresh secret for each instance. Extra attributes may be set on an instance.
    """

    nics: Optional[set] = None
    verbose: int = 1
    key: bytes = field(default_factory=make_secret_key, repr=False)
    ssh_port: Optional[int] = None
    ssh_identity_file: Optional[str] = None
    timeout_s: int = 300
    placement_group_timeout_s: int = 100
    elastic: bool = False

    @property
    def start_timeout(self) -> Timeout:
        return Timeout(self.timeout_s,
                       message="Timed out waiting for {activity}. Please check connectivity between the "
                               "Ray nodes. You may need to increase the timeout_s parameter of "
                               "RayExecutor.create_settings.")


class Coordinator:
    """Registers the workers (rank, Ray node) and derives their topology and rendezvous.

    Ranks on one Ray node get local ranks in rank order; the cross rank of a rank is the index of
    its node among the nodes holding that local rank, nodes counted in the order they were first
    registered. The host names of the plan (``HOROVOD_HOSTNAME``) are Ray node ids, so Ray nodes
    sharing one machine stay apart.
    """

    def __init__(self, settings):
        self.settings = settings
        self._node_of_rank: Dict[int, str] = {}
        self._ranks_of_node: Dict[str, List[int]] = collections.OrderedDict()
        self.hostnames = set()
        self.rendezvous: Optional[RendezvousServer] = None
        self.secret: Optional[bytes] = None

    @property
    def world_size(self) -> int:
        return len(self._node_of_rank)

    @property
    def node_id_string(self) -> str:
        """``"<node_id>:<ranks>,..."`` in the order the nodes were first registered."""
        return ",".join("%s:%d" % (node, len(ranks)) for node, ranks in self._ranks_of_node.items())

    def register(self, hostname: str, node_id: str, world_rank: int):
        if world_rank in self._node_of_rank:
            raise ValueError("rank %d is already registered" % world_rank)
        self.hostnames.add(hostname)
        self._node_of_rank[world_rank] = node_id
        self._ranks_of_node.setdefault(node_id, []).append(world_rank)

    def slot_infos(self) -> List[hosts.SlotInfo]:
        """One :class:`~horovod.runner.common.util.hosts.SlotInfo` per rank, in rank order."""
        if sorted(self._node_of_rank) != list(range(self.world_size)):
            raise ValueError("registered ranks %s are not 0..%d" % (sorted(self._node_of_rank), self.world_size - 1))
        for ranks in self._ranks_of_node.values():
            ranks.sort()
        plan = hosts.get_host_assignments(hosts.parse_hosts(self.node_id_string), self.world_size)
        by_place = {(slot.hostname, slot.local_rank): slot for slot in plan}
        slots = [None] * self.world_size
        for node, ranks in self._ranks_of_node.items():
            for local_rank, rank in enumerate(ranks):
                slots[rank] = dataclasses.replace(by_place[(node, local_rank)], rank=rank)
        return slots

    def finalize_registration(self) -> Dict[int, Dict[str, int]]:
        """``{rank: {HOROVOD_CROSS_RANK, HOROVOD_CROSS_SIZE, HOROVOD_LOCAL_RANK, HOROVOD_LOCAL_SIZE}}``
        (int values)."""
        return {slot.rank: {env_names.CROSS_RANK: slot.cross_rank, env_names.CROSS_SIZE: slot.cross_size,
                            env_names.LOCAL_RANK: slot.local_rank, env_names.LOCAL_SIZE: slot.local_size}
                for slot in self.slot_infos()}

    def establish_rendezvous(self, nics: Optional[List[str]] = None) -> Dict[str, str]:
        """Start the rendezvous server (a new secret, in :attr:`secret`) for the registered ranks;
        return the workers' rendezvous and controller variables (with ``nics``: also
        ``HOROVOD_GLOO_IFACE`` and ``NCCL_SOCKET_IFNAME``), and the secret (hex) under
        ``_HOROVOD_SECRET_KEY``, without which the server refuses the workers: callers that
        copy the returned variables into the workers (Ray Train's Horovod backend does) thereby
        give them the secret. The address is this process's Ray node IP."""
        self.secret = make_secret_key()
        self.rendezvous = RendezvousServer(verbose=max(0, (self.settings.verbose or 0) - 1), secret=self.secret)
        port = self.rendezvous.start()
        self.rendezvous.init(self.slot_infos())
        run_vars = gloo_run.create_run_env_vars(ray.util.get_node_ip_address(), nics or [""], port)
        if not nics:
            for name in nics_to_env_var([""]):
                del run_vars[name]
        run_vars[SECRET_ENV] = self.secret.hex()
        return run_vars

    def shutdown(self):
        if self.rendezvous is not None:
            self.rendezvous.stop()
            self.rendezvous = None


@dataclass
class StaticParams(BaseParams):
    num_workers: Optional[int] = None
    num_hosts: Optional[int] = None
    num_workers_per_host: int = 1
    use_current_placement_group: bool = True

    @property
    def elastic(self) -> bool:
        return False


def _call(fn, args, kwargs, _executable):
    return fn(*args, **kwargs)


def _is_dead_actor(error) -> bool:
    return isinstance(error, RayActorError)


class StaticAdapter(Adapter):
    """Static mode: a fixed set of workers created by :meth:`start`."""

    def __init__(self, settings, params: StaticParams):
        self.settings = settings
        self.params = params
        self.strategy = None
        self.coordinator = None
        self.workers: List = []

    def _create_strategy(self):
        p = self.params
        current = ray.util.get_current_placement_group() if p.use_current_placement_group else None
        if current is not None or p.num_hosts is None:
            num_workers = p.num_workers
            if num_workers is None and p.num_hosts is not None:
                num_workers = p.num_hosts * p.num_workers_per_host
            if num_workers is None:
                # Neither given: one worker per bundle of the caller's placement group.
                num_workers = current.bundle_count
            return PGStrategy(self.settings, num_workers, p.use_gpu, p.cpus_per_worker, p.gpus_per_worker,
                              placement_group=current)
        return ColocatedStrategy(self.settings, p.num_hosts, p.num_workers_per_host, p.use_gpu,
                                 p.cpus_per_worker, p.gpus_per_worker)

    def start(self, executable_cls: type = None, executable_args: Optional[List] = None,
              executable_kwargs: Optional[Dict] = None, extra_env_vars: Optional[Dict] = None):
        self.strategy = self._create_strategy()
        self.workers = self.strategy.create_workers()
        n = len(self.workers)
        try:
            where = ray.get([w.node_id.remote() for w in self.workers]
                            + [w.hostname.remote() for w in self.workers], timeout=self.settings.timeout_s)
        except GetTimeoutError:
            raise TimeoutError("the %d Ray worker actors of the Horovod job did not start within timeout_s=%s "
                               "seconds (RayExecutor.create_settings); check that the Ray nodes can start "
                               "workers, or raise timeout_s" % (n, self.settings.timeout_s)) from None
        node_ids, hostnames = where[:n], where[n:]
        self.coordinator = Coordinator(self.settings)
        for rank in range(n):
            self.coordinator.register(hostnames[rank], node_ids[rank], rank)
        slots = self.coordinator.slot_infos()
        run_vars = self.coordinator.establish_rendezvous()
        run_vars.update(extra_env_vars or {})
        one_per_host = {}
        for rank, host in enumerate(hostnames):
            one_per_host.setdefault(host, self.workers[rank])
        nics = detect_nics(self.settings, list(one_per_host), list(one_per_host.values()))
        run_vars.update(nics_to_env_var(nics))
        gpu_env = self.strategy.gpu_env(node_ids)
        envs = []
        for rank, slot in enumerate(slots):
            env = dict(run_vars)
            env.update(gloo_run.create_slot_env_vars(slot))
            env.update(gpu_env[rank])
            env[SECRET_ENV] = self.coordinator.secret.hex()
            envs.append(env)
        if (self.settings.verbose or 0) >= 2:
            for rank, env in enumerate(envs):
                logger.info("horovod.ray: rank %d: %s", rank,
                            " ".join("%s=%s" % (k, v) for k, v in sorted(env.items()) if k != SECRET_ENV))
        ray.get([w.update_env_vars.remote(env) for w, env in zip(self.workers, envs, strict=True)])
        map_blocking(lambda w: w.start_executable.remote(executable_cls, executable_args, executable_kwargs),
                     self.workers)

    def _require_started(self):
        if not self.workers:
            raise RuntimeError("the RayExecutor is not started: call start() first")

    def _gather(self, refs: List["ray.ObjectRef"], what: str) -> List[Any]:
        """The values of ``refs`` (rank ``i``'s at ``i``); the first failure is raised at once,
        Ray's error with a note naming the rank."""
        pending = {ref: rank for rank, ref in enumerate(refs)}
        results = [None] * len(refs)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                rank = pending.pop(ref)
                try:
                    results[rank] = ray.get(ref)
                except RayError as e:
                    raise self._failure(what, len(refs), [(rank, e)] + self._other_failures(pending)) from None
        return results

    def _other_failures(self, pending):
        if not pending:
            return []
        done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=FAILURE_GRACE_S)
        failures = []
        for ref in done:
            try:
                ray.get(ref)
            except RayError as e:
                failures.append((pending[ref], e))
        return failures

    def _failure(self, what, size, failures):
        # A dead actor is the cause of its peers' collective errors: report it first.
        dead = [(rank, e) for rank, e in failures if _is_dead_actor(e)]
        rank, error = (dead or failures)[0]
        if _is_dead_actor(error):
            headline = ("horovod.ray: the worker actor of rank %d of %d died during %s (its process was "
                        "killed or exited, or its Ray node was lost)" % (rank, size, what))
        else:
            headline = "horovod.ray: rank %d of %d failed in %s; its traceback is above" % (rank, size, what)
        # Ray copies the worker's notes onto its error, whose message already shows them.
        message = str(error)
        if getattr(error, "__notes__", None):
            error.__notes__ = [note for note in error.__notes__ if note not in message]
        others = sorted(r for r, _ in failures if r != rank)
        if others:
            headline += "; rank(s) %s failed too" % ", ".join(str(r) for r in others)
        error.add_note(headline + ". The other workers may be left waiting in a collective: "
                       "call shutdown() and start again.")
        return error

    def run_remote(self, fn: Callable[..., Any], args: Optional[List] = None,
                   kwargs: Optional[Dict] = None) -> List[Any]:
        self._require_started()
        call = functools.partial(_call, fn, list(args or []), dict(kwargs or {}))
        return [w.execute.remote(call) for w in self.workers]

    def _with_callbacks(self, callbacks, submit, what):
        """``submit()`` (object refs in rank order) gathered, with the workers' ray_logger records
        delivered to ``callbacks`` meanwhile."""
        pump = ray_logger.start_pump(callbacks)
        if pump is None:
            return self._gather(submit(), what)
        try:
            ray.get([w.set_queue.remote(pump.queue) for w in self.workers])
            try:
                return self._gather(submit(), what)
            finally:
                try:
                    ray.get([w.set_queue.remote(None) for w in self.workers], timeout=10)
                except (RayError, GetTimeoutError):
                    pass
        finally:
            pump.stop()

    def run(self, fn: Callable[..., Any], args: Optional[List] = None, kwargs: Optional[Dict] = None,
            callbacks: Optional[List[Callable]] = None) -> List[Any]:
        self._require_started()
        return self._with_callbacks(callbacks, lambda: self.run_remote(fn, args, kwargs), "run()")

    def execute(self, fn: Callable[[Any], Any], callbacks: Optional[List[Callable]] = None) -> List[Any]:
        self._require_started()
        return self._with_callbacks(callbacks, lambda: [w.execute.remote(fn) for w in self.workers], "execute()")

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        self._require_started()
        return self._gather([self.workers[0].execute.remote(fn)], "execute_single()")[0]

    def shutdown(self):
        if self.strategy is not None:
            self.strategy.shutdown()
            self.strategy = None
        if self.coordinator is not None:
            self.coordinator.shutdown()
            self.coordinator = None
        self.workers = []


def _check_count(name, value, minimum=1):
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
        raise ValueError("%s must be an integer of at least %d, got %r" % (name, minimum, value))


class RayExecutor:
    """A Horovod job on a Ray cluster: one Ray actor per rank.

    Args:
        settings: from :meth:`create_settings`.
        num_workers: the number of workers, packed into a placement group of one bundle each.
        num_hosts: the number of Ray nodes to spread the workers over (one bundle per node,
            ``STRICT_SPREAD``), with ``num_workers_per_host`` workers on each. Exclusive with
            ``num_workers``.
        num_workers_per_host: workers per node with ``num_hosts``.
        cpus_per_worker: CPUs each worker asks Ray for.
        use_gpu: give each worker ``gpus_per_worker`` GPUs (default 1).
        gpus_per_worker: GPUs per worker; only with ``use_gpu``.
        use_current_placement_group: when this code runs inside a placement group, put the
            workers there (any bundle) instead of creating one.
        min_workers: makes the job elastic: it trains with at least this many workers, one per
            slot of the Ray nodes (``CPU // cpus_per_worker``, capped by the GPUs with
            ``use_gpu``), and survives workers and nodes coming and going (see
            :mod:`horovod.ray.elastic_v2`). Exclusive with ``num_workers`` and ``num_hosts``.
        max_workers: the most workers of an elastic job (default: every slot).
        reset_limit: the most resets of an elastic job before it fails (default: no limit).
        cooldown_range: ``(lower, upper)`` seconds (1 <= lower <= upper <= 3600) after which a
            node blacklisted for a failed worker is used again (default: never).
        elastic_timeout: seconds an elastic job waits for ``min_workers`` slots before it fails.
        override_discovery: discover the hosts from the Ray cluster
            (:class:`~horovod.ray.elastic_v2.RayHostDiscovery`, set as ``settings.discovery``);
            False keeps the ``settings.discovery`` the caller set (a runner ``HostDiscovery``
            whose host names are Ray nodes' ``node:<host>`` resources).

    Raises:
        ValueError: inconsistent or invalid arguments.
    """

    def __init__(self, settings, num_workers: Optional[int] = None, num_hosts: Optional[int] = None,
                 num_workers_per_host: int = 1, cpus_per_worker: int = 1, use_gpu: bool = False,
                 gpus_per_worker: Optional[int] = None, use_current_placement_group: bool = True,
                 min_workers: int = None, max_workers: int = None, reset_limit: int = None,
                 cooldown_range: List[int] = None, elastic_timeout: int = 600, override_discovery: bool = True):
        if max_workers is not None and (min_workers is None or min_workers <= 0):
            raise ValueError("max_workers=%r needs a positive min_workers (elastic mode)" % (max_workers,))
        if min_workers is not None and num_workers is not None:
            raise ValueError("Both min_workers and num_workers provided: give num_workers for a static job "
                             "or min_workers (and max_workers) for an elastic one, not both.")
        if min_workers is not None:
            from horovod.ray.elastic_v2 import ElasticParams, RayHostDiscovery
            if num_hosts is not None:
                raise ValueError("num_hosts is for static jobs; an elastic job (min_workers) uses every Ray node "
                                 "with free slots")
            self.settings = settings
            self.settings.elastic = True
            self.params = ElasticParams(cpus_per_worker=cpus_per_worker, use_gpu=use_gpu,
                                        gpus_per_worker=gpus_per_worker, min_workers=min_workers,
                                        max_workers=max_workers, reset_limit=reset_limit,
                                        cooldown_range=cooldown_range, elastic_timeout=elastic_timeout,
                                        override_discovery=override_discovery)
            if override_discovery:
                settings.discovery = RayHostDiscovery(use_gpu=use_gpu, cpus_per_worker=cpus_per_worker,
                                                      gpus_per_worker=self.params.gpus_per_worker or 1)
            self.adapter = None
            return
        if num_workers is not None and num_hosts is not None:
            raise ValueError("give either num_workers or num_hosts (with num_workers_per_host), not both")
        if num_workers_per_host is None:
            num_workers_per_host = 1
        _check_count("num_workers", num_workers)
        _check_count("num_hosts", num_hosts)
        _check_count("num_workers_per_host", num_workers_per_host)
        if num_workers is None and num_hosts is None:
            inherited = (use_current_placement_group and ray.is_initialized()
                         and ray.util.get_current_placement_group() is not None)
            if not inherited:
                raise ValueError("give num_workers, or num_hosts and num_workers_per_host: the number of "
                                 "Horovod workers is not known")
        self.settings = settings
        self.settings.elastic = False
        self.params = StaticParams(cpus_per_worker=cpus_per_worker, use_gpu=use_gpu, gpus_per_worker=gpus_per_worker,
                                   num_workers=num_workers, num_hosts=num_hosts,
                                   num_workers_per_host=num_workers_per_host,
                                   use_current_placement_group=use_current_placement_group)
        self.adapter = None

    @classmethod
    def create_settings(cls, timeout_s: int = 30, ssh_identity_file: Optional[str] = None,
                        ssh_str: Optional[str] = None, placement_group_timeout_s: int = 100,
                        nics: Optional[set] = None, verbose: int = 1) -> MiniSettings:
        """Settings for a :class:`RayExecutor`.

        Args:
            timeout_s: seconds the workers have to start (and to meet at the rendezvous).
            ssh_identity_file, ssh_str: an ssh key; ``ssh_str`` (the key's text) is written to
                ``ssh_identity_file`` (mode 0600) when that file does not exist.
            placement_group_timeout_s: seconds to wait for Ray to place the workers' placement
                group before ``start()`` raises ``TimeoutError``.
            nics: network interface names for the workers (default: found automatically).
            verbose: 2 logs each worker's environment (without the secret).
        """
        if ssh_str and ssh_identity_file and not os.path.exists(ssh_identity_file):
            fd = os.open(ssh_identity_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(ssh_str)
        return MiniSettings(nics=set(nics) if nics else None, verbose=verbose, ssh_identity_file=ssh_identity_file,
                            timeout_s=timeout_s, placement_group_timeout_s=placement_group_timeout_s)

    def start(self, executable_cls: type = None, executable_args: Optional[List] = None,
              executable_kwargs: Optional[Dict] = None, extra_env_vars: Optional[Dict] = None):
        """Place the workers, make them one Horovod job, and create ``executable_cls(*args, **kwargs)``
        in each (the object :meth:`execute` hands to its functions).

        Elastic mode: start the rendezvous server and the elastic driver, wait for
        ``min_workers`` slots (on 2 nodes unless ``nics`` was given, to find the network
        interface) and choose the interface; the workers are created by each :meth:`run`.

        Args:
            executable_cls: a class instantiated in every worker (None: no object).
            executable_args: positional arguments of ``executable_cls``.
            executable_kwargs: keyword arguments of ``executable_cls``.
            extra_env_vars (dict): environment variables set in every worker, besides Horovod's.

        Raises:
            RuntimeError: the executor is already started.
            TimeoutError: the placement group was not placed within ``placement_group_timeout_s``,
                or the workers did not start within ``timeout_s``.
            horovod.runner.common.util.timeout.TimeoutException: elastic mode, fewer than
                ``min_workers`` slots for ``elastic_timeout`` seconds.
        """
        if self.adapter is not None:
            raise RuntimeError("the RayExecutor is already started; call shutdown() first")
        if self.params.elastic:
            from horovod.ray.elastic_v2 import ElasticAdapter
            self.adapter = ElasticAdapter(self.settings, self.params)
        else:
            self.adapter = StaticAdapter(self.settings, self.params)
        try:
            self.adapter.start(executable_cls, executable_args, executable_kwargs, extra_env_vars)
        except BaseException:
            self.shutdown()
            raise

    def _adapter(self):
        if self.adapter is None:
            raise RuntimeError("the RayExecutor is not started: call start() first")
        return self.adapter

    def run(self, fn: Callable[..., Any], args: Optional[List] = None, kwargs: Optional[Dict] = None,
            callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """``fn(*args, **kwargs)`` on every worker; the results in rank order.

        A failure is raised as soon as Ray reports it: the exception of a worker's function (Ray's
        error, an instance of the original exception type too, with the worker's traceback), or
        Ray's actor error when a worker's actor died. A note on it names the rank.
        ``callbacks``: functions of one dict, called in this process with every record the
        workers send with :func:`horovod.ray.ray_logger.log`, in order of arrival.

        Elastic mode: one elastic job, over as many rounds as the driver needs; the values of
        the workers of the last round, sorted by their rank then. Raises ``RuntimeError`` with
        the driver's reason when it gave up (reset limit, every worker failed, no host left),
        or naming the first worker (``<node>[<local rank>]``) that failed, with its error.
        ``horovod.runner.common.util.timeout.TimeoutException`` when fewer than ``min_workers`` slots were
        available for ``elastic_timeout`` seconds.
        """
        return self._adapter().run(fn, args, kwargs, callbacks)

    def run_remote(self, fn: Callable[..., Any], args: Optional[List] = None,
                   kwargs: Optional[Dict] = None) -> List[Any]:
        """Like :meth:`run` without waiting: one Ray object ref per rank, in rank order.
        ``NotImplementedError`` in elastic mode (its workers come and go).

        Args:
            fn: the function to run, ``fn(*args, **kwargs)`` on every worker.
            args (list): its positional arguments.
            kwargs (dict): its keyword arguments.
        """
        return self._adapter().run_remote(fn, args, kwargs)

    def execute(self, fn: Callable[[Any], Any], callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """``fn(executable)`` on every worker; the results in rank order (failures as :meth:`run`).

        Args:
            fn: a function of the object ``start`` created in each worker.
            callbacks: functions called on the driver with every result a worker sends through
                ``horovod.ray.ray_logger``.
        """
        return self._adapter().execute(fn, callbacks)

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(executable)`` on rank 0 only; its result. ``NotImplementedError`` in elastic mode
        (use :meth:`execute`)."""
        return self._adapter().execute_single(fn)

    def shutdown(self):
        """Kill the workers, stop the rendezvous server and remove the placement group this
        executor created (never the caller's). Safe after a failed ``start()`` and when repeated."""
        if self.adapter is not None:
            self.adapter.shutdown()
            self.adapter = None
