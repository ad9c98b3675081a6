"""horovod.ray's static RayExecutor on a real local Ray cluster (spec ray.md P2a).

The module's cluster has two Ray nodes on this machine, each started with ``ray start --block``
as a child of this process and told apart by a custom resource (``hvd_test_host_<i>``), the way
upstream's tests fake hosts: a head node and one node joining it, 2 CPUs each (the last test adds a
third node and loses it). Ray's files go to a short folder under the repository's build/ (Unix
socket paths must stay under 107 bytes; ~/.cache/hvd-ray-<pid> when the checkout's path is too
long), never /tmp; token authentication (Ray turns it on) uses a token made here, never ~/.ray.
At the end the processes are stopped by PID (GCS last; `ray stop` would kill by name) and the
test checks that none is left and removes the folder.
"""

import importlib.util
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

import pytest

from horovod_testing.ray_cluster import (RAY_NODE_ENV, STOP_TIMEOUT_S, shutdown_cluster,
                                         temp_dir_for, token_env)

if importlib.util.find_spec("ray") is not None:
    # Before Ray is imported: the driver (this process) and the nodes started below share a token.
    SAVED_ENV = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_ADDRESS")}
    token_env()

ray = pytest.importorskip("ray")

import numpy as np  # noqa: E402

from horovod.common.rendezvous import SECRET_ENV  # noqa: E402
from horovod.ray import RayExecutor  # noqa: E402
from horovod.ray.runner import Coordinator, MiniSettings  # noqa: E402

# The workers cannot import this file: its functions and classes travel by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

REPO = pathlib.Path(__file__).resolve().parents[3]
CPUS_PER_NODE = 2
NODES = 2
START_TIMEOUT_S = 90

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_temp_dir():
    """build/ray-<pid> in the repository (~/.cache/hvd-ray-<pid> when the checkout's path is too
    long for the Unix sockets Ray makes below it)."""
    try:
        return temp_dir_for(REPO, "ray")
    except ValueError as e:
        pytest.fail(str(e))


class Cluster:
    """The running cluster: its address, temp dir, nodes (``ray start --block`` processes)."""

    def __init__(self, temp_dir):
        self.temp_dir = temp_dir
        self.ray_bin = str(pathlib.Path(sys.executable).with_name("ray"))
        self.port = _free_port()
        self.node_ip = ray.util.get_node_ip_address()
        self.address = "%s:%d" % (self.node_ip, self.port)
        self.popens = []
        self.logs = []
        self.node_of_host = {}  # fake host index -> Ray node id

    def _log_text(self):
        return "\n".join(path.read_text() for path in sorted(self.temp_dir.glob("ray-start-*.log")))

    def start_node(self, host, num_cpus):
        """Start node ``host`` (the head for 0) with the resource hvd_test_host_<host>; for the head,
        wait until its GCS accepts connections."""
        log = open(self.temp_dir / ("ray-start-%d.log" % host), "w")
        self.logs.append(log)
        args = [self.ray_bin, "start", "--block", "--disable-usage-stats", "--num-cpus=%d" % num_cpus,
                "--object-store-memory=%d" % (100 << 20), "--resources=" + json.dumps({"hvd_test_host_%d" % host: 100})]
        if host == 0:
            args += ["--head", "--port=%d" % self.port, "--include-dashboard=false", "--temp-dir=%s" % self.temp_dir]
        else:
            args += ["--address=%s" % self.address]
        popen = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=dict(os.environ, **RAY_NODE_ENV))
        self.popens.append(popen)
        deadline = time.monotonic() + START_TIMEOUT_S
        while host == 0:
            try:
                socket.create_connection((self.node_ip, self.port), timeout=1).close()
                break
            except OSError:
                if popen.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the Ray head node did not start:\n" + self._log_text()) from None
                time.sleep(0.5)
        return popen

    def wait_for_nodes(self, count):
        """Wait until ``count`` nodes are alive; record which node has which fake host."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            alive = [n for n in ray.nodes() if n.get("Alive", n.get("alive"))]
            if len(alive) == count:
                break
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.popens):
                raise RuntimeError("the Ray cluster has %d of %d nodes; logs:\n%s"
                                   % (len(alive), count, self._log_text()))
            time.sleep(0.5)
        for node in alive:
            for key in node["Resources"]:
                if key.startswith("hvd_test_host_"):
                    self.node_of_host[int(key.rpartition("_")[2])] = node["NodeID"]


    def wait_node_dead(self, node_id):
        """Wait until Ray no longer lists node ``node_id`` as alive (a stopped node), so that the
        next test finds the cluster it expects."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while any(n["NodeID"] == node_id and n.get("Alive", n.get("alive")) for n in ray.nodes()):
            if time.monotonic() > deadline:
                raise AssertionError("Ray still lists the stopped node %s as alive after %d s"
                                     % (node_id, START_TIMEOUT_S))
            time.sleep(0.5)


@pytest.fixture(scope="module")
def cluster():
    temp_dir = _ray_temp_dir()
    shutil.rmtree(temp_dir, ignore_errors=True)
    temp_dir.mkdir(parents=True)
    c = Cluster(temp_dir)
    try:
        for host in range(NODES):
            c.start_node(host, CPUS_PER_NODE)
        ray.init(address=c.address, logging_level="WARNING", log_to_driver=True)
        c.wait_for_nodes(NODES)
        yield c
    finally:
        left = shutdown_cluster(c.popens, c.logs, temp_dir, SAVED_ENV)
        assert not left, "Ray processes left after stopping the cluster: %s" % [
            (p.pid, p.name()) for p in left]
        assert not temp_dir.exists()


# ---------------------------------------------------------------------------------------------
# Functions the workers run.

def _job_facts():
    """hvd.init() through horovod.common, then what the worker sees of the job, and an
    allreduce (sum) of a numpy array that depends on the rank."""
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics
    hvd = HorovodBasics()
    hvd.init()
    x = np.arange(6, dtype=np.float64) * (hvd.rank() + 1) + hvd.rank()
    ops.wait(ops.allreduce_async([x], [x], ["ray.test.sum"], HorovodBasics.Sum))
    return {
        "rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
        "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(), "sum": x.tolist(),
        "node": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("HOROVOD_", "NCCL_", "CUDA_"))},
        "secret": os.environ.get(SECRET_ENV),
    }


def _expected_topology(nodes):
    """Local and cross ranks by the rules: local rank = position among the ranks of its node;
    cross rank = index of its node among the nodes (in order of first appearance) that have a
    rank of that local rank."""
    order, ranks_of = [], {}
    for rank, node in enumerate(nodes):
        if node not in ranks_of:
            order.append(node)
            ranks_of[node] = []
        ranks_of[node].append(rank)
    out = []
    for rank, node in enumerate(nodes):
        local_rank = ranks_of[node].index(rank)
        having = [n for n in order if len(ranks_of[n]) > local_rank]
        out.append({"local_rank": local_rank, "local_size": len(ranks_of[node]),
                    "cross_rank": having.index(node), "cross_size": len(having)})
    return out


def _check_job(results, size):
    assert [r["rank"] for r in results] == list(range(size))
    assert all(r["size"] == size for r in results)
    expected_sum = sum(np.arange(6, dtype=np.float64) * (r + 1) + r for r in range(size))
    for r in results:
        np.testing.assert_array_equal(np.array(r["sum"]), expected_sum)
    expected = _expected_topology([r["node"] for r in results])
    for r, e in zip(results, expected, strict=True):
        assert {k: r[k] for k in e} == e, (r["rank"], r, e)
        env = r["env"]
        assert env["HOROVOD_RANK"] == str(r["rank"]) and env["HOROVOD_SIZE"] == str(size)
        assert env["HOROVOD_LOCAL_RANK"] == str(e["local_rank"])
        assert env["HOROVOD_CROSS_SIZE"] == str(e["cross_size"])
        assert env["HOROVOD_HOSTNAME"] == r["node"]
        assert env["HOROVOD_CONTROLLER"] == "gloo" and env["HOROVOD_CPU_OPERATIONS"] == "gloo"
        assert env["HOROVOD_GLOO_IFACE"] and env["NCCL_SOCKET_IFNAME"].split(",")[0] == env["HOROVOD_GLOO_IFACE"]
        assert "CUDA_VISIBLE_DEVICES" not in env and "HOROVOD_ELASTIC" not in env
    assert len({r["secret"] for r in results}) == 1 and len(bytes.fromhex(results[0]["secret"])) == 32


def _pg_states():
    return {pg_id: info["state"] for pg_id, info in ray.util.placement_group_table().items()}


def _live_pgs():
    return {pg_id for pg_id, state in _pg_states().items() if state != "REMOVED"}


# ---------------------------------------------------------------------------------------------
# Without a cluster.

def test_import_without_ray_names_the_extra():
    code = ("import sys; sys.modules['ray'] = None\n"
            "try:\n    import horovod.ray\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert 'pip install "horovod-run[ray]"' in out.stdout, out


def test_bad_arguments():
    s = RayExecutor.create_settings(timeout_s=10)
    with pytest.raises(ValueError, match="num_workers or num_hosts"):
        RayExecutor(s, num_workers=2, num_hosts=1)
    with pytest.raises(ValueError, match="num_workers, or num_hosts"):
        RayExecutor(s)
    with pytest.raises(ValueError, match="use_gpu"):
        RayExecutor(s, num_workers=1, gpus_per_worker=1)
    with pytest.raises(ValueError, match="-1"):
        RayExecutor(s, num_workers=1, use_gpu=True, gpus_per_worker=-1)
    with pytest.raises(ValueError, match="num_workers must be"):
        RayExecutor(s, num_workers=0)
    with pytest.raises(ValueError, match="num_workers_per_host must be"):
        RayExecutor(s, num_hosts=2, num_workers_per_host=0)
    with pytest.raises(ValueError, match="^Both min_workers and num_workers"):
        RayExecutor(s, num_workers=2, min_workers=1)
    with pytest.raises(ValueError, match="max_workers"):
        RayExecutor(s, max_workers=2)
    with pytest.raises(ValueError, match="min_workers must be a positive integer"):
        RayExecutor(s, min_workers=0)
    with pytest.raises(ValueError, match="max_workers must be an integer of at least min_workers=3"):
        RayExecutor(s, min_workers=3, max_workers=2)
    with pytest.raises(ValueError, match="num_hosts is for static jobs"):
        RayExecutor(s, min_workers=1, num_hosts=2)
    with pytest.raises(ValueError, match="cooldown"):
        RayExecutor(s, min_workers=1, cooldown_range=(5, 1))
    with pytest.raises(ValueError, match="cpus_per_worker > 0"):
        RayExecutor(s, min_workers=1, cpus_per_worker=0)
    # Accepted: num_workers_per_host=None beside num_workers, and gpus_per_worker defaults to use_gpu.
    assert RayExecutor(s, num_workers=2, num_workers_per_host=None).params.gpus_per_worker == 0
    assert RayExecutor(s, num_workers=2, use_gpu=True).params.gpus_per_worker == 1


def test_settings(tmp_path):
    a = RayExecutor.create_settings(timeout_s=7, placement_group_timeout_s=3, nics={"lo"})
    b = RayExecutor.create_settings()
    assert isinstance(a, MiniSettings) and a.timeout_s == 7 and a.placement_group_timeout_s == 3
    assert a.nics == {"lo"} and b.nics is None
    assert len(a.key) == 32 and a.key != b.key != MiniSettings().key
    assert a.start_timeout.seconds == 7 and "timeout_s" in a.start_timeout._message
    a.discovery = "anything"  # extra attributes are accepted
    key_file = tmp_path / "key"
    RayExecutor.create_settings(ssh_identity_file=str(key_file), ssh_str="KEY")
    assert key_file.read_text() == "KEY" and (key_file.stat().st_mode & 0o777) == 0o600


@pytest.mark.parametrize("layout, expected", [
    # 12 ranks dealt round-robin to 3 nodes: local size 4, cross size 3 everywhere.
    (["a", "b", "c"] * 4, {"local_size": {4}, "cross_size": {3}}),
    # Nodes holding 5, 4 and 3 ranks: 1 rank of cross size 1, 2 of size 2, 9 of size 3.
    (["a"] * 5 + ["b"] * 4 + ["c"] * 3, {"cross_size_counts": {1: 1, 2: 2, 3: 9}}),
])
def test_coordinator(layout, expected):
    c = Coordinator(MiniSettings())
    for rank, node in enumerate(layout):
        c.register("host-" + node, node, rank)
    assert c.world_size == len(layout) and c.hostnames == {"host-" + n for n in set(layout)}
    got = c.finalize_registration()
    want = _expected_topology(layout)
    for rank in range(len(layout)):
        assert got[rank] == {"HOROVOD_LOCAL_RANK": want[rank]["local_rank"],
                             "HOROVOD_LOCAL_SIZE": want[rank]["local_size"],
                             "HOROVOD_CROSS_RANK": want[rank]["cross_rank"],
                             "HOROVOD_CROSS_SIZE": want[rank]["cross_size"]}
        assert all(isinstance(v, int) for v in got[rank].values())
    if "local_size" in expected:
        assert {v["HOROVOD_LOCAL_SIZE"] for v in got.values()} == expected["local_size"]
        assert {v["HOROVOD_CROSS_SIZE"] for v in got.values()} == expected["cross_size"]
    else:
        sizes = [v["HOROVOD_CROSS_SIZE"] for v in got.values()]
        assert {s: sizes.count(s) for s in set(sizes)} == expected["cross_size_counts"]
    assert c.node_id_string == ",".join("%s:%d" % (n, layout.count(n)) for n in dict.fromkeys(layout))
    assert Coordinator(MiniSettings()).node_id_string == ""


# ---------------------------------------------------------------------------------------------
# On the cluster.

class Counter:
    """An executable: state kept between execute() calls."""

    def __init__(self, start):
        self.value = start

    def bump(self):
        self.value += 1
        return self.value


@pytest.mark.parametrize("num_workers", [1, 2, 4])
def test_num_workers(cluster, num_workers):
    settings = RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=30)
    executor = RayExecutor(settings, num_workers=num_workers, cpus_per_worker=1)
    before = _live_pgs()
    executor.start(executable_cls=Counter, executable_args=[10], extra_env_vars={"HVD_RAY_TEST_EXTRA": "x y"})
    try:
        created = executor.adapter.strategy._created_placement_group
        assert created is not None and created.id.hex() in _live_pgs() - before
        results = executor.run(_job_facts)
        _check_job(results, num_workers)
        if num_workers == 4:
            # 2 CPUs per node: the packed group spans both nodes, so cross ranks are not trivial.
            assert {r["node"] for r in results} == set(cluster.node_of_host.values())
            assert {r["cross_size"] for r in results} == {2}
        assert settings.key.hex() != results[0]["secret"]
        # execute: the executable keeps its state, results in rank order.
        assert executor.execute(lambda c: c.bump()) == [11] * num_workers
        assert executor.execute(lambda c: (c.bump(), os.environ["HOROVOD_RANK"])) == \
            [(12, str(r)) for r in range(num_workers)]
        assert executor.execute_single(lambda c: (c.value, os.environ["HOROVOD_RANK"])) == (12, "0")
        refs = executor.run_remote(lambda a, b=0: (int(os.environ["HOROVOD_RANK"]), a + b), args=[1], kwargs={"b": 2})
        assert isinstance(refs[0], ray.ObjectRef)
        assert ray.get(refs) == [(r, 3) for r in range(num_workers)]
        assert executor.run(lambda: os.environ["HVD_RAY_TEST_EXTRA"]) == ["x y"] * num_workers
        pids = [r["pid"] for r in results]
    finally:
        executor.shutdown()
    assert executor.adapter is None
    assert created.id.hex() not in _live_pgs()
    executor.shutdown()  # twice is fine
    _wait_gone(pids)


def _wait_gone(pids, timeout_s=20):
    import psutil
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
        if not left:
            return
        time.sleep(0.2)
    pytest.fail("worker processes %s still run after shutdown()" % left)


def test_num_hosts_strict_spread(cluster):
    settings = RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=30)
    executor = RayExecutor(settings, num_hosts=2, num_workers_per_host=2, cpus_per_worker=1)
    executor.start()
    try:
        results = executor.run(_job_facts)
    finally:
        executor.shutdown()
    _check_job(results, 4)
    nodes = [r["node"] for r in results]
    # Bundle b holds ranks 2b and 2b+1, and the two bundles are on different nodes.
    assert nodes[0] == nodes[1] != nodes[2] == nodes[3]
    assert set(nodes) == set(cluster.node_of_host.values())
    assert [(r["local_rank"], r["cross_rank"], r["local_size"], r["cross_size"]) for r in results] == \
        [(0, 0, 2, 2), (1, 0, 2, 2), (0, 1, 2, 2), (1, 1, 2, 2)]

    # Another executor gets another job secret.
    other = RayExecutor(settings, num_workers=1)
    other.start()
    try:
        assert other.run(_job_facts)[0]["secret"] != results[0]["secret"]
    finally:
        other.shutdown()


@ray.remote(num_cpus=0)
def _executor_in_placement_group():
    """Runs inside the caller's placement group: the executor puts its workers there."""
    settings = RayExecutor.create_settings(timeout_s=60)
    executor = RayExecutor(settings)  # one worker per bundle of the placement group
    executor.start()
    try:
        created = executor.adapter.strategy._created_placement_group
        return created, executor.run(_job_facts)
    finally:
        executor.shutdown()


def test_callers_placement_group(cluster):
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    pg = ray.util.placement_group([{"CPU": 1, "hvd_test_host_1": 1}] * 2, strategy="PACK")
    assert ray.get(pg.ready(), timeout=30)
    try:
        created, results = ray.get(_executor_in_placement_group.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_capture_child_tasks=True)
        ).remote(), timeout=120)
        assert created is None
        _check_job(results, 2)
        assert {r["node"] for r in results} == {cluster.node_of_host[1]}
        # shutdown() left the caller's group alone.
        assert pg.id.hex() in _live_pgs()
    finally:
        ray.util.remove_placement_group(pg)


def _raise_on_rank_1():
    if os.environ["HOROVOD_RANK"] == "1":
        raise KeyError("failure planted in rank 1")
    return "ok"


def test_worker_exception_names_rank(cluster):
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=2)
    executor.start()
    try:
        with pytest.raises(KeyError) as info:
            executor.run(_raise_on_rank_1)
        text = str(info.value)
        # The worker's traceback, the planted error and the rank, in Ray's message itself.
        assert 'in _raise_on_rank_1\n    raise KeyError("failure planted in rank 1")' in text
        assert "raised in Horovod rank 1 of 2 (Ray node " in text
        shown = "".join(traceback.format_exception(info.value))
        assert shown.count("raised in Horovod rank 1 of 2") == 1, shown
        assert any("rank 1 of 2 failed in run()" in note for note in info.value.__notes__)
        # The executor still works for functions that do not wait on the failed rank.
        assert executor.run(lambda: "again") == ["again", "again"]
    finally:
        executor.shutdown()


def _allreduce_forever():
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics
    hvd = HorovodBasics()
    hvd.init()
    deadline = time.monotonic() + 120
    i = 0
    while time.monotonic() < deadline:
        x = np.ones(1000)
        ops.wait(ops.allreduce_async([x], [x], ["forever.%d" % (i % 8)], HorovodBasics.Sum))
        i += 1
    return i


def test_killed_worker_ends_run(cluster):
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=2)
    executor.start()
    try:
        pids = executor.run(os.getpid)
        timer = threading.Timer(3.0, os.kill, (pids[1], signal.SIGKILL))
        started = time.monotonic()
        timer.start()
        try:
            with pytest.raises(ray.exceptions.RayActorError) as info:
                executor.run(_allreduce_forever)
        finally:
            timer.cancel()
        elapsed = time.monotonic() - started
        assert elapsed < 15, "run() took %.1f s to notice the killed worker" % elapsed
        notes = "\n".join(getattr(info.value, "__notes__", []))
        assert "the worker actor of rank 1 of 2 died during run()" in notes, notes
    finally:
        executor.shutdown()


def test_placement_group_timeout(cluster):
    settings = RayExecutor.create_settings(timeout_s=30, placement_group_timeout_s=2)
    before = _live_pgs()
    # Three hosts on a two-node cluster.
    executor = RayExecutor(settings, num_hosts=3, num_workers_per_host=1)
    started = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        executor.start()
    assert time.monotonic() - started < 20
    message = str(info.value)
    assert "timed out after 2 s" in message and "3 bundle(s) of {CPU: 1}" in message
    assert "STRICT_SPREAD" in message and "on 3 different nodes" in message and "2 alive node(s)" in message
    assert executor.adapter is None
    executor.shutdown()
    # More CPUs than the cluster has.
    executor = RayExecutor(settings, num_workers=2, cpus_per_worker=CPUS_PER_NODE * NODES)
    with pytest.raises(TimeoutError, match=r"2 bundle\(s\) of \{CPU: 4\}.*\{CPU: 8\} in all.*available"):
        executor.start()
    assert _live_pgs() == before


def test_lost_node_ends_run(cluster):
    """A third node joins; a job with one worker on each node loses that node (every process of
    it SIGKILLed, as when a machine goes away): run() ends within seconds naming the rank."""
    import psutil
    popen = cluster.start_node(2, num_cpus=1)
    cluster.wait_for_nodes(NODES + 1)
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=30),
                           num_hosts=NODES + 1, num_workers_per_host=1)
    executor.start()
    try:
        nodes = executor.run(lambda: ray.get_runtime_context().get_node_id())
        lost = nodes.index(cluster.node_of_host[2])
        node_procs = [psutil.Process(popen.pid)] + psutil.Process(popen.pid).children(recursive=True)

        def stop_node():
            for proc in node_procs:
                try:
                    proc.kill()
                except psutil.Error:
                    pass

        timer = threading.Timer(3.0, stop_node)
        started = time.monotonic()
        timer.start()
        try:
            with pytest.raises(ray.exceptions.RayError) as info:
                executor.run(_allreduce_forever)
        finally:
            timer.cancel()
        elapsed = time.monotonic() - started
        assert elapsed < 20, "run() took %.1f s to notice the lost node" % elapsed
        shown = "".join(traceback.format_exception(info.value))
        assert ("the worker actor of rank %d of 3 died" % lost in shown
                or "lost its connection to rank %d " % lost in shown), shown
    finally:
        executor.shutdown()
    cluster.wait_node_dead(cluster.node_of_host[2])


# ---------------------------------------------------------------------------------------------
# Elastic mode (spec ray.md §7, §8): an SGD training whose state is a horovod.common ObjectState,
# committed after every step; the workers report each step through ray_logger to the test's
# callback, which drives the schedule (kill a worker, add a node, stop it) and finally creates the
# gate file that tells rank 0 to end the training. The result must equal a numpy replay of as
# many full-batch steps.

ELASTIC_N, ELASTIC_BATCH, ELASTIC_LR = 240, 12, 0.05  # 12 rows per step: divisible by 2, 3, 4, 6 ranks
ELASTIC_MAX_STEPS = 3000
ELASTIC_JOB_TIMEOUT_S = 240


def _elastic_data():
    rng = np.random.default_rng(7)
    X = rng.standard_normal((ELASTIC_N, 3))
    y = X @ np.array([1.5, -2.0, 0.5]) + 0.1
    return X, y


def _elastic_batch(step):
    return (np.arange(ELASTIC_BATCH) + step * ELASTIC_BATCH) % ELASTIC_N


def _elastic_grad(w, X, y):
    """Gradient of the squared error summed over the rows of X: (weights, bias)."""
    err = X @ w[:3] + w[3] - y
    return 2 * np.concatenate([X.T @ err, [err.sum()]])


def _elastic_reference(steps):
    X, y = _elastic_data()
    w = np.zeros(4)
    for step in range(steps):
        idx = _elastic_batch(step)
        w = w - ELASTIC_LR * _elastic_grad(w, X[idx], y[idx]) / ELASTIC_BATCH
    return w


def _elastic_train(gate, min_steps, step_sleep_s):
    """The workers' function: hvd.elastic-style training through horovod.common only."""
    import pickle

    from horovod.common import elastic, ops
    from horovod.common.basics import HorovodBasics
    from horovod.ray import ray_logger

    hvd = HorovodBasics()
    hvd.init()

    def bcast_object(obj):
        data = np.frombuffer(pickle.dumps(obj), np.uint8).copy() if hvd.rank() == 0 else None
        n = np.array([0 if data is None else data.size], np.int64)
        ops.wait(ops.broadcast_async([n], ["test.bcast.n"], 0))
        if data is None:
            data = np.zeros(int(n[0]), np.uint8)
        ops.wait(ops.broadcast_async([data], ["test.bcast.data"], 0))
        return pickle.loads(data.tobytes())

    def reset():
        hvd.shutdown()
        hvd.init()

    def train(state):
        X, y = _elastic_data()
        while state.step < ELASTIC_MAX_STEPS:
            idx = _elastic_batch(state.step)[hvd.rank()::hvd.size()]
            stop = float(hvd.rank() == 0 and state.step >= min_steps and os.path.exists(gate))
            buf = np.concatenate([_elastic_grad(state.w, X[idx], y[idx]), [stop]])
            ops.wait(ops.allreduce_async([buf], [buf], ["test.grad"], HorovodBasics.Sum))
            state.w = state.w - ELASTIC_LR * buf[:4] / ELASTIC_BATCH
            state.step += 1
            ray_logger.log({"rank": hvd.rank(), "size": hvd.size(), "step": state.step, "pid": os.getpid(),
                            "node": ray.get_runtime_context().get_node_id()})
            state.commit()
            if buf[4] > 0:
                break
            time.sleep(step_sleep_s)
        return {"w": state.w.tolist(), "step": state.step, "rank": hvd.rank(), "size": hvd.size(),
                "local_size": hvd.local_size(), "cross_size": hvd.cross_size()}

    state = elastic.ObjectState(bcast_object, hvd.rank, w=np.zeros(4), step=0)
    return elastic.run_fn(train, reset)(state)


class Schedule:
    """The records the workers send, and a thread that waits for conditions on them."""

    def __init__(self, gate):
        self.gate = gate
        self.records = []
        self.cond = threading.Condition()
        self.error = None

    def __call__(self, record):
        with self.cond:
            self.records.append(record)
            self.cond.notify_all()

    def wait_for(self, predicate, what, timeout_s=ELASTIC_JOB_TIMEOUT_S / 2):
        """The first record satisfying ``predicate``, waiting up to ``timeout_s`` for it."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while True:
                for record in self.records:
                    if predicate(record):
                        return record
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError("no worker reported %s within %d s; sizes seen: %s"
                                         % (what, timeout_s, sorted({r["size"] for r in self.records})))
                self.cond.wait(min(left, 1.0))

    def run(self, steps):
        """Run ``steps`` (a function) in a thread; the gate is opened when it ends, even on error,
        so that the training never outlives the test."""
        def body():
            try:
                steps()
            except BaseException as e:
                self.error = e
            finally:
                pathlib.Path(self.gate).touch()
        thread = threading.Thread(target=body, daemon=True)
        thread.start()
        return thread


def _check_elastic_results(results, size):
    assert [r["rank"] for r in results] == list(range(size)), results
    assert {r["size"] for r in results} == {size}
    steps = {r["step"] for r in results}
    assert len(steps) == 1, results
    expected = _elastic_reference(steps.pop())
    for r in results:
        # Identical on every rank, and equal to the single-process replay.
        assert r["w"] == results[0]["w"]
        np.testing.assert_allclose(r["w"], expected, rtol=1e-9, atol=1e-12)


def test_ray_host_discovery(cluster):
    from horovod.ray.elastic_v2 import RayHostDiscovery
    nodes = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    found = RayHostDiscovery(cpus_per_worker=1).find_available_hosts_and_slots()
    assert {h: s for h, s in found.items() if h in cluster.node_of_host.values()} == \
        {cluster.node_of_host[h]: CPUS_PER_NODE for h in range(NODES)}
    assert set(found) <= nodes
    assert set(RayHostDiscovery(cpus_per_worker=2).find_available_hosts_and_slots().values()) <= {1}
    assert RayHostDiscovery(use_gpu=True).find_available_hosts_and_slots() == {}  # no GPUs here
    with pytest.raises(ValueError, match="cpus_per_worker > 0"):
        RayHostDiscovery(cpus_per_worker=0)


def test_elastic_killed_worker(cluster, tmp_path):
    """4 workers on 2 nodes; one is SIGKILLed mid-training: its node is blacklisted and the 2
    workers of the other node restore the last commit and finish."""
    gate = str(tmp_path / "gate")
    schedule = Schedule(gate)
    settings = RayExecutor.create_settings(timeout_s=60)
    executor = RayExecutor(settings, min_workers=2, max_workers=4, cpus_per_worker=1, elastic_timeout=60)
    executor.start()

    def steps():
        victim = schedule.wait_for(lambda r: r["size"] == 4 and r["step"] >= 5 and r["rank"] == 3,
                                   "step 5 at size 4")
        os.kill(victim["pid"], signal.SIGKILL)
        schedule.wait_for(lambda r: r["size"] == 2 and r["step"] >= victim["step"] + 5, "5 steps at size 2")

    try:
        thread = schedule.run(steps)
        results = executor.run(_elastic_train, args=[gate, 5, 0.05], callbacks=[schedule])
        thread.join(30)
    finally:
        executor.shutdown()
    if schedule.error:
        raise schedule.error
    _check_elastic_results(results, 2)
    assert {r["size"] for r in schedule.records} == {4, 2}
    victim_node = [r for r in schedule.records if r["size"] == 4 and r["rank"] == 3][0]["node"]
    # The killed worker's node was blacklisted: the other node's two workers finished.
    assert len({r["node"] for r in schedule.records if r["size"] == 2}) == 1
    assert victim_node not in {r["node"] for r in schedule.records if r["size"] == 2}


def test_elastic_node_added_then_stopped(cluster, tmp_path):
    """4 workers on 2 nodes; a third node joins (6 workers), then is stopped (every process
    SIGKILLed): training goes on at 4 and ends with the replay's parameters."""
    import psutil
    gate = str(tmp_path / "gate")
    schedule = Schedule(gate)
    settings = RayExecutor.create_settings(timeout_s=60)
    executor = RayExecutor(settings, min_workers=2, max_workers=6, cpus_per_worker=1, elastic_timeout=60)
    executor.start()
    added = {}

    def steps():
        schedule.wait_for(lambda r: r["size"] == 4 and r["step"] >= 5, "step 5 at size 4")
        added["popen"] = cluster.start_node(3, num_cpus=CPUS_PER_NODE)
        grown = schedule.wait_for(lambda r: r["size"] == 6 and r["step"] >= 1, "a step at size 6")
        node = schedule.wait_for(lambda r: r["size"] == 6 and r["node"] not in
                                 {cluster.node_of_host.get(h) for h in range(NODES)}, "a worker on the new node")
        added["node"] = node["node"]
        popen = added["popen"]
        for proc in [psutil.Process(popen.pid)] + psutil.Process(popen.pid).children(recursive=True):
            try:
                proc.kill()
            except psutil.Error:
                pass
        schedule.wait_for(lambda r: r["size"] == 4 and r["step"] >= grown["step"] + 5, "5 steps at size 4 again")
        popen.wait(timeout=STOP_TIMEOUT_S)

    try:
        thread = schedule.run(steps)
        results = executor.run(_elastic_train, args=[gate, 5, 0.05], callbacks=[schedule])
        thread.join(30)
    finally:
        executor.shutdown()
    if schedule.error:
        raise schedule.error
    _check_elastic_results(results, 4)
    cluster.wait_node_dead(added["node"])
    sizes = [r["size"] for r in schedule.records if r["rank"] == 0]
    # 4, then 6, then 4 again, in that order; after the last step at 6, only the first two nodes.
    assert sizes[0] == 4 and 6 in sizes and sizes[-1] == 4
    last_at_6 = max(i for i, r in enumerate(schedule.records) if r["size"] == 6)
    assert {r["size"] for r in schedule.records[last_at_6 + 1:]} == {4}
    assert added["node"] not in {r["node"] for r in schedule.records[last_at_6 + 1:]}


def _every_rank_fails():
    raise ValueError("planted failure on %s" % os.environ["HOROVOD_HOSTNAME"])


def test_elastic_every_worker_fails_and_deprecated_executor(cluster):
    from horovod.ray import ElasticRayExecutor
    settings = RayExecutor.create_settings(timeout_s=60)
    executor = RayExecutor(settings, min_workers=2, max_workers=2, elastic_timeout=60)
    executor.start()
    try:
        with pytest.raises(NotImplementedError, match="execute_single"):
            executor.execute_single(lambda _: 1)
        with pytest.raises(NotImplementedError, match="run_remote"):
            executor.run_remote(lambda: 1)
        with pytest.raises(RuntimeError, match=r"every worker failed \(.*\[0\], .*\[1\]\)"):
            executor.run(_every_rank_fails)
    finally:
        executor.shutdown()

    # The deprecated executor: worker_fn() with no arguments on every slot (2 nodes x 2).
    with pytest.warns(DeprecationWarning, match="min_num_proc"):
        settings = ElasticRayExecutor.create_settings(min_np=2, timeout_s=60, elastic_timeout=60)
    assert settings.min_num_proc == 2 and settings.max_num_proc is None and len(settings.key) == 32
    with pytest.warns(DeprecationWarning, match="RayExecutor"):
        executor = ElasticRayExecutor(settings, cpus_per_slot=1, env_vars={"HVD_RAY_TEST_EXTRA": "v"})
    executor.start()
    try:
        assert executor.driver is not None
        results = executor.run(lambda: _job_facts() | {"extra": os.environ["HVD_RAY_TEST_EXTRA"]})
    finally:
        executor.shutdown()
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    expected_sum = sum(np.arange(6, dtype=np.float64) * (r + 1) + r for r in range(4))
    for r in results:
        np.testing.assert_array_equal(np.array(r["sum"]), expected_sum)
        assert r["extra"] == "v" and r["env"]["HOROVOD_ELASTIC"] == "1"
        assert (r["local_size"], r["cross_size"]) == (2, 2)
        assert r["env"]["HOROVOD_HOSTNAME"] == r["node"]


# ---------------------------------------------------------------------------------------------
# ray_logger callbacks in static mode (elastic mode: the tests above drive their schedules by them).

def _report_three():
    from horovod.ray import ray_logger
    for i in range(3):
        ray_logger.log({"rank": int(os.environ["HOROVOD_RANK"]), "i": i})
    return "done"


def _log_unconfigured():
    import warnings

    from horovod.ray import ray_logger
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ray_logger.log({"dropped": 1})
        ray_logger.log({"dropped": 2})
    return [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


def test_ray_logger_static(cluster):
    from horovod.ray import ray_logger
    with pytest.raises(ValueError, match="takes a dict"):
        ray_logger.log(["not", "a", "dict"])
    records, records2 = [], []
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=2)
    executor.start(executable_cls=Counter, executable_args=[0])
    try:
        assert executor.run(_report_three, callbacks=[records.append, records2.append]) == ["done", "done"]
        # Every record reached every callback; each worker's records in the order it sent them.
        assert records == records2
        for rank in range(2):
            assert [r["i"] for r in records if r["rank"] == rank] == [0, 1, 2]
        assert len(records) == 6
        assert executor.execute(lambda _: _report_three(), callbacks=[records.append]) == ["done", "done"]
        assert len(records) == 12
        # Without callbacks the records are dropped, with one warning per process.
        warned = executor.run(_log_unconfigured)
        assert [len(w) for w in warned] == [1, 1] and "not configured" in warned[0][0]
    finally:
        executor.shutdown()


# ---------------------------------------------------------------------------------------------
# The names Ray Train's Horovod backend imports (spec ray.md §9): ray.train.horovod.config
# (Ray 2.x, Train V1) imports horovod.ray.runner.Coordinator, horovod.ray.utils.detect_nics and
# nics_to_env_var, and horovod.runner.common.util.secret/timeout. Installing ray[train] would
# pull in pyarrow, pandas and fsspec, so this test follows the steps of its _HorovodBackend.on_start
# with a settings class that has HorovodConfig's fields, on actors of our own.

def test_ray_train_backend_steps(cluster):
    import dataclasses
    from typing import Optional

    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from horovod.ray.runner import Coordinator
    from horovod.ray.utils import detect_nics, nics_to_env_var
    from horovod.ray.worker import BaseHorovodWorker
    from horovod.runner.common.util import secret, timeout

    @dataclasses.dataclass
    class TrainStyleConfig:
        nics: Optional[set] = None
        verbose: int = 1
        key: Optional[str] = None
        ssh_port: Optional[int] = None
        ssh_identity_file: Optional[str] = None
        ssh_str: Optional[str] = None
        timeout_s: int = 300
        placement_group_timeout_s: int = 100

        @property
        def start_timeout(self):
            return timeout.Timeout(self.timeout_s, message="Timed out waiting for {activity}.")

        def __post_init__(self):
            if self.key is None:
                self.key = secret.make_secret_key()

    class ExecuteOnly:
        """A node worker as Ray Train hands it to detect_nics: only ``.execute.remote(fn)``,
        which calls ``fn()`` without arguments."""

        def __init__(self, actor):
            self._actor = actor

        @property
        def execute(self):
            actor = self._actor

            class Handle:
                def remote(self, func, *args, **kwargs):
                    return actor.execute.remote(lambda _executable: func(*args, **kwargs))
            return Handle()

    config = TrainStyleConfig(timeout_s=60)
    node_of_rank = [cluster.node_of_host[0], cluster.node_of_host[1], cluster.node_of_host[0],
                    cluster.node_of_host[1]]
    workers = [ray.remote(BaseHorovodWorker).options(
        num_cpus=1, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
        for node in node_of_rank]
    coordinator = Coordinator(config)
    try:
        node_ids = ray.get([w.node_id.remote() for w in workers])
        hostnames = ray.get([w.hostname.remote() for w in workers])
        assert node_ids == node_of_rank
        ray.get([w.update_env_vars.remote({"HOROVOD_HOSTNAME": node, "HOROVOD_RANK": rank, "HOROVOD_SIZE": 4})
                 for rank, (w, node) in enumerate(zip(workers, node_ids, strict=True))])
        for rank, (hostname, node_id) in enumerate(zip(hostnames, node_ids, strict=True)):
            coordinator.register(hostname, node_id, rank)
        all_info = coordinator.finalize_registration()
        ray.get([workers[rank].update_env_vars.remote(env) for rank, env in all_info.items()])
        coordinator_envs = coordinator.establish_rendezvous()
        # Ray Train takes one worker per Ray node and asserts there are as many as host names;
        # both nodes of this cluster are on one machine (one host name), so one worker here.
        node_workers = [ExecuteOnly(workers[hostnames.index(host)]) for host in coordinator.hostnames]
        nics = detect_nics(config, all_host_names=list(coordinator.hostnames), node_workers=node_workers)
        coordinator_envs.update(nics_to_env_var(nics))
        ray.get([w.update_env_vars.remote(coordinator_envs) for w in workers])
        results = ray.get([w.execute.remote(lambda _: _job_facts()) for w in workers], timeout=120)
    finally:
        coordinator.shutdown()
        for w in workers:
            ray.kill(w)
    _check_job(results, 4)
    assert [r["cross_size"] for r in results] == [2] * 4 and [r["local_rank"] for r in results] == [0, 0, 1, 1]


def test_docs_example_runs_as_written(cluster):
    """docs/examples/ray/ray_digits.py, its command line as docs/ray.md shows it, against this
    cluster (a driver process of its own)."""
    example = REPO / "docs" / "examples" / "ray" / "ray_digits.py"
    out = subprocess.run([sys.executable, str(example), "--address", cluster.address, "--num-workers", "2",
                          "--epochs", "3"], capture_output=True, text=True, timeout=300, cwd=str(REPO / "build"))
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("rank ")]
    assert [line.split()[1] for line in lines] == ["0", "1"], out.stdout
    assert len({line.rsplit(" ", 1)[1] for line in lines}) == 1  # the same parameters' digest


def test_elastic_own_discovery(cluster):
    """override_discovery=False: the caller's HostDiscovery (the launcher's FixedHosts), its host
    pinned through Ray's node:<ip> resource; with nics given, one host is enough to start."""
    from horovod.runner.elastic.discovery import FixedHosts
    settings = RayExecutor.create_settings(timeout_s=60, nics={"lo"})
    executor = RayExecutor(settings, min_workers=2, elastic_timeout=60, override_discovery=False)
    with pytest.raises(ValueError, match="settings.discovery"):
        executor.start()
    settings.discovery = FixedHosts({cluster.node_ip: 2})
    executor.start(executable_cls=Counter, executable_args=[5])
    try:
        results = executor.run(_job_facts)
        # execute: fn(executable) in every worker; each job's workers are new actors.
        assert executor.execute(lambda c: c.bump()) == [6, 6]
        assert executor.execute(lambda c: (c.bump(), os.environ["HOROVOD_RANK"])) == [(6, "0"), (6, "1")]
    finally:
        executor.shutdown()
    seen = [(r["rank"], r["env"]["HOROVOD_HOSTNAME"], r["env"]["HOROVOD_GLOO_IFACE"]) for r in results]
    assert seen == [(0, cluster.node_ip, "lo"), (1, cluster.node_ip, "lo")]
    expected_sum = sum(np.arange(6, dtype=np.float64) * (r + 1) + r for r in range(2))
    for r in results:
        np.testing.assert_array_equal(np.array(r["sum"]), expected_sum)
