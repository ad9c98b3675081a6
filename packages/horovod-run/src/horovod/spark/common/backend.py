"""Where an Estimator's ranks run: a :class:`Backend` runs a function on every rank and returns
the results in rank order. :class:`SparkBackend` runs them as Spark tasks through
:func:`horovod.spark.run`, so its secrets, failure handling and placement apply to ``fit``."""

import os


class Backend:
    """The interface of a backend."""

    def run(self, fn, args=(), kwargs=None, env=None):
        """Run ``fn(*args, **kwargs)`` on every rank with ``env`` (a dict) added to the ranks'
        environment; return the results in rank order.

        Args:
            fn: a picklable function (cloudpickle), the same on every rank.
            args: its positional arguments (a tuple).
            kwargs: its keyword arguments (a dict; None for none).
            env: variables added to the ranks' environment (a dict of str -> str; None for none).

        Returns:
            A list of ``fn``'s return values, one per rank, in rank order.

        Raises:
            NotImplementedError: always, here; a subclass implements it.
        """
        raise NotImplementedError()

    def num_processes(self):
        """The number of ranks :meth:`run` starts (int).

        Raises:
            NotImplementedError: always, here; a subclass implements it.
        """
        raise NotImplementedError()


class SparkBackend(Backend):
    """Runs the ranks with :func:`horovod.spark.run` on the active SparkContext.

    Args:
        num_proc: ranks (int >= 1); default the context's ``defaultParallelism``.
        env: the variables added to the ranks' environment (a mapping); default this process's
            environment without ``CUDA_VISIBLE_DEVICES``.
        **kwargs: further arguments of :func:`horovod.spark.run` (``start_timeout``, ``stdout``,
            ``stderr``, ``verbose``, ``nics``, ``use_mpi``, ...).

    Raises:
        ValueError: ``num_proc`` is not None and not an int >= 1 (a bool counts as not an int).
    """

    def __init__(self, num_proc=None, env=None, **kwargs):
        if num_proc is not None and (isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1):
            raise ValueError("num_proc must be a positive integer, got %r" % (num_proc,))
        self._num_proc = num_proc
        self._env = env
        self._kwargs = kwargs

    def run(self, fn, args=(), kwargs=None, env=None):
        """Run ``fn(*args, **kwargs)`` as :meth:`num_processes` ranks with
        :func:`horovod.spark.run` and this backend's further arguments.

        Args:
            fn: a picklable function (cloudpickle), run on every rank.
            args: its positional arguments (a tuple).
            kwargs: its keyword arguments (a dict; None for none).
            env: variables added, over the backend's ``env``, to the ranks' environment (a dict;
                None for none). ``CUDA_VISIBLE_DEVICES`` of the backend's environment is dropped;
                :func:`horovod.spark.run` filters the rest as it does for every job.

        Returns:
            A list of ``fn``'s return values, one per rank, in rank order.

        Raises:
            Exception: no active SparkContext, or the Spark job failed (from
                :func:`horovod.spark.run`, as are the next ones).
            TimeoutException: not all tasks started within the ``start_timeout`` given.
            RuntimeError: a rank failed (named, with its traceback).
        """
        from horovod.spark.runner import run

        full_env = dict(self._env if self._env is not None else os.environ)
        full_env.pop("CUDA_VISIBLE_DEVICES", None)
        full_env.update(env or {})
        return run(fn, args=args, kwargs=kwargs or {}, num_proc=self.num_processes(), env=full_env, **self._kwargs)

    def num_processes(self):
        """The number of ranks (int): ``num_proc``, or, when it was None, the active
        SparkContext's ``defaultParallelism`` read on the first call and kept.

        Raises:
            Exception: ``num_proc`` was None and there is no active SparkContext.
        """
        if self._num_proc is None:
            from horovod.spark.runner import active_context
            self._num_proc = active_context().defaultParallelism
        return self._num_proc
