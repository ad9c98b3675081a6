"""horovod.ray on a Ray cluster spread over the multi-host test bed (ci/testbed.sh): the head node
in this (the root) network namespace at the bed's launcher address 198.18.0.254, without CPUs,
and one Ray worker node in each of the hosts hvd-h1 and hvd-h2 (198.18.0.1, 198.18.0.2), each
joining with ``ray start --address=198.18.0.254:PORT --node-ip-address=198.18.0.K`` inside the
host's namespaces (Testbed.command). The example of docs/examples/ray (scikit-learn's digits,
numpy, horovod.common's allreduce) trains on 2 nodes x 2 workers.

The nodes share this process's token (horovod_testing.ray_cluster, which also stops the cluster by
PID: GCS last). Every node has its own --temp-dir below build/raymn-<pid> (Unix socket paths must
stay under 107 bytes, which pytest's tmp_path below build/pytest is too long for); it is removed at
the end.
"""

import importlib.util
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time

import pytest

from horovod_testing.ray_cluster import RAY_NODE_ENV, shutdown_cluster, temp_dir_for, token_env

# Before Ray is imported (it reads the token once): this process's token, shared by its nodes.
TOKEN_ENV = token_env() if importlib.util.find_spec("ray") is not None else {}

ray = pytest.importorskip("ray")
import numpy as np  # noqa: E402

from horovod.ray import RayExecutor  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "docs" / "examples" / "ray" / "ray_digits.py"
HOST_CPUS = 2
START_TIMEOUT_S = 120


def _load_example():
    spec = importlib.util.spec_from_file_location("ray_digits", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["ray_digits"] = module
    spec.loader.exec_module(module)
    # The workers cannot import it from docs/: its functions travel by value.
    ray.cloudpickle.register_pickle_by_value(module)
    return module


def _free_port(address):
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


class BedCluster:
    """The head here and one node per bed host, each a ``ray start --block`` child process."""

    def __init__(self, bed, temp_dir):
        self.bed = bed
        self.temp_dir = temp_dir
        self.ray_bin = str(pathlib.Path(sys.executable).with_name("ray"))
        self.head_ip = bed.launcher_address
        self.port = _free_port(self.head_ip)
        self.address = "%s:%d" % (self.head_ip, self.port)
        self.popens = []
        self.logs = []
        self.env = dict(os.environ, **TOKEN_ENV, **RAY_NODE_ENV)
        self.env.pop("RAY_ADDRESS", None)

    def _log_text(self):
        return "\n".join("== %s\n%s" % (p.name, p.read_text()[-3000:]) for p in sorted(self.temp_dir.glob("*.log")))

    def _start(self, name, argv):
        log = open(self.temp_dir / ("%s.log" % name), "w")
        self.logs.append(log)
        node_dir = self.temp_dir / name
        node_dir.mkdir()
        argv = argv + ["--block", "--disable-usage-stats", "--temp-dir=%s" % node_dir,
                       "--object-store-memory=%d" % (100 << 20)]
        popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env)
        self.popens.append(popen)
        return popen

    def start(self, host_indices):
        head = self._start("head", [self.ray_bin, "start", "--head", "--port=%d" % self.port,
                                    "--node-ip-address=%s" % self.head_ip, "--num-cpus=0",
                                    "--include-dashboard=false"])
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                socket.create_connection((self.head_ip, self.port), timeout=1).close()
                break
            except OSError:
                if head.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the Ray head node did not start:\n" + self._log_text()) from None
                time.sleep(0.5)
        for index in host_indices:
            name, address = self.bed.host(index)
            self._start(name, self.bed.command(index, [
                self.ray_bin, "start", "--address=%s" % self.address, "--node-ip-address=%s" % address,
                "--num-cpus=%d" % HOST_CPUS, "--resources=%s" % json.dumps({"hvd_bed_%s" % name: 1})]))

    def wait_for_nodes(self, count):
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            alive = [n for n in ray.nodes() if n.get("Alive", n.get("alive"))]
            if len(alive) == count:
                return alive
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.popens):
                raise RuntimeError("the Ray cluster has %d of %d nodes; logs:\n%s"
                                   % (len(alive), count, self._log_text()))
            time.sleep(0.5)


@pytest.fixture
def bed_cluster(testbed):
    try:
        temp_dir = temp_dir_for(REPO, "raymn", subdir_length=len("/hvd-h1"))
    except ValueError as e:
        pytest.fail(str(e))
    shutil.rmtree(temp_dir, ignore_errors=True)
    temp_dir.mkdir(parents=True)
    saved = {k: os.environ.get(k) for k in list(TOKEN_ENV) + ["RAY_ADDRESS"]}
    os.environ.update(TOKEN_ENV)
    os.environ.pop("RAY_ADDRESS", None)
    cluster = BedCluster(testbed, temp_dir)
    try:
        cluster.start([1, 2])
        ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=True)
        cluster.wait_for_nodes(3)
        yield cluster
    finally:
        left = shutdown_cluster(cluster.popens, cluster.logs, temp_dir, saved)
        assert not left, "Ray processes left after stopping the cluster: %s" % [(p.pid, p.name()) for p in left]


def test_digits_two_bed_hosts(bed_cluster):
    """2 Ray nodes (bed hosts) x 2 workers: the example reaches >= 0.95 test accuracy with the
    same parameters on every rank, equal to a one-process run of the same SGD."""
    example = _load_example()
    settings = RayExecutor.create_settings(timeout_s=120, placement_group_timeout_s=60)
    executor = RayExecutor(settings, num_hosts=2, num_workers_per_host=2, cpus_per_worker=1)
    executor.start()
    try:
        results = executor.run(example.train_digits, kwargs={"epochs": 30})
        env = executor.run(lambda: {k: os.environ.get(k) for k in (
            "HOROVOD_GLOO_IFACE", "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_HOSTNAME")})
    finally:
        executor.shutdown()

    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    assert all(r["size"] == 4 and r["cross_size"] == 2 and r["local_size"] == 2 for r in results), results
    hosts = [r["hostname"] for r in results]
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3] and set(hosts) == {"hvd-h1", "hvd-h2"}
    assert [(r["local_rank"], r["cross_rank"]) for r in results] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    # The workers talk over the bed's interface, the rendezvous is at the head's address.
    assert {e["HOROVOD_GLOO_IFACE"] for e in env} == {"hvdbr0"}
    assert {e["HOROVOD_GLOO_RENDEZVOUS_ADDR"] for e in env} == {bed_cluster.head_ip}
    assert len({e["HOROVOD_HOSTNAME"] for e in env}) == 2

    assert len({r["params_sha256"] for r in results}) == 1, "the ranks ended with different parameters"
    assert min(r["test_accuracy"] for r in results) >= 0.95, [r["test_accuracy"] for r in results]
    reference, accuracy = example.sgd(0, 1, lambda g: g, epochs=30)
    for mine, theirs in zip(results[0]["params"], reference, strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-7, atol=1e-9)
    assert abs(results[0]["test_accuracy"] - accuracy) <= 1 / 397
