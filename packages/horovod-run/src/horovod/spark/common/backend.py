"""Where an Estimator's ranks run: a :class:`Backend` runs a function on every rank and returns
the results in rank order. :class:`SparkBackend` runs them as Spark tasks through
:func:`horovod.spark.run`, so its secrets, failure handling and placement apply to ``fit``."""

import os


class Backend:
    """The interface of a backend."""

    def run(self, fn, args=(), kwargs=None, env=None):
        """Run ``fn(*args, **kwargs)`` on every rank with ``env`` (a dict) added to the ranks'
        environment; return the results in rank order."""
        raise NotImplementedError()

    def num_processes(self):
        """The number of ranks (int)."""
        raise NotImplementedError()


class SparkBackend(Backend):
    """Runs the ranks with :func:`horovod.spark.run` on the active SparkContext.

    Args:
        num_proc: ranks (int >= 1); default the context's ``defaultParallelism``.
        env: the variables added to the ranks' environment (a mapping); default this process's
            environment without ``CUDA_VISIBLE_DEVICES``.
        **kwargs: further arguments of :func:`horovod.spark.run` (``start_timeout``, ``stdout``,
            ``stderr``, ``verbose``, ``nics``, ``use_mpi``, ...).
    """

    def __init__(self, num_proc=None, env=None, **kwargs):
        if num_proc is not None and (isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1):
            raise ValueError("num_proc must be a positive integer, got %r" % (num_proc,))
        self._num_proc = num_proc
        self._env = env
        self._kwargs = kwargs

    def run(self, fn, args=(), kwargs=None, env=None):
        from horovod.spark.runner import run

        full_env = dict(self._env if self._env is not None else os.environ)
        full_env.pop("CUDA_VISIBLE_DEVICES", None)
        full_env.update(env or {})
        return run(fn, args=args, kwargs=kwargs or {}, num_proc=self.num_processes(), env=full_env, **self._kwargs)

    def num_processes(self):
        if self._num_proc is None:
            from horovod.spark.runner import active_context
            self._num_proc = active_context().defaultParallelism
        return self._num_proc
