"""Elastic horovodrun end to end with TensorFlow 2 (``horovod.tensorflow.elastic``:
``TensorFlowKerasState`` and ``run``): real workers on two hosts of the multi-host test bed
(network namespaces with their own sshd, ci/testbed.sh; the ``testbed`` fixture), a host added
then removed through a discovery script, and a worker killed.
The script (elastic_scripts/tf_elastic_train.py) trains the same global batches whatever the
world size, so every rank's final weights must equal a numpy replay of the training."""

import os
import pathlib
import signal
import sys

import numpy as np
from horovod_testing.elastic import ElasticJob, check_finals, check_prefixes, discovery_script

TRAIN = str(pathlib.Path(__file__).resolve().parent / "elastic_scripts" / "tf_elastic_train.py")
N, G, LR, MOMENTUM = 48, 8, 0.05, 0.5
ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": "1", "HOROVOD_CYCLE_TIME": "5"}


def bed_env(bed, **extra):
    """The environment of horovodrun on the bed (its ssh wrapper and agent) with the test's."""
    return {**bed.env(), **ENV, **extra}


def reference(epochs):
    """The script's training in one process, in numpy: Keras SGD with momentum
    (``m = momentum * m - lr * g; w += m``) on the mean squared error of each global batch."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((N, 3))
    Y = X @ np.array([1.5, -2.0, 0.5]) + 0.1
    w, b = np.zeros(3), 0.0
    mw, mb = np.zeros(3), 0.0
    for epoch in range(epochs):
        perm = np.random.default_rng([7, epoch]).permutation(N)
        for step in range(N // G):
            batch = perm[step * G:(step + 1) * G]
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


def check_training(job, epochs):
    check_prefixes(job)
    weights = check_finals(job)
    np.testing.assert_allclose(weights, reference(epochs), rtol=1e-9, atol=1e-12,
                               err_msg=summary(job))
    assert max(r["epoch"] for r in job.steps()) == epochs - 1


def test_reference_is_not_trivial():
    # The test's comparisons mean something: training moves the weights, and one step more or
    # less (a lost or repeated commit) changes them.
    assert np.abs(reference(6)).max() > 0.5
    assert np.abs(reference(6) - reference(5)).max() > 1e-4


def test_host_added_then_removed(testbed, tmp_path):
    host1, host2 = testbed.hosts[0][1], testbed.hosts[1][1]
    script, set_hosts = discovery_script(str(tmp_path))
    set_hosts([host1 + ":1"])
    # Enough epochs that the job cannot end before its size-2 phase and the removal: starting the
    # new host's worker (a Python and framework import) takes seconds on a loaded machine, and rank
    # 0 trains on at size 1 meanwhile (12 epochs were all spent there once, under load 10).
    epochs = 30
    args = ["--verbose", "--network-interface", "hvdbr0", "-np", "1", "--min-np", "1", "--max-np", "2",
            "--host-discovery-script", script, sys.executable, TRAIN, str(epochs)]
    with ElasticJob(args, bed_env(testbed, STEP_SLEEP="0.1")) as job:
        job.wait_for(lambda: len(job.steps()) >= 4, "steps at size 1")
        set_hosts([host1 + ":1", host2 + ":1"])
        job.wait_for(lambda: sum(r["size"] == 2 for r in job.steps()) >= 10, "steps at size 2",
                     timeout=120)
        set_hosts([host1 + ":1"])
        code, output = job.finish()
    assert code == 0, output
    assert job.sizes() == [1, 2, 1], "sizes %s; %s\n%s" % (job.sizes(), summary(job), output)
    at_2 = [r for r in job.steps() if r["size"] == 2]
    assert {r["host"] for r in at_2} == {host1, host2}
    check_training(job, epochs)


def test_killed_worker_blacklists_its_host(testbed):
    host1, host2 = testbed.hosts[0][1], testbed.hosts[1][1]
    epochs = 8
    args = ["--verbose", "--network-interface", "hvdbr0", "-np", "2", "--min-np", "1",
            "-H", "%s:1,%s:1" % (host1, host2), sys.executable, TRAIN, str(epochs)]
    with ElasticJob(args, bed_env(testbed, STEP_SLEEP="0.1")) as job:
        job.wait_for(lambda: len(job.steps()) >= 8, "steps at size 2", timeout=120)
        victim = next(r for r in job.steps() if r["host"] == host2)
        os.kill(victim["pid"], signal.SIGKILL)
        code, output = job.finish()
    assert code == 0, output
    assert "blacklisting host " + host2 in output, output
    assert job.sizes() == [2, 1], output
    assert {r["host"] for r in job.steps() if r["size"] == 1} == {host1}
    check_training(job, epochs)
