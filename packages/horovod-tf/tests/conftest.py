"""One multi-process job per world size (1, 2, 3), started once for the whole session and run
concurrently: importing TensorFlow costs seconds per process, a collective milliseconds. Each
test reads its body's results from every rank (see workers.py)."""

import concurrent.futures
import os
import sys

import pytest
from horovod_testing import run_ranks

sys.path.insert(0, os.path.dirname(__file__))

SIZES = (1, 2, 3)


def _job(np_):
    from workers import run_all
    # Dynamic process sets for the shared process-set suite; quiet TF logs. The engine wakes at
    # once when work is queued, so a longer cycle time only saves the idle cycles' CPU (each
    # idle 1 ms cycle costs ~10% of a core per process: too much for 6 ranks on 2 cores).
    env = {'HOROVOD_DYNAMIC_PROCESS_SETS': '1', 'TF_CPP_MIN_LOG_LEVEL': '2', 'OMP_NUM_THREADS': '1',
           'HOROVOD_CYCLE_TIME': '20'}
    return run_ranks(np_, run_all, env=env, timeout=600)


@pytest.fixture(scope='session')
def jobs():
    with concurrent.futures.ThreadPoolExecutor(len(SIZES)) as pool:
        futures = {n: pool.submit(_job, n) for n in SIZES}
    outcomes = {}
    for n, future in futures.items():
        try:
            outcomes[n] = ('ok', future.result())
        except Exception as e:  # noqa: BLE001 - each test reports the job's failure
            outcomes[n] = ('failed', str(e))
    for n, (status, value) in outcomes.items():
        if status == 'ok':
            # Where the time goes, for `pytest -s`.
            print(f'np={n} seconds per body (rank 0):',
                  {k: round(v, 1) for k, v in value[0]['seconds'].items()})
    return outcomes


@pytest.fixture(params=SIZES, ids=lambda n: f'np{n}')
def result(request, jobs):
    """``result(name)`` -> (np, [rank 0's value of workers.name, rank 1's, ...]); fails the test
    with the rank's traceback when the body raised on some rank or the job failed."""
    n = request.param
    status, value = jobs[n]
    if status != 'ok':
        pytest.fail(f'the np={n} job failed:\n{value}')

    def get(name):
        per_rank = [r[name] for r in value]
        for rank, (state, v) in enumerate(per_rank):
            if state != 'ok':
                pytest.fail(f'np={n} rank {rank} {name}:\n{v}')
        return n, [v for _, v in per_rank]

    return get
