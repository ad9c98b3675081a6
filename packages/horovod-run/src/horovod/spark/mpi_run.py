"""``horovod.spark.run`` with the MPI controller: ``mpirun`` on the driver, its daemons in the
Spark tasks.

Once every task has registered, the driver runs the launcher's ``mpirun`` command
(:func:`horovod.runner.mpi_run.mpi_run`) with one ``-H`` host per executor host (its host hash,
with as many slots as tasks there) and ``-mca plm_rsh_agent`` set to
:mod:`horovod.spark.driver.mpirun_rsh`: where Open MPI would ssh to a host to start its ``orted``
daemon, the agent asks the driver service to have that host's first task run the daemon's command
line. The daemons start the ranks (:mod:`horovod.spark.task.mpirun_exec_fn`), which fetch the
function from the driver service and send their results back to it. The other tasks only wait.

The service key reaches the agent through mpirun's environment and the ranks through their
daemon's (``_HOROVOD_SECRET_KEY``), never a command line or ``-x``.
"""

import itertools
import os
import sys
import time

from horovod.common.rendezvous import SECRET_ENV
from horovod.runner import mpi_run as runner_mpi_run
from horovod.runner.common.util import codec, network
from horovod.runner.common.util.settings import Settings
from horovod.spark.common import util
from horovod.spark.driver.driver_service import HEARTBEAT_TIMEOUT_S, SparkDriverService
from horovod.runner.common.util import env_names

# Variables of the driver's environment that mpirun and the daemons need where set.
_PASSED_ON = ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")


class _Command:
    def __init__(self, index, command, env):
        self.index = index
        self.command = command
        self.env = env
        self.handed = False
        self.exit_code = None


class SparkMpiDriverService(SparkDriverService):
    """:class:`SparkDriverService` plus the MPI requests: the rsh agent's commands, the tasks
    that run them, the payload and the ranks' results."""

    def __init__(self, num_proc, key, nics, payload):
        super().__init__(num_proc, key, nics, None, None, False)
        self._payload = payload
        self._first_task = {}  # host hash -> its first task index
        self._commands = {}
        self._ids = itertools.count(1)
        self._finished = False
        self.rank_results = {}  # rank -> (cloudpickled result or None, traceback or None)

    def set_hosts(self, host_plan):
        with self._lock:
            self._first_task = {name: indices[0] for name, indices in host_plan}

    def finish(self):
        with self._lock:
            self._finished = True

    def _handle(self, req, client_address):
        if isinstance(req, util.RunCommand):
            with self._lock:
                index = self._first_task.get(req.host)
                if index is None:
                    return None
                command_id = next(self._ids)
                self._commands[command_id] = _Command(index, req.command, req.env)
                return command_id
        if isinstance(req, util.CommandStatus):
            with self._lock:
                command = self._commands[req.command_id]
                if command.exit_code is not None:
                    return command.exit_code
                silent = time.monotonic() - self._last_seen.get(command.index, time.monotonic())
                if self.abort_reason is not None or silent > HEARTBEAT_TIMEOUT_S:
                    return 255  # as ssh does when the connection is lost
                return None
        if isinstance(req, util.PollCommand):
            with self._lock:
                self._last_seen[req.index] = time.monotonic()
                if self.abort_reason is not None:
                    return util.Abort(self.abort_reason)
                for command_id, command in self._commands.items():
                    if command.index == req.index and not command.handed:
                        command.handed = True
                        return util.TaskCommand(command_id, command.command, command.env)
                if self._finished:
                    return util.Finish()
                return None
        if isinstance(req, util.CommandDone):
            with self._lock:
                self._commands[req.command_id].exit_code = req.exit_code
                self._lock.notify_all()
            return network.AckResponse()
        if isinstance(req, util.GetPayload):
            return self._payload
        if isinstance(req, util.RankResult):
            with self._lock:
                self.rank_results[req.rank] = (req.result, req.error)
                self._lock.notify_all()
            return network.AckResponse()
        return super()._handle(req, client_address)


def mpi_launch(service, host_plan, num_proc, driver_addresses, key, env, extra_mpi_args, stdout, stderr, verbose,
               nics, prefix_output_with_timestamp, executable):
    """Run the job's ``mpirun`` (blocking); return the cloudpickled results in rank order.

    Raises ``RuntimeError`` naming mpirun's exit code (127: mpirun missing) and carrying the
    first failed rank's traceback, and ``Exception`` when no supported MPI is installed."""
    addresses = codec.dumps_base64(driver_addresses)
    task_settings = codec.dumps_base64({"verbose": verbose})
    agent = "%s -m horovod.spark.driver.mpirun_rsh %s %s" % (sys.executable, addresses, task_settings)
    extra = " ".join(a for a in (extra_mpi_args, "-x NCCL_DEBUG=INFO", '-mca plm_rsh_agent "%s"' % agent) if a)
    settings = Settings(hosts=",".join("%s:%d" % (name, len(indices)) for name, indices in host_plan),
                        num_proc=num_proc, verbose=verbose, extra_mpi_args=extra, run_func_mode=True,
                        prefix_output_with_timestamp=prefix_output_with_timestamp, nics=nics)
    mpi_env = dict(env)
    mpi_env.update({"PATH": os.environ.get("PATH", "/usr/bin:/bin"), env_names.CONTROLLER: "mpi",
                    env_names.CPU_OPERATIONS: "mpi"})
    for name in _PASSED_ON:
        if name in os.environ:
            mpi_env.setdefault(name, os.environ[name])
    mpi_env[SECRET_ENV] = key.hex()  # for the agent; mpi_run never names it with -x
    command = [executable or sys.executable, "-m", "horovod.spark.task.mpirun_exec_fn", addresses, task_settings]
    service.set_hosts(host_plan)
    service.set_plans({index: util.MpiPlan() for _, indices in host_plan for index in indices}, {})
    try:
        runner_mpi_run.mpi_run(settings, nics, mpi_env, command, stdout=stdout, stderr=stderr)
    except RuntimeError as e:
        failed = sorted((rank, error) for rank, (_, error) in service.rank_results.items() if error)
        if failed:
            raise RuntimeError("%s\nTraceback of rank %d:\n%s" % (e, failed[0][0], failed[0][1])) from e
        raise
    finally:
        service.finish()
    results = service.rank_results
    if sorted(results) != list(range(num_proc)) or any(body is None for body, _ in results.values()):
        raise RuntimeError("horovod.spark: mpirun ended without the results of ranks %s"
                           % sorted(set(range(num_proc)) - {r for r, (b, _) in results.items() if b is not None}))
    return [results[rank][0] for rank in range(num_proc)]


