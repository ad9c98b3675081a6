"""What every mode of :class:`~horovod.ray.RayExecutor` offers, and the parameters they share."""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional


@dataclass
class BaseParams:
    """Resources of one worker: ``cpus_per_worker`` CPUs and, with ``use_gpu``,
    ``gpus_per_worker`` GPUs (default 1)."""

    cpus_per_worker: int = 1
    use_gpu: bool = False
    gpus_per_worker: Optional[int] = None

    def __post_init__(self):
        if self.gpus_per_worker is not None and not self.use_gpu:
            raise ValueError("gpus_per_worker=%r is set but use_gpu is False; set use_gpu=True to "
                             "give workers GPUs" % (self.gpus_per_worker,))
        if self.use_gpu and isinstance(self.gpus_per_worker, int) and self.gpus_per_worker < 1:
            raise ValueError("gpus_per_worker must be at least 1 when use_gpu is True, got %d"
                             % self.gpus_per_worker)
        if self.gpus_per_worker is None:
            self.gpus_per_worker = int(self.use_gpu)
        if not isinstance(self.cpus_per_worker, (int, float)) or self.cpus_per_worker < 0:
            raise ValueError("cpus_per_worker must be a non-negative number, got %r"
                             % (self.cpus_per_worker,))


class Adapter(ABC):
    """The operations of one mode (static or elastic) of :class:`~horovod.ray.RayExecutor`."""

    @abstractmethod
    def start(self, executable_cls: type = None, executable_args: Optional[List] = None,
              executable_kwargs: Optional[Dict] = None, extra_env_vars: Optional[Dict] = None):
        """Create the workers and make them a Horovod job."""

    @abstractmethod
    def execute(self, fn: Callable[[Any], Any], callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """``fn(executable)`` on every worker; the results in rank order."""

    @abstractmethod
    def run(self, fn: Callable[..., Any], args: Optional[List] = None, kwargs: Optional[Dict] = None,
            callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """``fn(*args, **kwargs)`` on every worker; the results in rank order."""

    @abstractmethod
    def run_remote(self, fn: Callable[..., Any], args: Optional[List] = None,
                   kwargs: Optional[Dict] = None) -> List[Any]:
        """Like :meth:`run` without waiting: Ray object refs in rank order."""

    @abstractmethod
    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(executable)`` on rank 0 only."""

    @abstractmethod
    def shutdown(self):
        """Release the workers and what was created for them."""
