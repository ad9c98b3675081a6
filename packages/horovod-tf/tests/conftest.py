"""One multi-process job per world size (1, 2, 3), started once for the whole session and run
concurrently: importing TensorFlow costs seconds per process, a collective milliseconds. Each
test reads its body's results from every rank (see workers.py)."""

import concurrent.futures
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

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


EXAMPLE = (pathlib.Path(__file__).resolve().parents[3] / 'docs' / 'examples' / 'tensorflow2' /
           'tensorflow2_digits.py')


@pytest.fixture(scope='session')
def example_process():
    """The digits example under ``horovodrun --gloo -np 2``, started at once so that it runs while
    the jobs below run. Yields ``(Popen, stdout path, stderr path)``; killed at the end if still
    running."""
    horovodrun = shutil.which('horovodrun') or str(pathlib.Path(sys.executable).parent / 'horovodrun')
    if not pathlib.Path(horovodrun).exists():
        pytest.fail('horovodrun is not installed (pip install horovod-run)')
    workdir = tempfile.mkdtemp(prefix='hvdtf-example-')
    out_path, err_path = os.path.join(workdir, 'stdout'), os.path.join(workdir, 'stderr')
    with open(out_path, 'wb') as out, open(err_path, 'wb') as err:
        proc = subprocess.Popen([horovodrun, '--gloo', '-np', '2', '-H', 'localhost:2', sys.executable, str(EXAMPLE)],
                                stdout=out, stderr=err, env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '2'})
    try:
        yield proc, out_path, err_path
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope='session')
def jobs(example_process):
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

# The multi-host test bed (the elastic tests): the ``testbed`` fixture and its leftover check.
from horovod_testing.pytest_testbed import *  # noqa: E402, F403
