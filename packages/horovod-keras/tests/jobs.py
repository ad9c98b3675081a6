"""One multi-process job per (Keras backend, world size), shared by all the tests.

Starting a rank costs seconds (importing TensorFlow or PyTorch, and Keras), a collective
milliseconds; so every worker body of tests/bodies.py runs in one job per backend and size, and
each test checks its part of the results against a numpy reference.
"""

import pytest
from horovod_testing import run_ranks

BACKENDS = ('tensorflow', 'torch')
SIZES = (1, 2, 3)

# One thread per rank: the ranks share the machine's cores, and TensorFlow's and PyTorch's own
# thread pools would only compete with each other.
THREADS_ENV = {'OMP_NUM_THREADS': '1', 'TF_NUM_INTRAOP_THREADS': '1',
               'TF_NUM_INTEROP_THREADS': '1', 'TF_CPP_MIN_LOG_LEVEL': '2'}


def run_all(workers):
    """Runs every worker body of ``workers`` (name -> function) in turn on this rank; a body that
    raises is recorded (and reported by the test that reads it) without stopping the others,
    which keep the ranks' collectives in step as long as every rank fails alike."""
    import traceback
    results = {}
    for name, worker in workers.items():
        try:
            results[name] = ('ok', worker())
        except Exception:  # noqa: BLE001 - reported by the test of this body
            results[name] = ('error', traceback.format_exc())
    return results


def job_fixture(workers):
    """A module-scoped fixture over every backend and size; its value ``job(name)`` returns
    ``(backend, np, [rank 0's result of workers[name], rank 1's, ...])`` and fails the test when
    that body raised on some rank."""

    @pytest.fixture(scope='module', params=[(b, n) for b in BACKENDS for n in SIZES],
                    ids=lambda p: f'{p[0]}-np{p[1]}')
    def job(request):
        backend, np_ = request.param
        results = run_ranks(np_, run_all, workers, env={'KERAS_BACKEND': backend, **THREADS_ENV},
                            timeout=300)

        def get(name):
            outcomes = [per_rank[name] for per_rank in results]
            errors = [f'rank {r}:\n{value}' for r, (status, value) in enumerate(outcomes)
                      if status != 'ok']
            if errors:
                pytest.fail(f'worker body {name!r} failed ({backend}, np={np_}):\n'
                            + '\n'.join(errors))
            return backend, np_, [value for _, value in outcomes]

        return get

    return job
