"""Runs a function as a real multi-process Horovod job (see README.md)."""

import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types

import cloudpickle

from horovod.common.rendezvous import SECRET_ENV, RendezvousServer

__all__ = ["run_ranks", "RanksFailed", "init_error", "run_script"]


class RanksFailed(AssertionError):
    """One or more ranks raised, exited abnormally or timed out."""


def init_error():
    """On a rank of ``run_ranks``: calls ``hvd.init()`` (the core's) and returns the message of the
    ValueError it raises, or None when it succeeds (Horovod then stays up until the rank exits)."""
    from horovod.common.basics import HorovodBasics
    try:
        HorovodBasics().init()
    except ValueError as e:
        return str(e)
    return None


def run_script(script, *args):
    """On a rank of ``run_ranks``: runs ``script`` (a path) as ``__main__`` with ``args`` as its
    command line; returns what it printed."""
    import contextlib
    import io
    import runpy
    output = io.StringIO()
    argv = sys.argv
    sys.argv = [script, *args]
    try:
        with contextlib.redirect_stdout(output):
            runpy.run_path(script, run_name='__main__')
    finally:
        sys.argv = argv
    return output.getvalue()


def _plan(np_, hosts=None):
    """One slot per rank. ``hosts``: None (every rank on one host, named "localhost"), an int H
    (H hosts of np_ // H consecutive ranks each) or a list of ranks per host (consecutive ranks,
    any sizes). Fake hosts are named 127.0.0.1, 127.0.0.2, ...: distinct names, so the engine
    groups ranks by them, that are all addresses of this machine, so Gloo can listen on them."""
    if hosts is None:
        return [types.SimpleNamespace(hostname="localhost", rank=r, local_rank=r, cross_rank=0, size=np_,
                                      local_size=np_, cross_size=1) for r in range(np_)]
    if isinstance(hosts, int):
        if hosts < 1 or np_ % hosts:
            raise ValueError(f"hosts={hosts} does not divide np={np_}")
        hosts = [np_ // hosts] * hosts
    hosts = list(hosts)
    if sum(hosts) != np_ or min(hosts) < 1:
        raise ValueError(f"hosts={hosts} must be positive and add up to np={np_}")
    slots = []
    for h, local_size in enumerate(hosts):
        for local_rank in range(local_size):
            # Upstream's cross communicator: the hosts that have this local rank.
            cross = [g for g, n in enumerate(hosts) if n > local_rank]
            slots.append(types.SimpleNamespace(
                hostname=f"127.0.0.{h + 1}", rank=len(slots), local_rank=local_rank, local_size=local_size,
                cross_rank=cross.index(h), cross_size=len(cross), size=np_))
    return slots


def _tail(path, limit=4000):
    with open(path, "rb") as f:
        data = f.read()
    return data[-limit:].decode("utf-8", "replace")


def run_ranks(np_, fn, *args, env=None, timeout=120, hosts=None):
    """Runs ``fn(*args)`` on ranks 0..np_-1, each in its own process, and returns the list of
    return values in rank order.

    Args:
        np_ (int): number of ranks (processes).
        fn: a picklable function (cloudpickle; module-level test functions are fine).
        env (dict): extra environment variables for every rank (values are converted with str).
            Each rank's TMPDIR is a folder of the job's, removed at the end (``env`` may override it).
        timeout (float): seconds the whole job may take.
        hosts: lay the ranks out on fake hosts of this machine (distinct HOROVOD_HOSTNAME and the
            matching LOCAL_*/CROSS_* variables): an int H for H hosts of np_ // H ranks, or a list
            of ranks per host (consecutive ranks; sizes may differ). None: one host.

    Raises:
        ValueError: ``hosts`` does not fit ``np_``.
        RanksFailed: some rank raised (its traceback is included), died, or the job timed out
            (every rank's remaining processes are killed first).
    """
    plan = _plan(np_, hosts)
    server = RendezvousServer()
    port = server.start()
    try:
        server.init(plan)
    except BaseException:
        server.stop()
        raise
    procs = []
    # The job's folder: the payload, each rank's output and result, and the ranks' temporary
    # folder (their TMPDIR, so whatever they make with tempfile goes too). Removed below, whatever
    # happens (only a SIGKILL of this process leaves it behind).
    workdir = tempfile.mkdtemp(prefix="hvdtest-")
    try:
        rank_tmp = os.path.join(workdir, "tmp")
        os.mkdir(rank_tmp)
        payload = os.path.join(workdir, "payload.pkl")
        with open(payload, "wb") as f:
            # sys.path first, so that the worker can import the test's own modules before unpickling.
            pickle.dump({"sys_path": sys.path, "call": cloudpickle.dumps((fn, args))}, f)
        for rank in range(np_):
            slot = plan[rank]
            child_env = dict(os.environ)
            child_env.update({
                "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(np_),
                "HOROVOD_LOCAL_RANK": str(slot.local_rank), "HOROVOD_LOCAL_SIZE": str(slot.local_size),
                "HOROVOD_CROSS_RANK": str(slot.cross_rank), "HOROVOD_CROSS_SIZE": str(slot.cross_size),
                "HOROVOD_HOSTNAME": slot.hostname,
                "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
                "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
                SECRET_ENV: server.secret.hex(),
                "PYTHONUNBUFFERED": "1",
                "TMPDIR": rank_tmp,
            })
            child_env.update({k: str(v) for k, v in (env or {}).items()})
            out = open(os.path.join(workdir, f"rank{rank}.out"), "wb")
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "horovod_testing._worker", payload,
                 os.path.join(workdir, f"rank{rank}.result")],
                env=child_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
            out.close()
        deadline = time.monotonic() + timeout
        timed_out = False
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
        if timed_out:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        return _collect(np_, procs, workdir, timed_out, timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        server.stop()
        # The payload and the ranks' output and results: read by _collect, which has returned.
        shutil.rmtree(workdir, ignore_errors=True)


def _collect(np_, procs, workdir, timed_out, timeout):
    results, failures = [], []
    for rank, p in enumerate(procs):
        result_path = os.path.join(workdir, f"rank{rank}.result")
        output = _tail(os.path.join(workdir, f"rank{rank}.out"))
        if os.path.exists(result_path):
            with open(result_path, "rb") as f:
                status, value = cloudpickle.load(f)
        else:
            status, value = "died", f"exit status {p.returncode}"
        if status == "ok":
            results.append(value)
        else:
            failures.append(f"--- rank {rank} ({status}):\n{value}\n--- rank {rank} output:\n{output}")
    if timed_out:
        failures.insert(0, f"the job did not finish within {timeout} s; remaining ranks were killed")
    if failures:
        raise RanksFailed("\n".join(failures))
    return results
