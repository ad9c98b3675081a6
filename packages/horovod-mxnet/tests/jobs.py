"""One multi-process job per world size for the whole test session.

Starting a rank costs seconds (importing MXNet on a busy 2-core machine), a collective
milliseconds. So the test modules register their worker bodies here with ``@worker`` when pytest
imports them, the first test that needs results at a size runs every registered body in one job
of that size, and each test then checks its own body's results.
"""

import functools
import traceback

from horovod_testing import run_ranks

SIZES = (1, 2, 3)

# name -> function run on every rank; it returns a picklable result.
WORKERS = {}

# Every rank may create dynamic process sets (spec mxnet.md §7: the upstream files set it too),
# and start a timeline (which shows the names the engine saw).
ENV = {'HOROVOD_DYNAMIC_PROCESS_SETS': '1', 'HOROVOD_TIMELINE': 'DYNAMIC'}


def worker(fn):
    """Registers ``fn`` (a module-level function of a test module) as a worker body."""
    WORKERS[f'{fn.__module__}.{fn.__name__}'] = fn
    return fn


def _run_all(workers):
    """Runs every body in turn on this rank; a body that raises records its traceback, so that
    one failure fails its own test only (the others still run)."""
    import horovod.mxnet as hvd
    hvd.init()
    results = {}
    for name, fn in workers.items():
        try:
            results[name] = ('ok', fn())
        except Exception:  # noqa: BLE001 (reported by the test that owns the body)
            results[name] = ('error', traceback.format_exc())
    return results


@functools.lru_cache(maxsize=None)
def _job(np_):
    return run_ranks(np_, _run_all, dict(WORKERS), env=ENV, timeout=240)


def results(fn, np_):
    """The list of every rank's result of worker ``fn`` in the job of size ``np_``; raises
    AssertionError with the rank's traceback when the body failed on some rank."""
    name = f'{fn.__module__}.{fn.__name__}'
    per_rank = [r[name] for r in _job(np_)]
    errors = [f'rank {r}:\n{value}' for r, (status, value) in enumerate(per_rank)
              if status != 'ok']
    assert not errors, '\n'.join(errors)
    return [value for _, value in per_rank]
