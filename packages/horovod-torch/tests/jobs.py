"""One multi-process job per world size, shared by all the tests of a module.

Starting ranks costs seconds (importing torch), a collective milliseconds; so each test module
runs all of its worker bodies in one job per size, and each test checks its part of the results.
"""

import pytest
from horovod_testing import run_ranks


def run_all(workers):
    """Runs every worker body of ``workers`` (name -> function) in turn on this rank."""
    return {name: worker() for name, worker in workers.items()}


def job_fixture(workers, sizes=(1, 2, 3), env=None, timeout=120):
    """A module-scoped fixture over ``sizes``; its value ``job(name)`` returns
    ``(np, [rank 0's result of workers[name], rank 1's, ...])``. ``env``: extra environment
    variables for every rank; ``timeout``: seconds the whole job may take."""

    @pytest.fixture(scope='module', params=list(sizes), ids=lambda n: f'np{n}')
    def job(request):
        np_ = request.param
        results = run_ranks(np_, run_all, workers, env=env, timeout=timeout)
        return lambda name: (np_, [per_rank[name] for per_rank in results])

    return job

