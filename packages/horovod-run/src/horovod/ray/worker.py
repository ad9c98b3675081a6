"""The Ray actor class of one Horovod rank."""

import os
import socket
from typing import Any, Callable, Dict, List, Optional

from horovod.runner.common.util import env_names


def _rank_note(env) -> str:
    return "raised in Horovod rank %s of %s (Ray node %s, host %s, pid %d)" % (
        env.get(env_names.RANK, "?"), env.get(env_names.SIZE, "?"),
        env.get(env_names.HOSTNAME, "?"), socket.gethostname(), os.getpid())


class BaseHorovodWorker:
    """One Horovod rank: :class:`~horovod.ray.RayExecutor` runs it as a Ray actor, one per rank.

    Its environment (``os.environ`` of the actor's process) receives the rank's ``HOROVOD_*``
    variables before the user's functions run, so ``hvd.init()`` inside them joins the job.

    Args:
        world_rank: the rank of this worker.
        world_size: the number of workers of the job.
    """

    executable = None

    def __init__(self, world_rank: int = 0, world_size: int = 1):
        os.environ[env_names.HOSTNAME] = self.node_id()
        os.environ[env_names.RANK] = str(world_rank)
        os.environ[env_names.SIZE] = str(world_size)
        self._queue = None

    def node_id(self) -> str:
        """The id (hex) of the Ray node this worker runs on; the host name outside Ray."""
        import ray
        if not ray.is_initialized():
            return socket.gethostname()
        return ray.get_runtime_context().get_node_id()

    def hostname(self) -> str:
        """The host name of the machine this worker runs on."""
        return socket.gethostname()

    def get_gpu_ids(self) -> List[int]:
        """The ids of the GPUs Ray assigned to this worker (empty without GPUs)."""
        import ray
        return [int(i) for i in ray.get_gpu_ids()]

    def update_env_vars(self, env_vars: Dict[str, Any]):
        """Set ``env_vars`` (values through ``str()``) in this worker's environment."""
        os.environ.update({str(k): str(v) for k, v in env_vars.items()})

    def env_vars(self) -> Dict[str, str]:
        """This worker's environment."""
        return dict(os.environ)

    def start_executable(self, executable_cls: Optional[type] = None,
                         executable_args: Optional[List] = None,
                         executable_kwargs: Optional[Dict] = None):
        """Create ``executable_cls(*executable_args, **executable_kwargs)`` as ``self.executable``
        (the object :meth:`execute` hands to its functions); nothing when it is None."""
        if executable_cls is not None:
            self.executable = executable_cls(*(executable_args or []), **(executable_kwargs or {}))

    def execute(self, func: Callable[[Any], Any]) -> Any:
        """Return ``func(self.executable)``. An exception it raises carries a note naming this
        rank, its Ray node and its process, which Ray's error at the caller shows."""
        try:
            return func(self.executable)
        except Exception as e:
            e.add_note(_rank_note(os.environ))
            raise

    def set_queue(self, queue):
        """Send this worker's :func:`horovod.ray.ray_logger.log` records to ``queue`` (a
        ``ray.util.queue.Queue`` drained by the driver's callbacks; None: drop them)."""
        from horovod.ray import ray_logger
        self._queue = queue
        ray_logger.configure(queue)
