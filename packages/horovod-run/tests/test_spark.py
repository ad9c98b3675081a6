"""horovod.spark.run on a real Spark standalone cluster (pyspark 4, Java 17): a master and two
workers started here with the pyspark wheel's ``spark-class``, every file under the checkout's
build/spark-test, every address on 127.0.0.1, each process stopped by PID at the end (and checked).

Each worker runs in a UTS namespace of its own with a host name of its own (``unshare --uts``;
the host hash covers the namespaces), so its executor counts as a host of its own: the two
executors are two Horovod hosts on one machine. (``CONTAINER_ID``, the other way to tell hosts
apart, makes Spark take itself for a YARN container.) Where ``unshare`` is not permitted, both are
one host and the tests say so.
Run by ``nox -s tests-spark``.
"""

import contextlib
import io
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import types

import cloudpickle
import numpy as np
import psutil
import pytest

pyspark = pytest.importorskip("pyspark")

from pyspark import SparkConf, SparkContext  # noqa: E402

import horovod.spark  # noqa: E402
from horovod.spark import conf as hvd_conf  # noqa: E402
from horovod.runner.common.util.timeout import TimeoutException  # noqa: E402

# The ranks' functions travel by value: the executors cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROOT = pathlib.Path(__file__).resolve().parents[3]
BASE = ROOT / "build" / "spark-test"
WORKERS = 2
CORES_PER_WORKER = 2  # task slots per executor: 4 in all
# unshare(1) and the shell exec their commands, so the PID is the daemon's.
UNSHARE = shutil.which("unshare") is not None and subprocess.run(
    ["unshare", "--uts", "true"], capture_output=True).returncode == 0
JAVA_OPTS = "-Djava.io.tmpdir={tmp} -XX:-UsePerfData -Xss4m"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(host, port, proc, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the Spark master exited with %s" % proc.returncode)
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError("the Spark master did not listen on port %d" % port)


def _descendants(pids):
    found = {}
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            found[pid] = proc
            for child in proc.children(recursive=True):
                found[child.pid] = child
        except psutil.NoSuchProcess:
            pass
    return found


def _alive(procs):
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.NoSuchProcess:
            pass
    return alive


class Cluster:
    """A Spark standalone cluster under ``base``: a master on ``host`` and workers started by
    :meth:`start_worker`, each daemon a child of this process (``spark-class`` execs the JVM)."""

    def __init__(self, base=BASE, host="127.0.0.1"):
        if base.exists():
            shutil.rmtree(base)
        self.base = base
        self.host = host
        self.tmp = base / "tmp"
        for sub in ("tmp", "logs", "local", "work"):
            (base / sub).mkdir(parents=True)
        spark_home = pathlib.Path(pyspark.__file__).parent
        self.spark_class = str(spark_home / "bin" / "spark-class")
        self.env = dict(os.environ, SPARK_HOME=str(spark_home), SPARK_LOCAL_IP=host,
                        SPARK_LOCAL_DIRS=str(base / "local"), SPARK_LOG_DIR=str(base / "logs"),
                        SPARK_WORKER_DIR=str(base / "work"), SPARK_DAEMON_MEMORY="256m",
                        SPARK_DAEMON_JAVA_OPTS=JAVA_OPTS.format(tmp=self.tmp), TMPDIR=str(self.tmp),
                        PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                        JAVA_TOOL_OPTIONS="-XX:-UsePerfData")
        self.port = _free_port()
        self.procs = []
        self.logs = []

    @property
    def url(self):
        return "spark://%s:%d" % (self.host, self.port)

    def _start(self, name, argv, env=None):
        log = open(self.base / "logs" / (name + ".out"), "wb")
        self.logs.append(log)
        proc = subprocess.Popen(argv, env=env or self.env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        return proc

    def start_master(self):
        master = self._start("master", [self.spark_class, "org.apache.spark.deploy.master.Master", "--host",
                                        self.host, "--port", str(self.port), "--webui-port", str(_free_port())])
        _wait_port(self.host, self.port, master)

    def start_worker(self, i, host="127.0.0.1", prefix=()):
        """Worker ``i`` bound to ``host``, its command line after ``prefix`` (e.g. a namespace's)."""
        work = self.base / "work" / ("worker-%d" % i)
        work.mkdir()
        argv = [*prefix, self.spark_class, "org.apache.spark.deploy.worker.Worker", "--host", host,
                "--cores", str(CORES_PER_WORKER), "--memory", "768m", "--webui-port", str(_free_port()),
                "--work-dir", str(work), self.url]
        self._start("worker-%d" % i, argv, env=dict(self.env, SPARK_LOCAL_IP=host))

    def start(self):
        self.start_master()
        for i in range(WORKERS):
            # A host name of its own too, as separate machines have: Open MPI names its
            # shared-memory segments after the host name.
            own_host = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', "spark-worker-%d" % i]
            self.start_worker(i, prefix=own_host if UNSHARE else ())

    def executors(self):
        """The executor JVMs (children of the worker JVMs)."""
        found = []
        for proc in self.procs[1:]:
            for child in psutil.Process(proc.pid).children():
                try:
                    if "CoarseGrainedExecutorBackend" in " ".join(child.cmdline()):
                        found.append(child)
                except psutil.NoSuchProcess:  # an executor that ended (a zombie)
                    pass
        return found

    def stop(self, also=(), known=()):
        """SIGTERM every daemon (a worker stops its executors), then SIGKILL what is left;
        return the processes still alive (none expected). ``known`` are processes seen earlier:
        a Python worker of a task Spark killed may have lost its parent (and left this tree) by
        now, and it too gets 10 s to end."""
        procs = _descendants([p.pid for p in self.procs] + list(also))
        procs.update({proc.pid: proc for proc in known if proc.pid not in procs})
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        _, left = psutil.wait_procs(_alive(procs.values()), timeout=10)
        for proc in left:
            proc.kill()
        for log in self.logs:
            log.close()
        return left


@contextlib.contextmanager
def spark_context(cluster, workers, driver_host="127.0.0.1"):
    """A SparkContext on ``cluster`` once its ``workers`` executors registered; at the end the
    context, its gateway JVM and the cluster are stopped and every process is checked gone."""
    os.environ["TMPDIR"] = str(cluster.tmp)  # pyspark's gateway files
    os.environ["JAVA_TOOL_OPTIONS"] = "-XX:-UsePerfData"  # no /tmp/hsperfdata_<user>
    java_opts = JAVA_OPTS.format(tmp=cluster.tmp)
    conf = (SparkConf().setMaster(cluster.url).setAppName("horovod-spark-test")
            .set("spark.driver.host", driver_host).set("spark.driver.bindAddress", driver_host)
            .set("spark.driver.memory", "512m").set("spark.executor.memory", "512m")
            .set("spark.executor.cores", str(CORES_PER_WORKER)).set("spark.cores.max", str(workers * CORES_PER_WORKER))
            .set("spark.local.dir", str(cluster.base / "local")).set("spark.ui.enabled", "false")
            .set("spark.ui.showConsoleProgress", "false")
            # Elastic recovery goes through task retries; the elastic tests bound them with reset_limit.
            .set(*hvd_conf.SPARK_CONF_ALWAYS_RESTART_FAILED_TASK)
            .set("spark.driver.extraJavaOptions", java_opts).set("spark.executor.extraJavaOptions", java_opts)
            .set("spark.executorEnv.TMPDIR", str(cluster.tmp))
            .set("spark.executorEnv.PYSPARK_PYTHON", sys.executable))
    context = None
    gateway_pid = None
    try:
        context = SparkContext(conf=conf)
        gateway_pid = SparkContext._gateway.proc.pid
        deadline = time.monotonic() + 90
        while context._jsc.sc().getExecutorMemoryStatus().size() < workers + 1:
            assert time.monotonic() < deadline, "the executors did not register"
            time.sleep(0.5)
        context.cluster = cluster
        yield context
    finally:
        also = [gateway_pid] if gateway_pid else []
        procs = _descendants([p.pid for p in cluster.procs] + also)
        if context is not None:
            context.stop()
            SparkContext._gateway.shutdown()
            SparkContext._gateway.proc.stdin.close()
            SparkContext._gateway.proc.wait(timeout=30)
            SparkContext._gateway = None
            SparkContext._jvm = None
        left = cluster.stop(also, known=procs.values())
        os.environ.pop("TMPDIR", None)
        os.environ.pop("JAVA_TOOL_OPTIONS", None)
        still = _alive(procs.values())
        assert not left and not still, "processes left running: %s" % [p.pid for p in left + still]


@pytest.fixture(scope="module")
def sc():
    cluster = Cluster()
    cluster.start()
    with spark_context(cluster, WORKERS) as context:
        yield context


def _load_digits_example():
    """docs/examples/spark/spark_digits.py as a module whose functions travel by value."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("spark_digits",
                                                  ROOT / "docs" / "examples" / "spark" / "spark_digits.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["spark_digits"] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    return module


def check_digits(results, size):
    """The digits example's results: rank order, accuracy >= 0.95 and the same parameters on
    every rank; returns the ranks grouped by host."""
    for r in results:
        assert r["accuracy"] >= 0.95, results
    assert len({r["digest"] for r in results}) == 1, "the ranks' parameters differ: %s" % results
    return _check_layout(results, size)


def _check_layout(results, size):
    """Results in rank order; ranks fill hosts in order, local ranks count up within a host,
    cross ranks index the hosts holding that local rank (runner.md §4.2). Returns the results
    grouped by host, hosts in order of their first rank."""
    assert [r["rank"] for r in results] == list(range(size))
    hosts = []
    for r in results:
        if r["host"] not in hosts:
            hosts.append(r["host"])
    by_host = {h: [r for r in results if r["host"] == h] for h in hosts}
    for members in by_host.values():
        ranks = [r["rank"] for r in members]
        assert ranks == list(range(ranks[0], ranks[0] + len(ranks))), "a host's ranks are consecutive"
        assert [r["local_rank"] for r in members] == list(range(len(members)))
        assert all(r["local_size"] == len(members) for r in members)
    for r in results:
        holders = [h for h in hosts if len(by_host[h]) > r["local_rank"]]
        assert r["cross_rank"] == holders.index(r["host"]) and r["cross_size"] == len(holders)
    return by_host


# ---------------------------------------------------------------------------------------------
# Functions the ranks run.

def _job_facts():
    """The rank's topology, the result of a Sum allreduce (see _check_topology) and its process."""
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics
    hvd = HorovodBasics()
    hvd.init()
    x = np.arange(6, dtype=np.float64) * (hvd.rank() + 1) + hvd.rank()
    ops.wait(ops.allreduce_async([x], [x], ["spark.test.sum"], HorovodBasics.Sum))
    facts = {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
             "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(), "sum": x.tolist(),
             "host": os.environ.get("HOROVOD_HOSTNAME"), "pid": os.getpid(), "ppid": os.getppid(),
             "env": dict(os.environ), "mpi": hvd.mpi_enabled(), "secret": os.environ.get("_HOROVOD_SECRET_KEY"),
             "cwd": os.getcwd()}
    hvd.shutdown()
    return facts


def _check_topology(results, size):
    """The rank layout (_check_layout), the launcher's environment of every rank, and the sum
    is numpy's."""
    by_host = _check_layout(results, size)
    for r in results:
        assert r["size"] == size
        env = r["env"]
        assert env["HOROVOD_CONTROLLER"] == "gloo" and env["PYTHONUNBUFFERED"] == "1"
        assert env["HOROVOD_RANK"] == str(r["rank"]) and env["HOROVOD_LOCAL_RANK"] == str(r["local_rank"])
        assert len(bytes.fromhex(env["_HOROVOD_SECRET_KEY"])) == 32
    expected = sum(np.arange(6, dtype=np.float64) * (k + 1) + k for k in range(size))
    for r in results:
        np.testing.assert_allclose(r["sum"], expected)
    assert len({r["pid"] for r in results}) == size
    assert len({r["env"]["_HOROVOD_SECRET_KEY"] for r in results}) == 1
    return by_host


# ---------------------------------------------------------------------------------------------
# Without a cluster.

def test_import_without_pyspark_names_the_extra():
    code = ("import sys\nsys.modules['pyspark'] = None\n"
            "try:\n    import horovod.spark\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert 'pip install "horovod-run[spark]"' in out


def test_no_active_context(monkeypatch):
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    with pytest.raises(Exception, match="Could not find an active SparkContext"):
        horovod.spark.run(_job_facts, num_proc=1)


def test_bad_arguments(monkeypatch):
    monkeypatch.setattr(SparkContext, "_active_spark_context", object())
    with pytest.raises(Exception, match="env argument must be a dict"):
        horovod.spark.run(_job_facts, num_proc=1, use_mpi=True, env=os.environ)
    with pytest.raises(ValueError, match="choose one controller"):
        horovod.spark.run(_job_facts, num_proc=1, use_mpi=True, use_gloo=True)
    with pytest.raises(ValueError, match="env must be a mapping"):
        horovod.spark.run(_job_facts, num_proc=1, env=[("A", "1")])
    with pytest.raises(ValueError, match="num_proc must be a positive integer"):
        horovod.spark.run(_job_facts, num_proc=0)


def test_host_plan_orders_hosts_and_local_ranks():
    from horovod.spark.common.util import RegisterTask
    from horovod.spark.runner import _host_plan

    def reg(index, host):
        return RegisterTask(index, 0, host, ["lo"], ["lo"], [])

    # Hashes sorted (a < b < c), rotated so that task 0's host (b) comes first; a host's tasks in
    # increasing index order.
    registrations = {i: reg(i, h) for i, h in enumerate(["b", "c", "a", "b", "a", "c"])}
    assert _host_plan(registrations) == [("b", [0, 3]), ("c", [1, 5]), ("a", [2, 4])]


def test_sealed_secret():
    from horovod.spark.common.util import seal, unseal

    key, other, secret = os.urandom(32), os.urandom(32), os.urandom(32)
    sealed = seal(key, secret)
    assert secret not in sealed and len(sealed) == 16 + len(secret)
    assert seal(key, secret) != sealed  # a fresh nonce each time
    assert unseal(key, sealed) == secret
    assert unseal(other, sealed) != secret


# ---------------------------------------------------------------------------------------------
# On the cluster.

@pytest.mark.parametrize("num_proc", [1, 2, 4])
def test_run_topology_allreduce_rank_order(sc, num_proc):
    results = horovod.spark.run(_job_facts, num_proc=num_proc, start_timeout=60, verbose=0)
    by_host = _check_topology(results, num_proc)
    if num_proc == 4 and UNSHARE:
        # Four tasks fill both executors' two slots: two hosts of two ranks.
        assert sorted(len(m) for m in by_host.values()) == [2, 2]
    # The rendezvous secret is in no Spark job property and on no command line.
    secret = results[0]["env"]["_HOROVOD_SECRET_KEY"]
    for proc in _descendants([p.pid for p in sc.cluster.procs]).values():
        try:
            assert secret not in " ".join(proc.cmdline())
        except psutil.NoSuchProcess:
            pass
    assert secret not in str(sc.getConf().getAll())
    # Nor in any log of the master, the workers and the executors.
    for path in BASE.rglob("*"):
        if path.is_file() and path.stat().st_size < 50 * 1024 * 1024:
            assert secret.encode() not in path.read_bytes(), path


def test_default_num_proc_env_and_output(sc):
    def fn(tag):
        import horovod.common.basics
        hvd = horovod.common.basics.HorovodBasics()
        hvd.init()
        print("hello from %d" % hvd.rank())
        print("to stderr %d" % hvd.rank(), file=sys.stderr)
        return tag, os.environ.get("MY_VAR"), os.environ.get("CUDA_VISIBLE_DEVICES"), hvd.rank()

    out, err = io.StringIO(), io.StringIO()
    # Any mapping (os.environ is not a dict); the export filter of horovodrun applies.
    env = types.MappingProxyType({"MY_VAR": "v", "CUDA_VISIBLE_DEVICES": "7"})
    results = horovod.spark.run(fn, args=("t",), env=env, stdout=out, stderr=err, verbose=0, start_timeout=60)
    n = sc.defaultParallelism
    assert n == WORKERS * CORES_PER_WORKER
    assert results == [("t", "v", None, k) for k in range(n)]
    for k in range(n):
        assert "[%d]<stdout>:hello from %d\n" % (k, k) in out.getvalue()
        assert "[%d]<stderr>:to stderr %d\n" % (k, k) in err.getvalue()


def test_allgather_pairs_in_rank_order(sc):
    def fn():
        from horovod.common import ops
        from horovod.common.basics import HorovodBasics
        hvd = HorovodBasics()
        hvd.init()
        x = np.array([hvd.rank()], dtype=np.int64)
        (out,) = ops.wait(ops.allgather_async([x], ["spark.test.gather"]))
        print("gathered", os.environ["HOROVOD_GLOO_IFACE"], os.environ["NCCL_SOCKET_IFNAME"])
        return [int(v) for v in np.asarray(out)], hvd.rank()

    out = io.StringIO()
    # nics: the driver service and Gloo use loopback only (every process is on this machine).
    assert horovod.spark.run(fn, num_proc=2, verbose=0, nics=["lo"], stdout=out,
                             prefix_output_with_timestamp=True) == [([0, 1], 0), ([0, 1], 1)]
    ranks = []
    for line in out.getvalue().splitlines():
        # time.asctime(), then the rank prefix.
        match = re.fullmatch(r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\[(\d)\]<stdout>:gathered lo lo", line)
        assert match, line
        ranks.append(int(match.group(1)))
    assert sorted(ranks) == [0, 1]


@pytest.mark.parametrize("num_proc", [2, 4])
def test_digits_example(sc, num_proc):
    digits = _load_digits_example()
    results = horovod.spark.run(digits.train, num_proc=num_proc, start_timeout=60, verbose=0)
    by_host = check_digits(results, num_proc)
    if num_proc == 4 and UNSHARE:
        assert sorted(len(m) for m in by_host.values()) == [2, 2]


def _exit_with(code):
    sys.exit(code)


def test_sys_exit(sc):
    """sys.exit(0) in fn counts as returning None; another status is the rank's failure."""
    assert horovod.spark.run(_exit_with, args=(0,), num_proc=2, verbose=0, start_timeout=60) == [None, None]
    with pytest.raises(RuntimeError, match=r"Process name: \d\nExit code: 3\n"):
        horovod.spark.run(_exit_with, args=(3,), num_proc=2, verbose=0, start_timeout=60)


def _mpi_args(sc):
    # Open MPI's session folders under the cluster's, not /tmp.
    return "--oversubscribe -mca orte_tmpdir_base %s" % sc.cluster.tmp


@pytest.fixture
def mpi_as_root(monkeypatch):
    if os.geteuid() == 0:
        monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT", "1")
        monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")


@pytest.mark.parametrize("num_proc", [2, 4])
def test_run_with_mpi(sc, mpi_as_root, num_proc):
    out = io.StringIO()
    try:
        results = horovod.spark.run(_job_facts, num_proc=num_proc, use_mpi=True, extra_mpi_args=_mpi_args(sc),
                                    start_timeout=60, verbose=0, stdout=out, stderr=out)
    except RuntimeError:
        print(out.getvalue())  # mpirun's output, for the failure's report
        raise
    assert [r["rank"] for r in results] == list(range(num_proc)), out.getvalue()
    expected = sum(np.arange(6, dtype=np.float64) * (k + 1) + k for k in range(num_proc))
    for r in results:
        assert r["mpi"] and r["size"] == num_proc
        np.testing.assert_allclose(r["sum"], expected)
        assert r["secret"] is None  # taken out of the environment before fn runs
        assert "/work/" in r["cwd"] or "worker" in r["cwd"], r["cwd"]
    if num_proc == 4 and UNSHARE:
        # Two executor hosts of two tasks: mpirun's -H lists them with two slots each.
        assert [(r["local_rank"], r["local_size"], r["cross_rank"], r["cross_size"]) for r in results] == [
            (0, 2, 0, 2), (1, 2, 0, 2), (0, 2, 1, 2), (1, 2, 1, 2)]


def test_run_with_mpi_rank_exception(sc, mpi_as_root):
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"mpirun failed with exit code \d+") as info:
        horovod.spark.run(_raise_on_rank_1, num_proc=2, use_mpi=True, extra_mpi_args=_mpi_args(sc),
                          start_timeout=60, verbose=0)
    assert "Traceback of rank 1" in str(info.value) and "ValueError: rank one says no" in str(info.value)
    # mpirun stopped rank 0 instead of waiting for the end of its 60 s sleep.
    assert time.monotonic() - start < 60
    # The slots are free again.
    assert [r["rank"] for r in horovod.spark.run(_job_facts, num_proc=4, use_mpi=True, verbose=0,
                                                 extra_mpi_args=_mpi_args(sc), start_timeout=60)] == [0, 1, 2, 3]


def _raise_on_rank_1():
    from horovod.common.basics import HorovodBasics
    hvd = HorovodBasics()
    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("rank one says no")
    time.sleep(60)
    return hvd.rank()


def test_rank_exception_names_rank_with_traceback(sc):
    start = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        horovod.spark.run(_raise_on_rank_1, num_proc=4, verbose=0, start_timeout=60)
    message = str(info.value)
    assert "Process name: 1\n" in message
    assert "Traceback" in message and "ValueError: rank one says no" in message and "_raise_on_rank_1" in message
    assert time.monotonic() - start < 40


def test_start_timeout_names_started_tasks_and_cancels(sc):
    start = time.monotonic()
    with pytest.raises(TimeoutException, match=r"Timed out waiting for Spark tasks to start\. Only 4 of 5 "):
        horovod.spark.run(_job_facts, num_proc=5, start_timeout=8, verbose=0)
    assert time.monotonic() - start < 30
    deadline = time.monotonic() + 30
    while sc.statusTracker().getActiveJobsIds():
        assert time.monotonic() < deadline, "the job group was not cancelled"
        time.sleep(0.5)
    # The slots are free again.
    _check_topology(horovod.spark.run(_job_facts, num_proc=4, verbose=0, start_timeout=60), 4)


def _allreduce_until_killed(marker_dir):
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics
    hvd = HorovodBasics()
    hvd.init()
    pathlib.Path(marker_dir, "rank-%d" % hvd.rank()).write_text(str(os.getpid()))
    deadline = time.monotonic() + 120
    i = 0
    while time.monotonic() < deadline:
        x = np.ones(1000)
        ops.wait(ops.allreduce_async([x], [x], ["forever.%d" % (i % 8)], HorovodBasics.Sum))
        time.sleep(0.01)
        i += 1
    return i


def test_killed_executor_ends_run(sc):
    marker_dir = BASE / "markers"
    marker_dir.mkdir(exist_ok=True)
    executors = sc.cluster.executors()
    assert len(executors) == WORKERS
    victim = executors[0]

    outcome = {}

    def go():
        try:
            outcome["results"] = horovod.spark.run(_allreduce_until_killed, args=(str(marker_dir),), num_proc=4,
                                                   verbose=0, start_timeout=60)
        except BaseException as e:
            outcome["error"] = e

    thread = threading.Thread(target=go)
    thread.start()
    deadline = time.monotonic() + 60
    while len(list(marker_dir.iterdir())) < 4:
        assert time.monotonic() < deadline and thread.is_alive(), outcome
        time.sleep(0.2)
    rank_pids = [int(p.read_text()) for p in marker_dir.iterdir()]
    killed_at = time.monotonic()
    victim.send_signal(signal.SIGKILL)
    thread.join(timeout=60)
    assert not thread.is_alive(), "run() hung after an executor was killed"
    assert time.monotonic() - killed_at < 45
    assert isinstance(outcome.get("error"), RuntimeError), outcome
    print("run() raised:", outcome["error"])
    # Every rank process is gone, the killed executor's ones included.
    _, left = psutil.wait_procs([psutil.Process(p) for p in rank_pids if psutil.pid_exists(p)], timeout=15)
    assert not left, "rank processes left: %s" % left


def test_conf_pairs_are_sparks_keys_and_defaults(sc):
    """Every pair of horovod.spark.conf names a key that Spark 4's JVM knows once translated by
    conf.current (Spark 4 no longer reads the spark.blacklist.* keys at all), and
    SPARK_CONF_DEFAULT_VALUES are those entries' defaults."""
    assert hvd_conf.SPARK_CONF_MAX_INT == str(2**31 - 1)
    assert hvd_conf.SPARK_CONF_MAX_INT_MINUS_ONE == str(2**31 - 2)
    assert sc.getConf().get("spark.task.maxFailures") == hvd_conf.SPARK_CONF_MAX_INT
    pairs = {name: value for name, value in vars(hvd_conf).items()
             if name.startswith("SPARK_CONF_") and isinstance(value, tuple)}
    assert len(pairs) == 17
    assert {key for key, _ in pairs.values()} == set(hvd_conf.SPARK_CONF_DEFAULT_VALUES)
    find_entry = sc._jvm.org.apache.spark.internal.config.ConfigEntry.findEntry
    for old, default in hvd_conf.SPARK_CONF_DEFAULT_VALUES.items():
        new = hvd_conf.EXCLUDE_ON_FAILURE_KEYS.get(old, old)
        entry = find_entry(new)
        assert entry is not None, new
        assert entry.defaultValueString() in (default, "<undefined>"), (new, entry.defaultValueString())
        if new != old:
            assert find_entry(old) is None, old
    assert hvd_conf.current(hvd_conf.SPARK_CONF_BLACKLIST_ENABLED) == ("spark.excludeOnFailure.enabled", "true")
    assert hvd_conf.current(hvd_conf.SPARK_CONF_ALWAYS_RESTART_FAILED_TASK) == ("spark.task.maxFailures",
                                                                                "2147483647")
    with pytest.raises(ValueError, match="expected a \\(key, value\\) pair"):
        hvd_conf.current("spark.blacklist.enabled")


# ---------------------------------------------------------------------------------------------
# run_elastic: a linear regression trained with committed steps; each step's gradient is the
# mean over one global batch, whatever the number of ranks, so the final weights equal numpy's
# replay of the same number of full-batch steps.

N_SAMPLES, BATCH, LR = 64, 16, 0.05


def _regression_data():
    rng = np.random.default_rng(1)
    X = np.hstack([rng.normal(size=(N_SAMPLES, 3)), np.ones((N_SAMPLES, 1))])
    y = X[:, :3] @ np.array([1.5, -2.0, 0.5]) + 0.1
    return X, y


def _replay(steps):
    X, y = _regression_data()
    w = np.zeros(4)
    for step in range(steps):
        batch = np.arange(step * BATCH, (step + 1) * BATCH) % N_SAMPLES
        w -= LR * (2 * (X[batch] @ w - y[batch]) @ X[batch]) / BATCH
    return w


def _bcast_object(obj):
    """``obj`` of rank 0 on every rank (pickled, its length then its bytes broadcast)."""
    import pickle

    from horovod.common import ops
    from horovod.common.basics import HorovodBasics
    root = HorovodBasics().rank() == 0
    data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8).copy() if root else np.zeros(0, np.uint8)
    n = np.array([data.size], dtype=np.int64)
    ops.wait(ops.broadcast_async([n], ["test.obj.len"], 0))
    if not root:
        data = np.zeros(int(n[0]), np.uint8)
    ops.wait(ops.broadcast_async([data], ["test.obj.data.%d" % data.size], 0))
    return pickle.loads(data.tobytes())


def _elastic_train(marker_dir, target_size, min_steps, max_steps, fail=None):
    """Trains until ``min_steps`` steps are committed and the world, after shrinking, is back
    at ``target_size`` (or ``max_steps``). ``fail``: ``(marker name, rank)``, that rank raises
    once (``"always"``: at every round)."""
    from horovod.common import elastic, ops
    from horovod.common.basics import HorovodBasics
    hvd = HorovodBasics()
    hvd.init()
    pathlib.Path(marker_dir, "pid-%d" % os.getpid()).write_text(os.environ["HOROVOD_HOSTNAME"])
    X, y = _regression_data()
    state = elastic.ObjectState(_bcast_object, hvd.rank, w=np.zeros(4), step=0, sizes=[])

    def recovered(sizes):
        return any(s < target_size for s in sizes) and sizes[-1] == target_size

    def train(state):
        while state.step < max_steps and not (state.step >= min_steps and recovered(state.sizes)):
            if fail is not None and hvd.rank() == fail[1] and state.step >= 5:
                marker = pathlib.Path(marker_dir, fail[0])
                if fail[0] == "always" or not marker.exists():
                    marker.write_text("raised")
                    raise ValueError("rank %d fails on purpose" % hvd.rank())
            batch = np.arange(state.step * BATCH, (state.step + 1) * BATCH) % N_SAMPLES
            mine = batch[hvd.rank()::hvd.size()]
            grad = 2 * (X[mine] @ state.w - y[mine]) @ X[mine]
            ops.wait(ops.allreduce_async([grad], [grad], ["test.grad"], HorovodBasics.Sum))
            state.w = state.w - LR * grad / BATCH
            state.step += 1
            if not state.sizes or state.sizes[-1] != hvd.size():
                state.sizes = state.sizes + [hvd.size()]
            time.sleep(0.05)
            state.commit()
        return {"rank": hvd.rank(), "size": hvd.size(), "w": state.w.tolist(), "step": state.step,
                "sizes": state.sizes}

    return elastic.run_fn(train, lambda: (hvd.shutdown(), hvd.init()))(state)


def _check_elastic(results, size):
    assert [r["rank"] for r in results] == list(range(size)), results
    assert all(r["size"] == size for r in results)
    ws = [r["w"] for r in results]
    assert all(w == ws[0] for w in ws), "the ranks' weights differ: %s" % ws
    steps = {r["step"] for r in results}
    assert len(steps) == 1
    np.testing.assert_allclose(ws[0], _replay(steps.pop()), rtol=1e-9, atol=1e-12)
    return results[0]["sizes"]


def _kill_executor(executor):
    """SIGKILL an executor's JVM and its Python workers, by PID."""
    victims = [executor] + [p for p in executor.children(recursive=True) if "pyspark" in " ".join(p.cmdline())]
    for proc in victims:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    return victims


def test_run_elastic_survives_killed_executor(sc):
    marker_dir = BASE / "elastic-markers"
    marker_dir.mkdir()
    executors = sc.cluster.executors()
    assert len(executors) == WORKERS
    outcome = {}
    out = io.StringIO()

    def go():
        try:
            outcome["results"] = horovod.spark.run_elastic(
                _elastic_train, args=(str(marker_dir), 4, 40, 1500), num_proc=4, min_num_proc=2,
                max_num_proc=4, start_timeout=60, elastic_timeout=120, verbose=2, stdout=out)
        except BaseException as e:
            outcome["error"] = e

    thread = threading.Thread(target=go)
    thread.start()
    deadline = time.monotonic() + 90
    while len(list(marker_dir.glob("pid-*"))) < 4:
        assert time.monotonic() < deadline and thread.is_alive(), outcome
        time.sleep(0.2)
    time.sleep(1)
    first_pids = [int(p.name[4:]) for p in marker_dir.glob("pid-*")]
    victims = _kill_executor(executors[0])
    thread.join(timeout=240)
    print(out.getvalue()[-3000:])  # the ranks' last lines, for a failure's report
    assert not thread.is_alive(), "run_elastic hung after an executor was killed"
    assert "results" in outcome, outcome.get("error")
    sizes = _check_elastic(outcome["results"], 4)
    # The job shrank (to the two ranks left, or three when Spark's new attempt of one lost task had
    # registered by then), then Spark's new attempts of the lost tasks joined it: with 4 task slots
    # in all, only they can hold ranks 2 and 3 at the end.
    assert sizes[0] == 4 and min(sizes) in (2, 3) and sizes[-1] == 4, sizes
    assert not _alive(victims)
    _, left = psutil.wait_procs([psutil.Process(p) for p in first_pids if psutil.pid_exists(p)], timeout=15)
    assert not left, "rank processes left: %s" % left


def test_run_elastic_rank_raising_once_is_replaced(sc):
    """A rank that raises ends its process with a failure: its Spark task raises, the elastic
    driver goes on with the other ranks, and Spark's new attempt of the task joins as a new host."""
    marker_dir = BASE / "elastic-raise-once"
    marker_dir.mkdir()
    results = horovod.spark.run_elastic(_elastic_train, args=(str(marker_dir), 4, 20, 4000, ("once", 1)),
                                        num_proc=4, min_num_proc=2, start_timeout=60, elastic_timeout=120,
                                        verbose=0)
    assert (marker_dir / "once").read_text() == "raised"
    sizes = _check_elastic(results, 4)
    assert sizes == [4, 3, 4], sizes


def test_run_elastic_reset_limit_names_first_failure(sc):
    marker_dir = BASE / "elastic-raise-always"
    marker_dir.mkdir()
    with pytest.raises(RuntimeError) as info:
        horovod.spark.run_elastic(_elastic_train, args=(str(marker_dir), 4, 20, 4000, ("always", 1)),
                                  num_proc=4, min_num_proc=2, reset_limit=1, start_timeout=60, elastic_timeout=120,
                                  verbose=0)
    message = str(info.value)
    assert "the number of elastic resets exceeded the --reset-limit of 1" in message
    assert "as rank 1, exit code 1" in message and "ValueError: rank 1 fails on purpose" in message, message


def test_run_elastic_bad_arguments(monkeypatch):
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    with pytest.raises(Exception, match="Could not find an active SparkContext"):
        horovod.spark.run_elastic(_elastic_train, num_proc=1)
    monkeypatch.setattr(SparkContext, "_active_spark_context", object())
    with pytest.raises(ValueError, match=r"expected min_num_proc <= num_proc <= max_num_proc, got 3, 2, 2"):
        horovod.spark.run_elastic(_elastic_train, num_proc=2, min_num_proc=3)
    with pytest.warns(DeprecationWarning, match="min_np is deprecated"):
        with pytest.raises(ValueError, match=r"got 1, 2, 1"):
            horovod.spark.run_elastic(_elastic_train, num_proc=2, min_np=1, max_num_proc=1)
    with pytest.raises(ValueError, match="env must be a mapping"):
        horovod.spark.run_elastic(_elastic_train, num_proc=2, env="A=1")
