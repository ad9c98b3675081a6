"""``horovod.spark.run_elastic``: an elastic Horovod job whose hosts are Spark tasks.

``max_num_proc`` Spark tasks are started (ordinary tasks, one slot each). Each task attempt
registers with the driver service under a host hash of its own and waits for work. Once
``num_proc`` tasks have registered, the launcher's elastic machinery runs the job
(:func:`horovod.runner.gloo_run.launch_elastic`: the :class:`~horovod.runner.elastic.driver.ElasticDriver`,
its authenticated rendezvous server and the workers' rounds), with the registered tasks as its host
discovery (:class:`~horovod.spark.driver.host_discovery.SparkDriverHostDiscovery`) and each worker
started by handing its task the rank's plan.

Recovery goes through Spark: a task whose rank fails raises, and Spark runs it again
(``spark.task.maxFailures``, see :mod:`horovod.spark.conf`) as a new host; a lost executor's tasks
are run again by Spark the same way. The elastic driver blacklists the failed host, carries on with
the survivors (at least ``min_num_proc``) and adds the new hosts at the next reset.
"""

import logging
import os
import time
import warnings

import cloudpickle

from horovod.common.rendezvous import make_secret_key
from horovod.runner import gloo_run
from horovod.runner.elastic.settings import ElasticSettings
from horovod.spark import runner
from horovod.spark.common import util
from horovod.spark.driver.elastic_service import SparkElasticDriverService
from horovod.spark.driver.host_discovery import SparkDriverHostDiscovery
from horovod.runner.common.util import env_names

logger = logging.getLogger(__name__)

# A task attempt not heard from for this long (it asks every 0.25 s) counts as lost. A lost
# executor is usually noticed sooner: Spark runs its tasks again, and a new attempt of a task
# means that the previous one is gone.
HEARTBEAT_TIMEOUT_S = 15.0
# After the job ended, how long the driver waits for the Spark job to end by itself (tasks that
# never got a slot keep it running) before it cancels the job group.
END_GRACE_S = 5.0
_WAIT_S = 0.1


def _gloo_built():
    from horovod.common.basics import HorovodBasics
    return HorovodBasics().gloo_built()


def run_elastic(fn, args=(), kwargs={}, num_proc=None, min_num_proc=None, max_num_proc=None,  # noqa: B006
                start_timeout=None, elastic_timeout=None, reset_limit=None, env=None, stdout=None, stderr=None,
                verbose=1, nics=None, prefix_output_with_timestamp=False, min_np=None, max_np=None):
    """Run ``fn(*args, **kwargs)`` as an elastic Horovod job (Gloo controller) on the executors of
    the active Spark context; return the results of the final round's ranks, in rank order.

    ``fn`` is written as for ``horovodrun --min-np``: it initialises Horovod and trains inside a
    function wrapped by ``hvd.elastic.run`` (``horovod.common.elastic.run_fn``), committing its
    state, so that it survives ranks coming and going.

    Args:
        fn, args, kwargs: the function (shipped with cloudpickle) and its arguments.
        num_proc: ranks to start with; default ``sc.defaultParallelism``.
        min_num_proc: the fewest ranks to go on with (default ``num_proc``).
        max_num_proc: the most ranks, and the number of Spark tasks started (default ``num_proc``).
        start_timeout: seconds for ``num_proc`` tasks to start and register; default
            ``HOROVOD_SPARK_START_TIMEOUT`` or 600.
        elastic_timeout: seconds to wait for ``min_num_proc`` hosts after a failure; default
            ``HOROVOD_ELASTIC_TIMEOUT`` or 600.
        reset_limit: the most resets, None for no limit.
        env, stdout, stderr, verbose, nics, prefix_output_with_timestamp: as for
            :func:`horovod.spark.run` (output lines carry the rank the worker had when it wrote them).
        min_np, max_np: deprecated aliases of ``min_num_proc`` and ``max_num_proc``.

    Raises:
        Exception: no active SparkContext.
        ValueError: bad arguments (counts not ``1 <= min_num_proc <= num_proc <= max_num_proc``,
            ``env`` not a mapping), or Horovod was built without Gloo.
        TimeoutException: fewer than ``num_proc`` tasks started within ``start_timeout`` (the job
            group is cancelled), or fewer than ``min_num_proc`` hosts for ``elastic_timeout``.
        RuntimeError: the job failed: the reset limit was reached, every worker failed, the Spark
            job failed (a task failed ``spark.task.maxFailures`` times), or a rank failed with no
            way to go on; the message carries the first failed rank's traceback.
    """
    sc = runner.active_context()
    if not _gloo_built():
        raise ValueError("horovod.spark.run_elastic needs Horovod built with Gloo; this horovod-core was built "
                         "without it (rebuild with HOROVOD_WITH_GLOO=1)")
    if min_np is not None:
        warnings.warn("min_np is deprecated, use min_num_proc", DeprecationWarning, stacklevel=2)
        min_num_proc = min_np if min_num_proc is None else min_num_proc
    if max_np is not None:
        warnings.warn("max_np is deprecated, use max_num_proc", DeprecationWarning, stacklevel=2)
        max_num_proc = max_np if max_num_proc is None else max_num_proc
    env = runner.worker_env(env)
    num_proc = runner.check_num_proc("num_proc", sc.defaultParallelism if num_proc is None else num_proc)
    min_num_proc = runner.check_num_proc("min_num_proc", num_proc if min_num_proc is None else min_num_proc)
    max_num_proc = runner.check_num_proc("max_num_proc", num_proc if max_num_proc is None else max_num_proc)
    if not min_num_proc <= num_proc <= max_num_proc:
        raise ValueError("expected min_num_proc <= num_proc <= max_num_proc, got %d, %d, %d"
                         % (min_num_proc, num_proc, max_num_proc))
    start_timeout = runner.default_start_timeout(start_timeout)
    if elastic_timeout is None:
        elastic_timeout = int(os.getenv(env_names.ELASTIC_TIMEOUT, "600"))
    nics = set(nics) if nics else None
    if verbose >= 1:
        logger.info("Running %d to %d processes (starting with %d)...", min_num_proc, max_num_proc, num_proc)

    key = make_secret_key()
    payload = cloudpickle.dumps((fn, tuple(args), dict(kwargs)))
    service = SparkElasticDriverService(key, nics, stdout, stderr, prefix_output_with_timestamp, HEARTBEAT_TIMEOUT_S)
    task_settings = {"verbose": verbose, "executable": None, "nics": nics}
    driver_addresses = service.addresses()

    def task_fn(index):
        from horovod.spark.task import elastic_task_exec

        return elastic_task_exec(index, driver_addresses, key, task_settings)

    job = runner.SparkJob(sc, max_num_proc, task_fn, "horovod.spark elastic job")

    def spark_failure():
        if job.alive() or job.error is None:
            return None
        return "horovod.spark: the Spark job of the elastic job failed: %s: %s" % (type(job.error).__name__,
                                                                                  job.error)

    finished = False
    try:
        deadline = time.monotonic() + start_timeout
        while service.registered_count() < num_proc:
            failure = spark_failure()
            if failure:
                raise RuntimeError(failure)
            if time.monotonic() >= deadline:
                raise runner.start_timeout_error(service.registered_count(), num_proc, start_timeout, job.group)
            service.wait(lambda: service.registered_count() >= num_proc, _WAIT_S)

        registrations = service.registrations()
        reached, gloo_interfaces = runner._interfaces(registrations, nics)
        server_ip = driver_addresses[reached[0]][0][0]
        secret = make_secret_key()
        settings = ElasticSettings(discovery=SparkDriverHostDiscovery(service), min_num_proc=min_num_proc,
                                   max_num_proc=max_num_proc, elastic_timeout=elastic_timeout,
                                   reset_limit=reset_limit, num_proc=num_proc, verbose=max(0, verbose - 1),
                                   key=secret, nics=nics, prefix_output_with_timestamp=prefix_output_with_timestamp)
        sealed_secret = util.seal(key, secret)

        def make_worker(driver, current, rendezvous, port):
            run_vars = gloo_run.create_run_env_vars(server_ip, gloo_interfaces, port, elastic=True)

            def label(host):
                info = driver.get_slot_info(host, 0)
                return info.rank if info.rank >= 0 else "?"

            service.label = label

            def create_worker(slot_info, events):
                plan = util.TaskPlan(slot_info.rank,
                                     gloo_run.create_worker_env(env, slot_info, run_vars,
                                                               **{env_names.ELASTIC_TIMEOUT: str(elastic_timeout)}),
                                     sealed_secret, payload, stdout is not None, stderr is not None)
                host = slot_info.hostname
                run = service.start_rank(host, plan)
                stopping = False
                while True:
                    code = service.outcome(host, run)
                    if code is not None:
                        return code, time.time()
                    if not stopping and any(event.is_set() for event in events):
                        service.stop_rank(host)
                        stopping = True
                    service.wait(lambda: service.outcome(host, run) is not None, _WAIT_S)

            return create_worker

        try:
            gloo_run.launch_elastic(settings, make_worker, min_hosts=1, should_stop=spark_failure)
        except RuntimeError as e:
            raise RuntimeError(str(e) + _first_failure(service)) from e
        results = sorted(service.results(), key=lambda r: r[0])
        sizes = {size for _, size, _ in results}
        if len(sizes) != 1 or [rank for rank, _, _ in results] != list(range(sizes.pop())):
            raise RuntimeError("horovod.spark.run_elastic: the job ended with the results of ranks %s (sizes %s), "
                               "not one result per rank of its final round"
                               % ([rank for rank, _, _ in results], sorted({size for _, size, _ in results})))
        finished = True
        return [cloudpickle.loads(body) for _, _, body in results]
    finally:
        service.end(util.Finish() if finished else util.Abort("the driver stopped the job"))
        job.join(timeout=END_GRACE_S if finished else 0)
        if job.alive():
            job.cancel()
        job.join(timeout=60)
        service.shutdown()


def _first_failure(service):
    """The first failed rank's traceback (or why its task was lost), for the job's error."""
    if not service.rank_failures:
        return ""
    index, attempt, done = service.rank_failures[0]
    return ("\nThe first rank to fail ran in Spark task %d (attempt %d)%s, exit code %s:\n%s"
            % (index, attempt, "" if done.rank is None else " as rank %d" % done.rank, done.exit_code,
               done.error or ""))
