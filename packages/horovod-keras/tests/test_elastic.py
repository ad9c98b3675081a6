"""Elastic horovodrun end to end with Keras 3 on both backends (``horovod.keras.elastic`` and
``horovod.tensorflow.keras.elastic``: ``KerasState``, the three state callbacks, ``run``): real
workers on two hosts of the multi-host test bed (network namespaces with their own sshd,
ci/testbed.sh; the ``testbed`` fixture), a host added then removed through a discovery script,
and a worker killed. The script
(elastic_scripts/keras_elastic_train.py) trains the same global batches whatever the world size,
so every rank's final weights must equal a numpy replay of the training."""

import os
import pathlib
import signal
import sys

import numpy as np
import pytest
from horovod_testing.elastic import ElasticJob, check_finals, check_prefixes, discovery_script

from jobs import THREADS_ENV

TRAIN = str(pathlib.Path(__file__).resolve().parent / "elastic_scripts" / "keras_elastic_train.py")
N, G, LR, MOMENTUM = 48, 8, 0.05, 0.5


def env(bed, backend, module="horovod.keras"):
    """The environment of horovodrun on the bed (its ssh wrapper and agent) with the test's."""
    return {**bed.env(), **THREADS_ENV, "KERAS_BACKEND": backend, "MODULE": module,
            "HOROVOD_CYCLE_TIME": "5", "STEP_SLEEP": "0.1"}


def reference(epochs):
    """The script's training in one process, in numpy: Keras SGD with momentum
    (``m = momentum * m - lr * g; w += m``) on the mean squared error of each global batch."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((N, 3))
    Y = X @ np.array([1.5, -2.0, 0.5]) + 0.1
    order = np.random.default_rng(7).permutation(N)
    w, b = np.zeros(3), 0.0
    mw, mb = np.zeros(3), 0.0
    for _ in range(epochs):
        for step in range(N // G):
            batch = order[step * G:(step + 1) * G]
            err = X[batch] @ w + b - Y[batch]
            gw, gb = 2 * X[batch].T @ err / G, 2 * err.mean()
            mw, mb = MOMENTUM * mw - LR * gw, MOMENTUM * mb - LR * gb
            w, b = w + mw, b + mb
    return np.concatenate([w, [b]])


def summary(job):
    """Rank 0's steps as runs of ``size:epoch/first batch-last batch``, for failure messages."""
    runs = []
    for r in job.steps():
        if r["rank"] != 0:
            continue
        if runs and runs[-1][:2] == [r["size"], r["epoch"]]:
            runs[-1][3] = r["batch"]
        else:
            runs.append([r["size"], r["epoch"], r["batch"], r["batch"]])
    return "rank 0 trained (size:epoch/batches): " + " ".join("%d:%d/%d-%d" % tuple(x) for x in runs)


# Keras's SGD on the torch backend deviates from the float64 reference by ~1e-8 (plain Keras,
# without Horovod, reaches the same weights); one epoch more or less moves them by > 1e-4.
RTOL = {"tensorflow": 1e-9, "torch": 1e-6}


def check_training(job, epochs, backend):
    check_prefixes(job)
    weights = check_finals(job)
    np.testing.assert_allclose(weights, reference(epochs), rtol=RTOL[backend], atol=1e-12,
                               err_msg=summary(job))
    steps = job.steps()
    # Every epoch ran to its last batch (each rank has N / G batches an epoch at every size),
    # state.epoch (kept by UpdateEpochStateCallback) was the epoch being trained at every step,
    # and it counts every epoch at the end.
    assert {(e, N // G - 1) for e in range(epochs)} <= {(r["epoch"], r["batch"]) for r in steps}
    assert max(r["epoch"] for r in steps) == epochs - 1
    assert all(r["state_epoch"] == r["epoch"] for r in steps), steps
    assert all(r["epoch"] == epochs for _, r in job.records("FINAL"))


def test_reference_is_not_trivial():
    assert np.abs(reference(6)).max() > 0.5
    assert np.abs(reference(6) - reference(5)).max() > 1e-4


@pytest.mark.parametrize("backend", ["tensorflow", "torch"])
def test_host_added_then_removed(testbed, backend, tmp_path):
    host1, host2 = testbed.hosts[0][1], testbed.hosts[1][1]
    script, set_hosts = discovery_script(str(tmp_path))
    set_hosts([host1 + ":1"])
    # Enough epochs that the job cannot end before its size-2 phase and the removal: starting the
    # new host's worker (a Python and framework import) takes seconds on a loaded machine, and rank
    # 0 trains on at size 1 meanwhile (12 epochs were all spent there once, under load 10).
    epochs = 30
    args = ["--verbose", "--network-interface", "hvdbr0", "-np", "1", "--min-np", "1", "--max-np", "2",
            "--host-discovery-script", script, sys.executable, TRAIN, str(epochs)]
    with ElasticJob(args, env(testbed, backend)) as job:
        job.wait_for(lambda: len(job.steps()) >= 4, "steps at size 1")
        set_hosts([host1 + ":1", host2 + ":1"])
        job.wait_for(lambda: sum(r["size"] == 2 for r in job.steps()) >= 12, "steps at size 2",
                     timeout=120)
        set_hosts([host1 + ":1"])
        code, output = job.finish()
    assert code == 0, output
    assert job.sizes() == [1, 2, 1], "sizes %s; %s\n%s" % (job.sizes(), summary(job), output)
    assert {r["host"] for r in job.steps() if r["size"] == 2} == {host1, host2}
    check_training(job, epochs, backend)


@pytest.mark.parametrize("backend, module", [("tensorflow", "horovod.tensorflow.keras"),
                                             ("torch", "horovod.keras")])
def test_killed_worker_blacklists_its_host(testbed, backend, module):
    host1, host2 = testbed.hosts[0][1], testbed.hosts[1][1]
    epochs = 8
    args = ["--verbose", "--network-interface", "hvdbr0", "-np", "2", "--min-np", "1",
            "-H", "%s:1,%s:1" % (host1, host2), sys.executable, TRAIN, str(epochs)]
    with ElasticJob(args, env(testbed, backend, module)) as job:
        job.wait_for(lambda: len(job.steps()) >= 16, "steps at size 2", timeout=120)
        victim = next(r for r in job.steps() if r["host"] == host2)
        os.kill(victim["pid"], signal.SIGKILL)
        code, output = job.finish()
    assert code == 0, output
    assert "blacklisting host " + host2 in output, output
    assert job.sizes() == [2, 1], output
    assert {r["host"] for r in job.steps() if r["size"] == 1} == {host1}
    check_training(job, epochs, backend)
