"""``horovod.spark.run``: a function as Horovod ranks on Spark executors, one Spark task per rank.

The driver starts an authenticated driver service (HMAC-framed TCP, :mod:`horovod.runner.common.util.network`)
and, in a background thread under a job group of its own, a Spark job of ``num_proc`` partitions.
Each task registers with the service (task index, host hash, Spark attempt). Once all have
registered, the driver groups the tasks into hosts by host hash, assigns ranks as ``horovodrun``
does (:func:`horovod.runner.common.util.hosts.get_host_assignments`), starts the launcher's
authenticated rendezvous server with a fresh secret, and hands each task its rank's environment,
the secret sealed under the service key, and the cloudpickled function. Each task runs its rank as
a process of its own and returns the result through ``collect``.
"""

import collections.abc
import itertools
import logging
import os
import time

import cloudpickle

from horovod.common.rendezvous import RendezvousServer, make_secret_key
from horovod.runner import gloo_run
from horovod.runner.common.util import env as env_util
from horovod.runner.common.util import hosts
from horovod.runner.common.util.timeout import TimeoutException
from horovod.spark.common import util
from horovod.spark.driver.driver_service import HEARTBEAT_TIMEOUT_S, SparkDriverService
from horovod.runner.common.util import env_names

logger = logging.getLogger(__name__)

# After the first failure, how long run() waits for more news before it reports: a lost task is
# the cause of its peers' collective errors and is reported first.
FAILURE_GRACE_S = 2.0
_WAIT_S = 0.1

_run_counter = itertools.count()


def _host_plan(registrations):
    """Hosts (host hashes sorted, rotated so that task 0's host comes first), each with its task
    indices in increasing order; local rank k of a host is its k-th smallest task index."""
    by_host = {}
    for index in sorted(registrations):
        by_host.setdefault(registrations[index].host_hash, []).append(index)
    names = sorted(by_host)
    first = names.index(registrations[0].host_hash) if 0 in registrations else 0
    names = names[first:] + names[:first]
    return [(name, by_host[name]) for name in names]


def _common(registrations, attribute):
    """The interface names every task lists in ``attribute``, loopback last."""
    common = None
    for req in registrations.values():
        names = set(getattr(req, attribute))
        common = names if common is None else common & names
    return sorted(common or (), key=lambda n: (n == "lo", n))


def _interfaces(registrations, nics):
    """``(driver interfaces every task reached, task interfaces for Gloo)``, each ordered with
    loopback last and restricted to ``nics`` when given; raises ``Exception`` naming every task's
    interfaces when either is empty.

    Gloo always gets an interface: without one it binds to the address of ``HOROVOD_HOSTNAME``,
    which is a host hash here."""
    reached = _common(registrations, "driver_interfaces")
    tasks = _common(registrations, "task_interfaces")
    if nics:
        reached = [n for n in reached if n in nics]
        tasks = [n for n in tasks if n in nics]
    gloo = [n for n in tasks if n in reached] or tasks
    if not reached or not gloo:
        raise Exception("the Spark tasks share no network interface%s. Interfaces of the driver each task "
                        "reached: %s; the tasks' own interfaces: %s"
                        % (" among nics=%s" % sorted(nics) if nics else "",
                           {i: r.driver_interfaces for i, r in sorted(registrations.items())},
                           {i: r.task_interfaces for i, r in sorted(registrations.items())}))
    return reached, gloo


class SparkJob:
    """The Spark job behind one run: ``num_tasks`` tasks of one partition each, task ``i``
    returning ``task_fn(i)`` on an executor, collected by a thread of this process under a job
    group of its own (:attr:`group`; :meth:`cancel` stops the tasks). Once the thread ended,
    :attr:`results` holds the tasks' values, or :attr:`error` what the job raised."""

    def __init__(self, sc, num_tasks, task_fn, name):
        from pyspark.util import InheritableThread

        self._sc = sc
        self.group = "horovod.spark.run.%d" % next(_run_counter)
        self.results = None
        self.error = None

        def mapper(index, _iterator):
            return task_fn(index)

        def collect():
            try:
                sc.setJobGroup(self.group, "Horovod Spark Run", interruptOnCancel=True)
                self.results = sc.parallelize(range(num_tasks), num_tasks).mapPartitionsWithIndex(mapper).collect()
            except BaseException as e:
                self.error = e

        self._thread = InheritableThread(target=collect, name=name, daemon=True)
        self._thread.start()

    def alive(self):
        return self._thread.is_alive()

    def join(self, timeout):
        self._thread.join(timeout=timeout)

    def cancel(self):
        self._sc.cancelJobGroup(self.group)


def active_context():
    """The active SparkContext; raises ``Exception`` when there is none."""
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None:
        raise Exception("Could not find an active SparkContext, are you running in a PySpark session?")
    return sc


def worker_env(env):
    """The variables ``env`` (a mapping, None for none) adds to the ranks' environment, filtered
    as ``horovodrun`` forwards the driver's: never the secret, CUDA_VISIBLE_DEVICES, OLDPWD or
    shell functions. Raises ``ValueError`` for anything but a mapping."""
    if env is None:
        return {}
    if not isinstance(env, collections.abc.Mapping):
        raise ValueError("env must be a mapping of the variables to add to the ranks' environment, got %s"
                         % type(env).__name__)
    return {str(k): str(v) for k, v in env.items() if env_util.is_exportable(str(k))}


def check_num_proc(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError("%s must be a positive integer, got %r" % (name, value))
    return value


def default_start_timeout(start_timeout):
    if start_timeout is None:
        return int(os.getenv(env_names.SPARK_START_TIMEOUT, "600"))
    return start_timeout


def start_timeout_error(registered, num_proc, start_timeout, group):
    return TimeoutException(
        "Timed out waiting for Spark tasks to start. Only %d of %d Spark tasks started and "
        "registered within start_timeout=%s seconds; the Spark job group %s was cancelled. Please "
        "check that the Spark cluster has %d free task slots (executor cores / spark.task.cpus), "
        "or increase start_timeout (or HOROVOD_SPARK_START_TIMEOUT)."
        % (registered, num_proc, start_timeout, group, num_proc))


def _use_mpi(use_mpi, use_gloo):
    """Whether to run with MPI: as asked (``ValueError`` when that controller is not built or
    both are asked), else Gloo."""
    from horovod.common.basics import HorovodBasics
    basics = HorovodBasics()
    if use_mpi and use_gloo:
        raise ValueError("use_mpi=True and use_gloo=True: choose one controller")
    if use_gloo is False and use_mpi is False:
        raise ValueError("use_gloo=False and use_mpi=False leave no controller to run with")
    if use_mpi:
        if not basics.mpi_built():
            raise ValueError("use_mpi=True, but this horovod-core was built without MPI (rebuild it with MPI, or "
                             "leave use_mpi unset to run with Gloo)")
        return True
    if not basics.gloo_built():
        raise ValueError("horovod.spark.run needs Gloo (or use_mpi=True); this horovod-core was built without it")
    return False


def run(fn, args=(), kwargs={}, num_proc=None, start_timeout=None, extra_mpi_args=None, env=None,  # noqa: B006
        stdout=None, stderr=None, verbose=1, nics=None, prefix_output_with_timestamp=False, executable=None,
        use_mpi=None, use_gloo=None):
    """Run ``fn(*args, **kwargs)`` as ``num_proc`` Horovod ranks on the executors of the active
    Spark context (Gloo controller); return the results, one per rank, in rank order.

    Args:
        fn, args, kwargs: the function (shipped with cloudpickle, closures work) and its arguments.
        num_proc: ranks, one Spark task each; default ``sc.defaultParallelism``.
        start_timeout: seconds for all tasks to start and register; default
            ``HOROVOD_SPARK_START_TIMEOUT`` or 600.
        extra_mpi_args: a string appended to the mpirun command line (MPI only).
        env: variables added to the ranks' environment, a mapping (a dict under MPI, which
            forwards them with ``-x``; ``Exception`` otherwise); None means none; the executor's
            own environment is inherited either way. Filtered as ``horovodrun`` filters the
            driver's: no ``CUDA_VISIBLE_DEVICES``, ``OLDPWD``, ``BASH_FUNC_*`` or secret.
        stdout, stderr: streams that receive the ranks' output, each line prefixed
            ``[<rank>]<stdout>:``; None leaves it in the executor logs. Under MPI, mpirun's
            streams (its ``--tag-output`` prefixes; None: this process's).
        verbose: 0, 1 (log the number of ranks) or 2 (also the placement).
        nics: network interface names for the driver service and Gloo; default all.
        prefix_output_with_timestamp: put the local time before each prefix.
        executable: Python on the executors that runs the ranks; default the executor's own.
        use_mpi, use_gloo: the controller: ``use_mpi=True`` runs the ranks under ``mpirun``
            (:mod:`horovod.spark.mpi_run`; ``ValueError`` when horovod-core has no MPI); otherwise
            Gloo (``ValueError`` for both True, or both False).

    Raises:
        Exception: no active SparkContext, or the Spark job failed.
        TimeoutException: not all tasks started within ``start_timeout`` (the job group is cancelled).
        RuntimeError: a rank failed (named, with its traceback) or its Spark task was lost; under
            MPI, mpirun failed (its exit code, and the first failed rank's traceback).
    """
    sc = active_context()
    mpi = _use_mpi(use_mpi, use_gloo)
    if mpi and env is not None and not isinstance(env, dict):
        raise Exception("env argument must be a dict, not %s: %s" % (type(env), env))
    env = worker_env(env)
    num_proc = check_num_proc("num_proc", sc.defaultParallelism if num_proc is None else num_proc)
    start_timeout = default_start_timeout(start_timeout)
    nics = set(nics) if nics else None
    if verbose >= 1:
        logger.info("Running %d processes (inferred from spark.default.parallelism)...", num_proc)

    key = make_secret_key()
    payload = cloudpickle.dumps((fn, tuple(args), dict(kwargs)))
    if mpi:
        from horovod.spark.mpi_run import SparkMpiDriverService
        service = SparkMpiDriverService(num_proc, key, nics, payload)
    else:
        service = SparkDriverService(num_proc, key, nics, stdout, stderr, prefix_output_with_timestamp)
    settings = {"verbose": verbose, "executable": executable, "nics": nics}
    driver_addresses = service.addresses()

    def task_fn(index):
        from horovod.spark.task import task_exec

        return task_exec(index, driver_addresses, key, settings)

    job = SparkJob(sc, num_proc, task_fn, "horovod.spark job")
    rendezvous = None
    finished = False
    try:
        deadline = time.monotonic() + start_timeout
        while service.registered_count() < num_proc:
            _check(service, job)
            if time.monotonic() >= deadline:
                raise start_timeout_error(service.registered_count(), num_proc, start_timeout, job.group)
            service.wait(lambda: service.registered_count() >= num_proc or service.failures, _WAIT_S)

        registrations = service.registrations()
        host_plan = _host_plan(registrations)
        slots = hosts.get_host_assignments(
            hosts.parse_hosts(",".join("%s:%d" % (name, len(indices)) for name, indices in host_plan)), num_proc,
            num_proc)
        by_place = {(slot.hostname, slot.local_rank): slot for slot in slots}
        reached, gloo_interfaces = _interfaces(registrations, nics)
        if mpi:
            from horovod.spark.mpi_run import mpi_launch
            bodies = mpi_launch(service, host_plan, num_proc, driver_addresses, key, env, extra_mpi_args, stdout,
                                stderr, verbose, nics, prefix_output_with_timestamp, executable)
            finished = True
            return [cloudpickle.loads(body) for body in bodies]
        server_ip = driver_addresses[reached[0]][0][0]
        secret = make_secret_key()
        rendezvous = RendezvousServer(verbose=max(0, verbose - 1), secret=secret)
        port = rendezvous.start()
        rendezvous.init(slots)
        run_vars = gloo_run.create_run_env_vars(server_ip, gloo_interfaces, port)
        plans, rank_of_index = {}, {}
        for name, indices in host_plan:
            for local_rank, index in enumerate(indices):
                slot = by_place[(name, local_rank)]
                plans[index] = util.TaskPlan(slot.rank, gloo_run.create_worker_env(env, slot, run_vars),
                                             util.seal(key, secret), payload, stdout is not None, stderr is not None)
                rank_of_index[index] = slot.rank
        if verbose >= 2:
            for name, indices in host_plan:
                logger.info("horovod.spark: host %s: tasks %s -> ranks %s", name, indices,
                            [rank_of_index[i] for i in indices])
        service.set_plans(plans, rank_of_index)

        while not (service.all_done() and not job.alive()):
            _check(service, job)
            silent = service.silent_tasks(HEARTBEAT_TIMEOUT_S)
            if silent:
                raise RuntimeError("horovod.spark: the Spark task(s) of rank(s) %s stopped responding for %d s "
                                   "(their executor was lost?); the job was stopped"
                                   % ([service.rank_of_index(i) for i in silent], HEARTBEAT_TIMEOUT_S))
            service.wait(lambda: bool(service.failures), _WAIT_S)
        _check(service, job)
        results = sorted(job.results, key=lambda pair: pair[0])
        if [rank for rank, _ in results] != list(range(num_proc)):
            raise Exception("horovod.spark: the Spark job returned the results of ranks %s, expected 0..%d"
                            % ([rank for rank, _ in results], num_proc - 1))
        finished = True
        return [cloudpickle.loads(body) for _, body in results]
    finally:
        if not finished:
            service.abort("the driver stopped the job (horovod.spark.run raised)")
            job.cancel()
        job.join(timeout=60)
        if rendezvous is not None:
            rendezvous.stop()
        service.shutdown()


def _check(service, job):
    """Raise the job's failure, if there is one (a failed rank, a lost task, a failed Spark job)."""
    if service.failures:
        time.sleep(FAILURE_GRACE_S)
        failures = list(service.failures)
        lost = [f for f in failures if f[0] == "lost"]
        kind, index, rank, code, text = (lost or failures)[0]
        others = sorted({f[2] for f in failures if f[2] is not None and f[2] != rank})
        also = "\nRank(s) %s failed too." % ", ".join(map(str, others)) if others else ""
        if kind == "lost":
            raise RuntimeError("horovod.spark: a Spark task of the job was lost, so the job was stopped: %s%s"
                               % (text, also))
        raise RuntimeError(gloo_run.JOB_FAILED_MESSAGE.format(rank=rank, code=code, host="Spark task %d" % index)
                           + "Traceback of rank %d:\n%s%s" % (rank, text, also))
    if not job.alive() and job.error is not None:
        raise Exception("horovod.spark: the Spark job of the Horovod ranks failed: %s: %s"
                        % (type(job.error).__name__, job.error)) from job.error
    if not job.alive() and job.results is None:
        raise Exception("horovod.spark: the Spark job ended without results")
