"""Elastic horovodrun end to end (runner.md §5.5, core.md §13): real workers on the test bed's
hosts (network namespaces with their own sshd, ci/testbed.sh), hosts added and removed through a
discovery script the test rewrites, workers killed, and the ways an elastic job ends.

The training script (elastic_scripts/torch_elastic_train.py) commits after every step and keeps
in its state the sample indices of every committed global batch, so the test can check that no
committed batch was lost or repeated and replay the training in one process.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from horovod_testing.elastic import ElasticJob, discovery_script

torch = pytest.importorskip("torch")

SCRIPTS = pathlib.Path(__file__).resolve().parent / "elastic_scripts"
TRAIN = str(SCRIPTS / "torch_elastic_train.py")
JOB_TIMEOUT_S = 240
N, BATCH, LR = 96, 4, 0.05


_started_jobs = []


def Job(args, env):
    """A horovodrun process with its output collected (horovod_testing.elastic.ElasticJob),
    stopped at the test's end whatever happened."""
    job = ElasticJob(args, env, timeout=JOB_TIMEOUT_S)
    _started_jobs.append(job)
    return job


@pytest.fixture(autouse=True)
def _stop_jobs():
    yield
    while _started_jobs:
        _started_jobs.pop().kill()


@pytest.fixture
def bed(testbed):
    return testbed


def _addr(bed, index):
    return bed.hosts[index - 1][1]


@pytest.fixture
def discovery(tmp_path):
    """``(script path, set_hosts(list of 'host:slots'))``: a discovery script printing a file."""
    return discovery_script(str(tmp_path))


def _replay(seen):
    """One process, one SGD step per committed global batch: the parameters the job must reach."""
    generator = torch.Generator().manual_seed(1)
    X = torch.randn(N, 3, generator=generator, dtype=torch.float64)
    y = X @ torch.tensor([1.5, -2.0, 0.5], dtype=torch.float64) + 0.1
    model = torch.nn.Linear(3, 1).double()
    with torch.no_grad():
        model.weight.zero_()
        model.bias.zero_()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for _, batch in seen:
        optimizer.zero_grad()
        ((model(X[batch]).squeeze(1) - y[batch]) ** 2).mean().backward()
        optimizer.step()
    return [p.detach().reshape(-1).tolist() for p in model.parameters()]


def _check_training(job, epochs):
    """The job trained every epoch, committed each sample exactly once per epoch, and every
    rank ends with the parameters a single process reaches over the same batches."""
    finals = job.records("FINAL")
    assert finals, "no FINAL line"
    sizes = {record["size"] for _, record in finals}
    assert len(sizes) == 1 and len(finals) == sizes.pop(), finals
    params = [record["params"] for _, record in finals]
    assert all(p == params[0] for p in params), "parameters differ between ranks: %s" % params
    seen = next(record["seen"] for _, record in finals if record["rank"] == 0)
    for epoch in range(epochs):
        indices = sorted(i for e, batch in seen if e == epoch for i in batch)
        assert indices == list(range(N)), "epoch %d: committed samples %s" % (epoch, indices)
    assert {e for e, _ in seen} == set(range(epochs))
    expected = _replay(seen)
    np.testing.assert_allclose(np.concatenate([np.asarray(p) for p in params[0]]),
                               np.concatenate([np.asarray(p) for p in expected]), rtol=1e-9,
                               atol=1e-12)
    # Every line carries the rank its worker had when it wrote it.
    for prefix_rank, record in job.records("STEP") + finals:
        assert prefix_rank == record["rank"], (prefix_rank, record)


def _elastic_args(*extra):
    return ["--verbose", "--network-interface", "hvdbr0", *extra]


@pytest.fixture
def cpu_hogs(request):
    """With ``request.param`` true, one busy-looping child process per core for the test's
    length (stopped by PID at its end): a loaded machine."""
    hogs = []
    if request.param:
        for _ in range(len(os.sched_getaffinity(0))):
            hogs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
    try:
        yield request.param
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


@pytest.mark.parametrize("cpu_hogs", [False, True], ids=["quiet", "loaded"], indirect=True)
def test_hosts_added_then_removed(bed, discovery, tmp_path, cpu_hogs):
    """The job grows to the added host and shrinks back when it is no longer listed, on a quiet
    machine and on one with a busy process per core."""
    script, set_hosts = discovery
    set_hosts(["%s:2" % _addr(bed, 1)])
    epochs = 10
    job = Job(_elastic_args("-np", "2", "--min-np", "2", "--max-np", "4",
                            "--host-discovery-script", script, sys.executable, TRAIN,
                            str(epochs)), dict(bed.env(), STEP_SLEEP="0.15"))
    job.wait_for(lambda: len(job.records("STEP")) >= 6, "steps at size 2")
    set_hosts(["%s:2" % _addr(bed, 1), "%s:2" % _addr(bed, 2)])
    job.wait_for(lambda: sum(r["size"] == 4 for _, r in job.records("STEP")) >= 8,
                 "steps at size 4")
    set_hosts(["%s:2" % _addr(bed, 1)])
    code, output = job.finish()
    assert code == 0, output
    assert job.sizes() == [2, 4, 2], job.sizes()
    hosts_at_4 = {r["host"] for _, r in job.records("STEP") if r["size"] == 4}
    assert hosts_at_4 == {bed.hosts[0][0], bed.hosts[1][0]}
    _check_training(job, epochs)


def test_added_host_starts_standby_while_training_goes_on(bed, discovery):
    """The new host's workers are started while the current ones keep training; the reset
    comes once they wait, so a slow start (4 s here) does not stop the training."""
    script, set_hosts = discovery
    set_hosts(["%s:2" % _addr(bed, 1)])
    epochs = 8
    delay_s = 4.0
    job = Job(_elastic_args("-np", "2", "--min-np", "2", "--max-np", "4",
                            "--host-discovery-script", script, sys.executable, TRAIN,
                            str(epochs)),
              dict(bed.env(), STEP_SLEEP="0.15", START_DELAY="%s:%s" % (bed.hosts[1][0], delay_s)))
    job.wait_for(lambda: len(job.records("STEP")) >= 4, "steps at size 2")
    listed = time.time()
    set_hosts(["%s:2" % _addr(bed, 1), "%s:2" % _addr(bed, 2)])
    job.wait_for(lambda: any(r["size"] == 4 for _, r in job.records("STEP")), "steps at size 4",
                 timeout=120)
    code, output = job.finish()
    assert code == 0, output
    assert job.sizes() == [2, 4], job.sizes()
    # Size-2 steps went on while the new workers slept through their start.
    late = [r for _, r in job.records("STEP") if r["size"] == 2 and r["time"] > listed + delay_s]
    assert late, "no step at size 2 after the host was listed + %.0f s" % delay_s
    first_at_4 = min(r["time"] for _, r in job.records("STEP") if r["size"] == 4)
    assert first_at_4 > listed + delay_s
    assert "starting a standby worker on %s[0]" % _addr(bed, 2) in output, output
    _check_training(job, epochs)


def test_standby_worker_failing_to_start_blacklists_its_host(bed, discovery):
    script, set_hosts = discovery
    set_hosts(["%s:2" % _addr(bed, 1)])
    epochs = 6
    job = Job(_elastic_args("-np", "2", "--min-np", "2", "--max-np", "4",
                            "--host-discovery-script", script, sys.executable, TRAIN,
                            str(epochs)),
              dict(bed.env(), STEP_SLEEP="0.15", START_FAIL=bed.hosts[1][0]))
    job.wait_for(lambda: len(job.records("STEP")) >= 4, "steps at size 2")
    set_hosts(["%s:2" % _addr(bed, 1), "%s:2" % _addr(bed, 2)])
    job.wait_for(lambda: any("blacklisting %s" % _addr(bed, 2) in line for line in job.snapshot()),
                 "the host's blacklisting", timeout=120)
    code, output = job.finish()
    assert code == 0, output
    assert "exited with 3 before its round" in output, output
    assert job.sizes() == [2], job.sizes()
    _check_training(job, epochs)


@pytest.mark.parametrize("cooldown", [False, True])
def test_killed_worker_blacklists_its_host(bed, cooldown):
    hosts = "%s:2,%s:2" % (_addr(bed, 1), _addr(bed, 2))
    extra = ["--blacklist-cooldown-range", "1", "2"] if cooldown else []
    epochs = 12 if cooldown else 6
    job = Job(_elastic_args("-np", "4", "--min-np", "2", "-H", hosts, *extra, sys.executable,
                            TRAIN, str(epochs)), dict(bed.env(), STEP_SLEEP="0.15"))
    job.wait_for(lambda: len(job.records("STEP")) >= 12, "steps at size 4")
    victim = next(r for _, r in job.records("STEP") if r["host"] == bed.hosts[1][0])
    os.kill(victim["pid"], signal.SIGKILL)
    if cooldown:
        # The host is back after its cooldown: 4 ranks again.
        job.wait_for(lambda: job.sizes()[-3:] == [4, 2, 4], "the host's return", timeout=120)
    code, output = job.finish()
    assert code == 0, output
    assert "blacklisting host %s" % _addr(bed, 2) in output
    assert job.sizes()[:2] == [4, 2], job.sizes()
    if not cooldown:
        assert job.sizes() == [4, 2]
    _check_training(job, epochs)


def test_deleted_pod_comes_back_under_its_name(bed, discovery):
    """As on Kubernetes under the MPI Operator: the discovery prints hosts without slots
    (--slots-per-host gives them); a worker "pod" is deleted (its processes killed first, then its
    discovery line removed) and comes back under the same name: it left the discovery, so it was
    removed, not faulty, and the job grows back onto it."""
    script, set_hosts = discovery
    both = [_addr(bed, 1), _addr(bed, 2)]
    set_hosts(both)
    epochs = 30  # enough for the pod to come back before the training ends
    job = Job(_elastic_args("-np", "4", "--min-np", "2", "--max-np", "4", "--slots-per-host", "2",
                            "--host-discovery-script", script, sys.executable, TRAIN, str(epochs)),
              dict(bed.env(), STEP_SLEEP="0.15"))
    job.wait_for(lambda: len(job.records("STEP")) >= 12, "steps at size 4")
    for pid in bed.pids(2):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # Its workers failed while it was still listed: blacklisted, until its line goes.
    job.wait_for(lambda: any("blacklisting host %s" % _addr(bed, 2) in line for line in job.snapshot()),
                 "the host's blacklisting")
    set_hosts([_addr(bed, 1)])
    job.wait_for(lambda: any("host %s is no longer listed: removed, not faulty" % _addr(bed, 2) in line
                             for line in job.snapshot()), "the host's removal")
    job.wait_for(lambda: job.sizes()[-1:] == [2] and sum(r["size"] == 2 for _, r in job.records("STEP")) >= 4,
                 "steps at size 2")
    set_hosts(both)
    job.wait_for(lambda: job.sizes()[-3:] == [4, 2, 4], "the pod's return", timeout=120)
    code, output = job.finish()
    assert code == 0, output
    assert job.sizes() == [4, 2, 4], job.sizes()
    _check_training(job, epochs)


def test_reset_limit_exceeded(bed, discovery):
    script, set_hosts = discovery
    set_hosts(["%s:1" % _addr(bed, 1)])
    job = Job(_elastic_args("-np", "1", "--min-np", "1", "--max-np", "2", "--reset-limit", "1",
                            "--host-discovery-script", script, sys.executable, TRAIN, "1000"),
              dict(bed.env(), STEP_SLEEP="0.1"))
    job.wait_for(lambda: len(job.records("STEP")) >= 3, "steps at size 1")
    set_hosts(["%s:1" % _addr(bed, 1), "%s:1" % _addr(bed, 2)])
    job.wait_for(lambda: 2 in job.sizes(), "steps at size 2")
    set_hosts(["%s:1" % _addr(bed, 1)])
    code, output = job.finish()
    assert code != 0
    assert ("Job has been shutdown, as the number of elastic resets exceeded the --reset-limit "
            "of 1. The job was reset 1 time; another reset was needed") in output, output


def test_min_np_never_reached(bed, discovery):
    script, set_hosts = discovery
    set_hosts(["%s:2" % _addr(bed, 1)])
    started = time.monotonic()
    job = Job(_elastic_args("-np", "4", "--min-np", "4", "--elastic-timeout", "5",
                            "--host-discovery-script", script, sys.executable, TRAIN, "1"),
              bed.env())
    code, output = job.finish()
    assert code != 0
    assert ("Timed out waiting for minimum number of slots to become available. Please check "
            "that you have enough resources to run at least 4 Horovod processes. After 5 s: 2 "
            "slot(s) available on 1 host(s)") in output, output
    assert time.monotonic() - started < 30


def test_discovery_script_failing_at_start(bed, tmp_path):
    script = tmp_path / "fail.sh"
    script.write_text("#!/bin/sh\necho 'no hosts today' >&2\nexit 3\n")
    script.chmod(0o755)
    started = time.monotonic()
    job = Job(_elastic_args("-np", "2", "--host-discovery-script", str(script), sys.executable,
                            TRAIN, "1"), bed.env())
    code, output = job.finish()
    assert code != 0
    assert "Failed to execute discovery script: %s. Exit code: 3" % script in output, output
    assert time.monotonic() - started < 30


def test_discovery_script_failing_later_is_retried(bed, tmp_path):
    counter = tmp_path / "calls"
    script = tmp_path / "flaky.sh"
    # Succeeds on the first call, then fails every other call.
    script.write_text("#!/bin/sh\nn=$(cat %s 2>/dev/null || echo 0)\necho $((n + 1)) > %s\n"
                      "if [ $n -gt 0 ] && [ $((n %% 2)) -eq 1 ]; then exit 5; fi\n"
                      "echo %s:2\n" % (counter, counter, _addr(bed, 1)))
    script.chmod(0o755)
    job = Job(_elastic_args("-np", "2", "--host-discovery-script", str(script), sys.executable,
                            TRAIN, "3"), dict(bed.env(), STEP_SLEEP="0.1"))
    code, output = job.finish()
    assert code == 0, output
    assert int(counter.read_text()) >= 3
    assert "host discovery failed (retrying)" in output
    _check_training(job, 3)


def test_all_workers_failing_at_once(bed):
    hosts = "%s:1,%s:1" % (_addr(bed, 1), _addr(bed, 2))
    job = Job(_elastic_args("-np", "2", "--min-np", "1", "-H", hosts, sys.executable, TRAIN,
                            "5"), dict(bed.env(), EXIT_ALL_AT="4"))
    code, output = job.finish()
    assert code != 0
    assert ("Horovod detected that one or more processes exited with non-zero status, thus "
            "causing the job to be terminated.") in output, output
    assert ("Reason: every worker failed (%s[0], %s[0])" % (_addr(bed, 1), _addr(bed, 2))
            in output), output


FUNCTION_JOB = """
import json, sys
import horovod
def fn(scale):
    import horovod.torch as hvd
    hvd.init()
    return [hvd.rank() * scale, hvd.size()]
results = horovod.run(fn, args=(10,), num_proc=2, min_num_proc=2, max_num_proc=2,
                      hosts=sys.argv[1], network_interfaces=["hvdbr0"])
print("RESULTS " + json.dumps(results))
"""


def test_function_mode(bed, tmp_path):
    script = tmp_path / "function_job.py"
    script.write_text(FUNCTION_JOB)
    hosts = "%s:1,%s:1" % (_addr(bed, 1), _addr(bed, 2))
    run = subprocess.run([sys.executable, str(script), hosts], capture_output=True, text=True,
                         timeout=JOB_TIMEOUT_S, env=bed.env())
    assert run.returncode == 0, run.stdout + run.stderr
    line = next(line for line in run.stdout.splitlines() if line.startswith("RESULTS "))
    assert json.loads(line[len("RESULTS "):]) == [[0, 2], [10, 2]]


def test_fifty_resets_leak_nothing(tmp_path):
    """50 resets in a row on this host (2 workers, shared memory between them): the open file
    descriptors, threads and /dev/shm entries over the last five resets equal those over resets
    5-9 (the most frequent of each five samples: elastic_scripts/reset_leak_check.py)."""
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho localhost:2\n")
    script.chmod(0o755)
    job = Job(["--network-interface", "lo", "-np", "2", "--host-discovery-script", str(script),
               sys.executable, str(SCRIPTS / "reset_leak_check.py"), "50"], dict(os.environ))
    code, output = job.finish()
    assert code == 0, output
    leaks = job.records("LEAKS")
    assert len(leaks) == 2, output
    for _, record in leaks:
        early, late = record["samples"]["5"], record["samples"]["50"]
        assert early["shm_maps"] >= 1, record  # the workers did use shared memory
        assert late == early, record
