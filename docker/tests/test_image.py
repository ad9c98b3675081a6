"""The image (ci/image.py builds it) running an MPIJob as the Kubeflow MPI Operator v2 lays it out,
on the test bed: two worker pods of two slots on hosts 1 and 2, the launcher pod on host 3
(docker/tests/pods.py says what a pod is here). The launcher's command is what a user writes in
the MPIJob: a bare `horovodrun -np 4` (Gloo, or --mpi) or `mpirun -np 4`, taking the hosts from
the operator's hostfile and reaching the workers over ssh on port 2222 as the image's user.
"""

import json
import pathlib
import subprocess

import pytest

from pods import HOME, Job, launcher_pod, worker_pod

JOB_TIMEOUT_S = 240
IDLE_TIMEOUT_S = 15

# Every rank: where it runs, its place in the job, and an allreduce checked against numpy.
TRAIN = r"""
import json, socket
import numpy as np
import torch
import horovod.torch as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
x = torch.arange(4099, dtype=torch.float32) * (rank + 1)
got = hvd.allreduce(x, op=hvd.Sum, name="x").numpy()
want = np.arange(4099, dtype=np.float32) * sum(r + 1 for r in range(size))
hosts = hvd.allgather_object(socket.gethostname())
print("RESULT " + json.dumps({
    "rank": rank, "size": size, "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
    "cross_rank": hvd.cross_rank(), "host": socket.gethostname(), "hosts": hosts,
    "exact": bool(np.array_equal(got, want)), "mpi": hvd.mpi_enabled(), "user": __import__("getpass").getuser()}))
"""

pytestmark = pytest.mark.testbed_leftovers_allowed  # the worker pods' sshd; checked here instead


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """The pair the operator generates and mounts at sshAuthMountPath (an ECDSA key named id_rsa)."""
    folder = tmp_path_factory.mktemp("ssh")
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-N", "", "-C", "mpijob", "-f", str(folder / "id_rsa")],
                   check=True)
    (folder / "authorized_keys").write_text((folder / "id_rsa.pub").read_text())
    return folder


@pytest.fixture(scope="module")
def job(testbed, keys):
    """A running MPIJob's two worker pods (and what the launcher pods get)."""
    job = Job("digits", "default", workers=2, slots=2, keys=keys)
    pods = []
    try:
        for index in range(job.workers):
            pods.append(worker_pod(testbed, job, index))
            pods[-1].write(f"{HOME}/train.py", TRAIN)
        job.pods = pods
        yield job
    finally:
        for pod in pods:
            pod.delete()
    assert not testbed.wait_idle(IDLE_TIMEOUT_S), testbed.leftovers()


def launch(testbed, job, argv, files=None):
    """Runs ``argv`` as the main process of a launcher pod on host 3 with the operator's
    environment; returns (status, output), the pod deleted, and checks that the job left nothing
    in the workers."""
    pod = launcher_pod(testbed, job, 3, {f"{HOME}/train.py": TRAIN, **(files or {})})
    try:
        proc = pod.start(argv, env=job.launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            output, _ = proc.communicate(timeout=JOB_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pod.stop()
            output, _ = proc.communicate()
            pytest.fail(f"{argv} did not end within {JOB_TIMEOUT_S} s:\n{output}")
    finally:
        pod.delete()
    for worker in job.pods:
        left = _wait_empty(worker)
        assert not left, f"the job left processes in {worker.name}: {left}"
    return proc.returncode, output


def _wait_empty(pod):
    import time
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while (left := pod.processes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def results(output):
    found = [json.loads(line[line.index("RESULT ") + len("RESULT "):]) for line in output.splitlines()
             if "RESULT " in line]
    return sorted(found, key=lambda r: r["rank"])


@pytest.mark.parametrize("launcher", ["horovodrun-gloo", "horovodrun-mpi", "mpirun"])
def test_two_workers_two_slots(testbed, job, launcher):
    argv = {"horovodrun-gloo": ["horovodrun", "--gloo", "-np", "4"],
            "horovodrun-mpi": ["horovodrun", "--mpi", "-np", "4"],
            "mpirun": ["mpirun", "-np", "4"]}[launcher] + ["python", f"{HOME}/train.py"]
    status, output = launch(testbed, job, argv)
    assert status == 0, output
    ranks = results(output)
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3], output
    workers = [job.worker_name(0), job.worker_name(0), job.worker_name(1), job.worker_name(1)]
    for r, host in zip(ranks, workers, strict=True):
        assert r["size"] == 4 and r["local_size"] == 2 and r["exact"], r
        assert r["host"] == host and r["hosts"] == workers, r
        assert (r["local_rank"], r["cross_rank"]) == (r["rank"] % 2, r["rank"] // 2), r
        assert r["mpi"] == (launcher != "horovodrun-gloo"), r
        assert r["user"] == "mpiuser", r


def test_worker_name_that_does_not_resolve(testbed, job):
    """A hostfile naming a worker that the launcher cannot resolve fails at once, naming it."""
    missing = f"{job.name}-worker-7.{job.name}-worker.default.svc"
    status, output = launch(testbed, job, ["horovodrun", "--gloo", "-np", "4", "python", f"{HOME}/train.py"],
                            files={"/etc/mpi/hostfile": job.hostfile() + f"{missing} slots=2\n"})
    assert status != 0
    assert missing in output and "/etc/mpi/hostfile" in output, output


def test_image_has_no_root_login(testbed, job):
    """The workers' sshd runs as the image's user: root cannot log in, and the key is needed."""
    pod = launcher_pod(testbed, job, 3, {})
    try:
        proc = pod.start(["sh", "-c", f"ssh -o BatchMode=yes root@{job.worker_fqdn(0)} true; echo status=$?; "
                          f"ssh -o BatchMode=yes -i /dev/null -o IdentitiesOnly=yes {job.worker_fqdn(0)} true; "
                          f"echo status=$?; ssh -o BatchMode=yes {job.worker_fqdn(1)} id -un"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        output, _ = proc.communicate(timeout=60)
    finally:
        pod.delete()
    lines = output.splitlines()
    assert lines.count("status=255") == 2 and lines[-1] == "mpiuser", output


def test_image_is_what_the_dockerfile_says():
    """The image's configuration: non-root user, sshd on 2222 by default."""
    import image
    proc = subprocess.run([*image.BUILDAH, "inspect", "--type", "image", image.IMAGE], capture_output=True, text=True,
                          check=True)
    config = json.loads(proc.stdout)["OCIv1"]["config"]
    assert config["User"] == "mpiuser" and config["Cmd"] == ["horovod-sshd"], config
    assert "/opt/horovod/bin" in next(e for e in config["Env"] if e.startswith("PATH=")), config
    assert "Port 2222" in pathlib.Path(__file__).parents[1].joinpath("sshd_config").read_text().splitlines()


ELASTIC_TRAIN = (pathlib.Path(__file__).resolve().parents[2] / "packages" / "horovod-run" / "tests" / "elastic_scripts"
                 / "torch_elastic_train.py")


def test_elastic_worker_pod_deleted_and_back(testbed, job):
    """Elastic under the operator: discovery through /etc/mpi/discover_hosts.sh (names without
    slots, --slots-per-host 2). Worker 1's pod is deleted (its processes die, then the operator
    drops it from the script) and a new pod of the same name comes back (new container, new host
    key): the job goes 4 -> 2 -> 4 ranks and ends with identical parameters on every rank, every
    sample committed once per epoch."""
    from horovod_testing.elastic import ElasticJob, check_finals, check_prefixes

    epochs = 30
    launcher = launcher_pod(testbed, job, 3, {f"{HOME}/train.py": ELASTIC_TRAIN.read_text()})
    for worker in job.pods:
        worker.write(f"{HOME}/train.py", ELASTIC_TRAIN.read_text())

    def publish():
        launcher.write("/etc/mpi/discover_hosts.sh.new", job.discover_hosts(), mode=0o755)
        (launcher.root / "etc/mpi/discover_hosts.sh.new").replace(launcher.root / "etc/mpi/discover_hosts.sh")

    argv = ["horovodrun", "--verbose", "-np", "4", "--min-np", "2", "--max-np", "4", "--slots-per-host", "2",
            "--elastic-timeout", "300", "--host-discovery-script", "/etc/mpi/discover_hosts.sh",
            "python", f"{HOME}/train.py", str(epochs)]
    elastic = ElasticJob([], timeout=JOB_TIMEOUT_S,
                         command=launcher.command(argv, {**job.launcher_env(), "STEP_SLEEP": "0.15"}))
    launcher.attach(elastic.proc)
    gone = job.worker_fqdn(1)
    try:
        elastic.wait_for(lambda: len(elastic.records("STEP")) >= 12, "steps at size 4")
        job.pods[1].delete()  # its processes first, then its address
        job.running.discard(1)
        elastic.wait_for(lambda: any(f"blacklisting host {gone}" in line for line in elastic.snapshot()),
                         "the deleted pod's host blacklisted")
        publish()
        elastic.wait_for(lambda: any(f"host {gone} is no longer listed: removed, not faulty" in line
                                     for line in elastic.snapshot()), "the pod's removal")
        elastic.wait_for(lambda: elastic.sizes()[-1:] == [2] and
                         sum(r["size"] == 2 for r in elastic.steps()) >= 4, "steps at size 2")
        job.pods[1] = worker_pod(testbed, job, 1)
        job.pods[1].write(f"{HOME}/train.py", ELASTIC_TRAIN.read_text())
        publish()
        elastic.wait_for(lambda: elastic.sizes()[-3:] == [4, 2, 4], "the pod's return", timeout=120)
        status, output = elastic.finish()
    finally:
        launcher.delete()  # the launcher and its ssh sessions, if the test failed
        elastic.kill()
    assert status == 0, output
    assert elastic.sizes() == [4, 2, 4], elastic.sizes()
    check_prefixes(elastic)
    check_finals(elastic, key="params")
    # The workers wait for their slots as long as the driver does (--elastic-timeout).
    assert {record["elastic_timeout"] for _, record in elastic.records("FINAL")} == {"300"}
    seen = next(record["seen"] for _, record in elastic.records("FINAL") if record["rank"] == 0)
    for epoch in range(epochs):
        assert sorted(i for e, batch in seen if e == epoch for i in batch) == list(range(96)), epoch
    for worker in job.pods:
        left = _wait_empty(worker)
        assert not left, f"the job left processes in {worker.name}: {left}"


def _documented_manifests():
    import yaml
    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md").read_text()
    return [yaml.safe_load(block.split("```", 1)[0]) for block in text.split("```yaml\n")[1:]]


def test_documented_manifest(testbed, job):
    """docs/kubernetes.md's first MPIJob as written: its launcher's command and arguments (the
    digits example the image carries) on workers of its shape; the example checks that every rank
    ends with identical parameters."""
    manifest = _documented_manifests()[0]
    replicas = manifest["spec"]["mpiReplicaSpecs"]
    assert (replicas["Worker"]["replicas"], manifest["spec"]["slotsPerWorker"]) == (job.workers, job.slots)
    assert manifest["spec"]["sshAuthMountPath"] == HOME + "/.ssh"
    launcher = replicas["Launcher"]["template"]["spec"]["containers"][0]
    status, output = launch(testbed, job, launcher["command"] + launcher["args"])
    assert status == 0, output
    assert "parameters identical on all 4 ranks" in output, output
    accuracy = float(output.split("test accuracy: ")[1].split()[0])
    assert accuracy >= 0.9, output


def test_one_container(testbed, job):
    """docs/docker.md's one-host run: two ranks in one container, the example the image carries."""
    status, output = launch(testbed, job, ["horovodrun", "-np", "2", "-H", "localhost:2", "python",
                                           "/opt/examples/pytorch_digits.py", "--epochs", "3"])
    assert status == 0, output
    assert "parameters identical on all 2 ranks" in output, output
