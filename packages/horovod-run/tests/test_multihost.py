"""horovodrun across real hosts: network namespaces of the test bed (ci/testbed.sh), each with its
own hostname and sshd, reached over real ssh (spec runner.md §4, §5.1, §5.3, §5.4, §7).

The launcher runs in the root namespace (198.18.0.254 on the bridge ``hvdbr0``); the hosts are
198.18.0.1, 198.18.0.2, 198.18.0.3, each with its NIC named ``hvdbr0`` too. After every test,
conftest checks that no process of the job is left on any host.
"""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / "docs" / "examples"
LAUNCH_TIMEOUT_S = 240
# Seconds within which every worker must be gone once its launcher was killed.
CLEANUP_S = 15

# Reports where it runs, checks the job secret is on no process's command line (the test bed's
# hosts share one PID namespace, so /proc shows every host's processes), and runs collectives.
TOPOLOGY_WORKER = textwrap.dedent("""
    import json, os, socket
    import numpy as np
    from horovod.common import _core, ops
    from horovod.common.basics import HorovodBasics

    # mpirun's workers get no secret in command mode (they need none).
    secret = os.environ.get("_HOROVOD_SECRET_KEY")
    leaks = []
    for pid in os.listdir("/proc") if secret else []:
        if pid.isdigit():
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    if secret.encode() in f.read():
                        leaks.append(int(pid))
            except OSError:
                pass
    hvd = HorovodBasics()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    x = np.arange(1000, dtype=np.float64) * (rank + 1)
    ops.wait(ops.allreduce_async([x], [x], ["x"], hvd.Sum))
    ok = bool(np.array_equal(x, np.arange(1000, dtype=np.float64) * (size * (size + 1) // 2)))
    print("RESULT " + json.dumps({
        "rank": rank, "size": size, "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
        "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(),
        "hostname": socket.gethostname(), "horovod_hostname": os.environ.get("HOROVOD_HOSTNAME"),
        "ssh_connection": os.environ.get("SSH_CONNECTION"), "cwd": os.getcwd(),
        "iface": os.environ.get("HOROVOD_GLOO_IFACE"), "leaks": leaks, "allreduce_ok": ok,
        "controller": os.environ.get("HOROVOD_CONTROLLER"),
        "stats": dict(_core.engine_stats())}), flush=True)
    hvd.shutdown()
""")

# Every collective across the hosts against numpy (horovod_testing's shared suite), then a loop of
# small synchronous allreduces of one name, as a training loop's loss (eager allreduces over Gloo).
COLLECTIVES_WORKER = textwrap.dedent("""
    import json
    import numpy as np
    from horovod.common import _core, ops
    from horovod.common.basics import HorovodBasics
    from horovod_testing.collectives import NumpyAdapter, run_collective_suite

    counts = run_collective_suite(NumpyAdapter)
    hvd = HorovodBasics()
    rank, size = hvd.rank(), hvd.size()
    before = _core.engine_stats()["eager_allreduces"]
    for step in range(20):
        loss = np.array([rank + step * 0.5, -rank], np.float32)
        ops.wait(ops.allreduce_async([loss], [loss], ["loss"], hvd.Average))
        expected = np.array([sum(r + step * 0.5 for r in range(size)), -sum(range(size))], np.float32) / size
        np.testing.assert_allclose(loss, expected, rtol=1e-6)
    stats = dict(_core.engine_stats())
    stats["loop_eager_allreduces"] = stats["eager_allreduces"] - before
    print("RESULT " + json.dumps({"counts": counts, "stats": stats}), flush=True)
""")

# Trains in a loop of allreduces until killed; prints its pid first.
LOOPING_WORKER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics

    hvd = HorovodBasics()
    hvd.init()
    print("PID %d %d" % (hvd.rank(), os.getpid()), flush=True)
    step = 0
    while True:
        x = np.ones(1000)
        ops.wait(ops.allreduce_async([x], [x], ["step%d" % step], hvd.Sum))
        step += 1
        time.sleep(0.01)
""")


# Correct steps, then rank 0 allreduces a tensor the others skip: a deadlock on every rank.
DIVERGING_WORKER = textwrap.dedent("""
    import numpy as np
    from horovod.common import ops
    from horovod.common.basics import HorovodBasics

    hvd = HorovodBasics()
    hvd.init()

    def allreduce(name):
        x = np.ones(4, np.float32)
        ops.wait(ops.allreduce_async([x], [x], [name], hvd.Sum))

    for step in range(3):
        allreduce("allreduce.step%d" % step)
    if hvd.rank() == 0:
        allreduce("allreduce.extra")
    allreduce("allreduce.loss")
""")


def _results(stdout):
    results = {}
    for line in stdout.splitlines():
        match = re.match(r"\[(\d+)\]<stdout>:RESULT (.*)$", line)
        if match:
            results[int(match.group(1))] = json.loads(match.group(2))
    return results


def _horovodrun(testbed, args, agent=True, timeout=LAUNCH_TIMEOUT_S, **kwargs):
    return subprocess.run([sys.executable, "-m", "horovod.runner.launch"] + args,
                          capture_output=True, text=True, timeout=timeout,
                          env=testbed.env(agent=agent), **kwargs)


@pytest.fixture
def bed(testbed):
    """The test bed; conftest checks after each test that no process is left on its hosts."""
    return testbed


def _addr(testbed, index):
    return testbed.hosts[index - 1][1]


def _name(testbed, index):
    return testbed.hosts[index - 1][0]


def _two_by_two(bed):
    return "%s:2,%s:2" % (_addr(bed, 1), _addr(bed, 2))


def _check_topology(bed, results, ssh_port=22, controller="gloo", launched_on_host_1=None):
    """Ranks 0 and 1 on host 1, ranks 2 and 3 on host 2, each in the session of its host's sshd
    on ``ssh_port``. With ``launched_on_host_1`` (the two hosts as the job named them), the
    launcher ran on host 1 and started its ranks there itself, without ssh."""
    assert sorted(results) == [0, 1, 2, 3], results
    for rank, r in results.items():
        host = 1 + rank // 2
        assert r["size"] == 4 and r["allreduce_ok"], r
        assert r["hostname"] == _name(bed, host), r
        assert (r["local_rank"], r["local_size"]) == (rank % 2, 2), r
        assert (r["cross_rank"], r["cross_size"]) == (rank // 2, 2), r
        assert r["leaks"] == [], "the job secret is on the command line of %s" % r["leaks"]
        assert r["cwd"] == os.getcwd()
        assert r["controller"] == controller
        if launched_on_host_1 and host == 1:
            assert r["ssh_connection"] is None, r
        else:
            server_ip, server_port = r["ssh_connection"].split()[2:4]
            assert (server_ip, int(server_port)) == (_addr(bed, host), ssh_port), r
        if controller == "gloo":
            named = launched_on_host_1[host - 1] if launched_on_host_1 else _addr(bed, host)
            assert r["horovod_hostname"] == named, r
            assert r["iface"] == bed.interface
            assert r["stats"]["hosts"] == 2, r["stats"]


@pytest.fixture
def topology_worker(tmp_path):
    path = tmp_path / "topology.py"
    path.write_text(TOPOLOGY_WORKER)
    return str(path)


def test_two_hosts_two_slots_topology_and_no_secret_on_command_lines(bed, topology_worker):
    run = _horovodrun(bed, ["--gloo", "--verbose", "--disable-cache", "-np", "4", "-H",
                            _two_by_two(bed), sys.executable, topology_worker])
    assert run.returncode == 0, run.stdout + run.stderr
    _check_topology(bed, _results(run.stdout))
    # The verbose lines of spec §5.1, in order.
    lines = run.stdout.splitlines()
    expected = ["Filtering local host names.",
                "Remote host found: %s %s" % (_addr(bed, 1), _addr(bed, 2)),
                "Checking ssh on all remote hosts.",
                "SSH was successful into all the remote hosts.",
                "Testing interfaces on all the hosts.",
                "Launched horovod server.",
                "Attempted to launch horovod task servers.",
                "Waiting for the hosts to acknowledge.",
                "Notified all the hosts that the registration is complete.",
                "Waiting for hosts to perform host-to-host interface checking.",
                "Host-to-host interface checking successful.",
                "Interfaces on all the hosts were successfully checked.",
                "Common interface found: %s" % bed.interface]
    positions = [lines.index(line) for line in expected]
    assert positions == sorted(positions), run.stdout


@pytest.mark.parametrize("given", ["flag", "operator-variable"])
def test_hostfile(bed, topology_worker, tmp_path, given):
    hostfile = tmp_path / "hosts.txt"
    if given == "flag":
        hostfile.write_text("%s slots=2\n%s slots=2\n" % (_addr(bed, 1), _addr(bed, 2)))
        run = _horovodrun(bed, ["--gloo", "--disable-cache", "-np", "4", "--hostfile", str(hostfile),
                                sys.executable, topology_worker])
    else:
        # No -H nor --hostfile: Open MPI's default hostfile, as the Kubeflow MPI Operator sets it
        # in its launcher (both of the forms it writes).
        hostfile.write_text("%s slots=2\n%s:2\n" % (_addr(bed, 1), _addr(bed, 2)))
        env = dict(bed.env(), OMPI_MCA_orte_default_hostfile=str(hostfile))
        run = subprocess.run([sys.executable, "-m", "horovod.runner.launch", "--gloo", "--disable-cache", "--verbose",
                              "-np", "4", sys.executable, topology_worker],
                             capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, env=env)
        assert ("Hosts from the hostfile %s, named by OMPI_MCA_orte_default_hostfile: %s:2,%s:2"
                % (hostfile, _addr(bed, 1), _addr(bed, 2))) in run.stdout, run.stdout + run.stderr
    assert run.returncode == 0, run.stdout + run.stderr
    _check_topology(bed, _results(run.stdout))


def test_network_interface_flag(bed, topology_worker):
    run = _horovodrun(bed, ["--gloo", "--disable-cache", "--network-interface", bed.interface,
                            "-np", "4", "-H", _two_by_two(bed), sys.executable, topology_worker])
    assert run.returncode == 0, run.stdout + run.stderr
    _check_topology(bed, _results(run.stdout))


def test_wrong_network_interface_names_it_and_the_host(bed, topology_worker):
    run = _horovodrun(bed, ["--gloo", "--disable-cache", "--network-interface", "hvdnone0",
                            "-np", "2", "-H", "%s:1,%s:1" % (_addr(bed, 1), _addr(bed, 2)),
                            sys.executable, topology_worker], timeout=60)
    assert run.returncode != 0
    assert "hvdnone0" in run.stderr and "launcher" in run.stderr, run.stderr


def test_ssh_port_flag(bed, topology_worker):
    run = _horovodrun(bed, ["--gloo", "--disable-cache", "-p", "2222", "-np", "4", "-H",
                            _two_by_two(bed), sys.executable, topology_worker])
    assert run.returncode == 0, run.stdout + run.stderr
    _check_topology(bed, _results(run.stdout), ssh_port=2222)


def test_identity_file_flag_without_agent(bed, topology_worker):
    run = _horovodrun(bed, ["--gloo", "--disable-cache", "-i", bed.key_path, "-np", "4", "-H",
                            _two_by_two(bed), sys.executable, topology_worker], agent=False)
    assert run.returncode == 0, run.stdout + run.stderr
    _check_topology(bed, _results(run.stdout))


def test_mpi_across_hosts(bed, topology_worker):
    run = _horovodrun(bed, ["--mpi", "--verbose", "--disable-cache", "-np", "4", "-H",
                            _two_by_two(bed), sys.executable, topology_worker])
    assert run.returncode == 0, run.stdout + run.stderr
    # mpirun is given the interface the probe found.
    assert "-mca btl_tcp_if_include %s " % bed.interface in run.stdout, run.stdout
    results = _results(re.sub(r"^\[1,(\d+)\]", r"[\1]", run.stdout, flags=re.M))
    _check_topology(bed, results, controller="mpi")


@pytest.mark.parametrize("controller", ["--gloo", "--mpi"])
def test_digits_example_trains_across_two_hosts(bed, tmp_path, controller):
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    run = _horovodrun(bed, [controller, "--disable-cache", "-np", "4", "-H", _two_by_two(bed),
                            sys.executable, str(EXAMPLES / "pytorch" / "pytorch_digits.py"),
                            "--checkpoint", str(tmp_path / "digits.pt")])
    assert run.returncode == 0, run.stdout + run.stderr
    prefix = "[1,0]<stdout>:" if controller == "--mpi" else "[0]<stdout>:"
    rank0 = [line[len(prefix):] for line in run.stdout.splitlines() if line.startswith(prefix)]
    assert any("parameters identical on all 4 ranks" in line for line in rank0), run.stdout
    accuracy = float(re.fullmatch(r"test accuracy: (\d\.\d+)", rank0[-1]).group(1))
    assert accuracy >= 0.95, run.stdout


@pytest.mark.parametrize("layout,hierarchical", [
    ((1, 1), False), ((2, 2), False), ((2, 2), True), ((1, 1, 1), False), ((1, 1, 1), True)])
def test_every_collective_across_hosts(bed, tmp_path, layout, hierarchical):
    worker = tmp_path / "collectives.py"
    worker.write_text(COLLECTIVES_WORKER)
    hosts = ",".join("%s:%d" % (_addr(bed, i + 1), slots) for i, slots in enumerate(layout))
    args = ["--gloo", "--disable-cache", "-np", str(sum(layout)), "-H", hosts]
    if hierarchical:
        args += ["--hierarchical-allreduce", "--hierarchical-allgather"]
    run = _horovodrun(bed, args + [sys.executable, str(worker)])
    assert run.returncode == 0, run.stdout + run.stderr
    results = _results(run.stdout)
    assert sorted(results) == list(range(sum(layout))), run.stdout
    for r in results.values():
        counts, stats = r["counts"], r["stats"]
        # Every check of the suite ran (each raises on a result that differs from numpy's).
        assert counts["check_allreduce"] >= 700 and counts["check_alltoall"] == 48, counts
        assert counts["check_broadcast"] == 60 * sum(layout), counts
        assert stats["hosts"] == len(layout), stats
        # Gloo's messages between the two ranks of a host go through shared memory.
        assert stats["local_channels"] == layout[0] - 1, stats
        homogeneous = len(set(layout)) == 1
        assert bool(stats["hierarchical"]) == (hierarchical and homogeneous), stats
        if hierarchical:
            assert stats["hierarchical_allreduces"] > 0 and stats["hierarchical_allgathers"] > 0
        # The loss loop's allreduces (each checked against numpy in the worker, which fails the
        # job on a mismatch) ride the cache round across the hosts on the flat path (all but its
        # first, which the coordinator negotiates); the hierarchical path reduces by its own steps,
        # and its round carries no data.
        if stats["hierarchical"]:
            assert stats["eager_allreduces"] == 0, stats
        else:
            assert stats["loop_eager_allreduces"] >= 10, stats


def _start_looping_job(bed, tmp_path, extra=()):
    worker = tmp_path / "loop.py"
    worker.write_text(LOOPING_WORKER)
    proc = subprocess.Popen([sys.executable, "-m", "horovod.runner.launch", "--gloo",
                             "--disable-cache", *extra, "-np", "4", "-H", _two_by_two(bed),
                             sys.executable, str(worker)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # A killed launcher cannot remove what the workers write when they
                            # lose their peers: their flight recorder goes under tmp_path.
                            env=dict(bed.env(), HOROVOD_FLIGHT_RECORDER_DIR=str(tmp_path / "flight")))
    pids = {}
    deadline = time.monotonic() + 120
    while len(pids) < 4 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        match = re.match(r"\[\d+\]<stdout>:PID (\d+) (\d+)", line)
        if match:
            pids[int(match.group(1))] = int(match.group(2))
    assert len(pids) == 4, "the workers did not start: %s" % pids
    return proc, pids


def test_remote_worker_killed_stops_the_job(bed, tmp_path):
    proc, pids = _start_looping_job(bed, tmp_path)
    time.sleep(1)
    os.kill(pids[3], signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "Process name: 3\nExit code: 137 (SIGKILL)\nHost: %s" % _addr(bed, 2) in err, out + err
    for pid in pids.values():
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"


def test_launcher_sigkill_stops_remote_workers(bed, tmp_path):
    proc, pids = _start_looping_job(bed, tmp_path)
    time.sleep(1)
    proc.kill()
    proc.communicate(timeout=30)
    deadline = time.monotonic() + CLEANUP_S
    alive = list(pids.values())
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
        time.sleep(0.2)
    assert not alive, "workers survived their launcher: %s" % alive


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_launcher_sigterm_or_ctrl_c_stops_remote_workers(bed, tmp_path, signum):
    proc, pids = _start_looping_job(bed, tmp_path)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    for pid in pids.values():
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"


def test_unreachable_host_is_named(bed, topology_worker):
    missing = "198.18.0.99"
    run = _horovodrun(bed, ["--gloo", "--disable-cache", "-np", "2", "-H",
                            "%s:1,%s:1" % (_addr(bed, 1), missing), sys.executable,
                            topology_worker], timeout=120)
    assert run.returncode != 0
    assert "ssh not successful for host %s" % missing in run.stdout, run.stdout + run.stderr
    assert _addr(bed, 1) + ":" not in run.stdout
    assert "could not connect to some hosts via ssh" in run.stderr


def test_refused_key_is_named(bed, topology_worker):
    run = _horovodrun(bed, ["--gloo", "--disable-cache", "-i", bed.unauthorized_key_path,
                            "-np", "2", "-H", "%s:1,%s:1" % (_addr(bed, 1), _addr(bed, 2)),
                            sys.executable, topology_worker], agent=False, timeout=120)
    assert run.returncode != 0
    for index in (1, 2):
        assert "ssh not successful for host %s" % _addr(bed, index) in run.stdout, run.stdout
    assert "Permission denied" in run.stdout


def test_host_that_never_starts_its_worker_is_named(bed, topology_worker, tmp_path):
    """The ssh check and the interface probe come from the cache of a first run; then host 2's
    sshd is stopped (SIGSTOP: connections are accepted by the kernel, never answered), so its
    workers never start, and --start-timeout ends the job naming the host."""
    env = dict(bed.env(), HOME=str(tmp_path))  # the cache lives in ~/.horovod
    hosts = "%s:1,%s:1" % (_addr(bed, 1), _addr(bed, 2))
    args = [sys.executable, "-m", "horovod.runner.launch", "--gloo", "--start-timeout", "5",
            "-np", "2", "-H", hosts, sys.executable, topology_worker]
    first = subprocess.run(args, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert (tmp_path / ".horovod" / "cache.json").is_file()
    sshd = bed.sshd_pid(2)
    os.kill(sshd, signal.SIGSTOP)
    try:
        started = time.monotonic()
        run = subprocess.run(args, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S,
                             env=env)
        elapsed = time.monotonic() - started
    finally:
        os.kill(sshd, signal.SIGCONT)
    assert run.returncode != 0
    assert "rank(s) 1 on host %s did not start within the start timeout of 5 seconds" % (
        _addr(bed, 2)) in run.stderr, run.stdout + run.stderr
    # The failed job's flight recorder files are gathered over ssh: host 2 does not answer, and it
    # is asked once (one connection timeout), not again to remove the directory.
    assert run.stderr.count("could not reach %s for its flight recorder files" % _addr(bed, 2)) == 1, run.stderr
    assert elapsed < 60, elapsed


def test_interface_missing_on_a_host_is_named(bed, topology_worker):
    """--network-interface names an interface the launcher has (one end of a veth pair made for
    the test, addressed in 198.18.0.0/15) but the hosts do not: the probe fails naming the host
    and the interface."""
    name = "hvdtest0"
    subprocess.run(["ip", "link", "add", name, "type", "veth", "peer", "name", "hvdtest1"],
                   check=True)
    try:
        subprocess.run(["ip", "addr", "add", "198.19.255.1/32", "dev", name], check=True)
        subprocess.run(["ip", "link", "set", name, "up"], check=True)
        run = _horovodrun(bed, ["--gloo", "--disable-cache", "--network-interface", name,
                                "-np", "2", "-H", "%s:1,%s:1" % (_addr(bed, 1), _addr(bed, 2)),
                                sys.executable, topology_worker], timeout=120)
    finally:
        subprocess.run(["ip", "link", "del", name], check=True)
    assert run.returncode != 0
    # Both hosts lack it; whichever's probe ends first is named, with its own host name.
    assert any(re.search(r"the network interface probe failed on host %s: .*\n.*host %s has no "
                         r"network interface 'hvdtest0'" % (re.escape(_addr(bed, index)),
                                                            re.escape(_name(bed, index))),
                         run.stderr) for index in (1, 2)), run.stderr


def test_failed_job_gathers_the_flight_recorder_and_names_the_divergence(bed, tmp_path):
    worker = tmp_path / "diverge.py"
    worker.write_text(DIVERGING_WORKER)
    temporary = set(pathlib.Path("/tmp").glob("horovod-flight-recorder-*"))
    run = _horovodrun(bed, ["--gloo", "--disable-cache", "--deadlock-timeout-seconds", "1", "-np", "2",
                            "-H", "%s:1,%s:1" % (_addr(bed, 1), _addr(bed, 2)), sys.executable, str(worker)])
    assert run.returncode != 0, run.stdout + run.stderr
    err = run.stderr
    assert "its flight recorder says:" in err, err
    assert "Process set 0 (ranks 0, 1): the ranks diverged at operation #3:" in err, err
    assert "rank 0 (host %s): allreduce.extra (ALLREDUCE, float32 [4], failed)" % _name(bed, 1) in err, err
    assert "rank 1 (host %s): allreduce.loss (ALLREDUCE, float32 [4], failed)" % _name(bed, 2) in err, err
    assert "allreduce.extra was never submitted by rank 1" in err, err
    assert "Errors recorded: Deadlock" in err, err
    # The launcher's temporary directory is gone (the hosts share this file system).
    assert set(pathlib.Path("/tmp").glob("horovod-flight-recorder-*")) == temporary


def _on_host_1(bed, argv, timeout=LAUNCH_TIMEOUT_S):
    """``argv`` run inside host 1 (its network, hostname and /etc/hosts), as a user logged into
    it would: the bed's ssh (and key agent) reach the other hosts from there."""
    env = bed.env()
    env.pop("SSH_CONNECTION", None)  # the workers' own tells how they were started
    return bed.exec(1, argv, capture_output=True, text=True, timeout=timeout, env=env,
                    stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
@pytest.mark.parametrize("naming", ["localhost", "hostname", "hostfile-address"])
def test_launch_from_one_of_the_hosts(bed, topology_worker, tmp_path, naming, controller):
    # The usual way to start a job: log into the first server and name it as localhost, by its
    # own hostname, or by its address in a hostfile, beside the other servers.
    first = {"localhost": "localhost", "hostname": _name(bed, 1),
             "hostfile-address": _addr(bed, 1)}[naming]
    if naming == "hostfile-address":
        hostfile = tmp_path / "hosts.txt"
        hostfile.write_text("%s slots=2\n%s slots=2\n" % (first, _addr(bed, 2)))
        where = ["--hostfile", str(hostfile)]
    else:
        where = ["-H", "%s:2,%s:2" % (first, _addr(bed, 2))]
    run = _on_host_1(bed, [sys.executable, "-m", "horovod.runner.launch", "--" + controller,
                           "--verbose", "--disable-cache", "-np", "4", *where, sys.executable,
                           topology_worker])
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Remote host found: %s" % _addr(bed, 2) in run.stdout.splitlines(), run.stdout
    assert "Common interface found: %s" % bed.interface in run.stdout.splitlines(), run.stdout
    if controller == "mpi":
        assert "-mca btl_tcp_if_include %s " % bed.interface in run.stdout, run.stdout
        results = _results(re.sub(r"^\[1,(\d+)\]", r"[\1]", run.stdout, flags=re.M))
    else:
        results = _results(run.stdout)
    _check_topology(bed, results, controller=controller,
                    launched_on_host_1=[first, _addr(bed, 2)])


# horovod.runner.launch._run (compat_internals.md §2) with 127.0.0.1's twin, host 1's own address,
# treated as a remote host, as upstream's launcher tests patch it: the same machine is then reached
# locally (localhost) and over ssh (its address). argv[1]: "none" or "empty" for args.nics.
TWO_NAMES_RUN = textwrap.dedent("""
    import sys
    from unittest import mock
    from horovod.runner import launch
    from horovod.runner.util import network

    address, nics, worker = sys.argv[1], sys.argv[2], sys.argv[3]
    args = launch.parse_args(["--gloo", "--verbose", "--disable-cache", "-np", "4", "-H",
                              "localhost:2,%s:2" % address, sys.executable, worker])
    args.nics = {"none": None, "empty": []}[nics]
    with mock.patch.object(network, "filter_local_addresses",
                           lambda names: [n for n in names if n != "localhost"]):
        launch._run(args)
""")


@pytest.mark.parametrize("nics", ["none", "empty"])
def test_one_machine_under_two_names(bed, topology_worker, tmp_path, nics):
    script = tmp_path / "two_names.py"
    script.write_text(TWO_NAMES_RUN)
    run = _on_host_1(bed, [sys.executable, str(script), _addr(bed, 1), nics, topology_worker])
    assert run.returncode == 0, run.stdout + run.stderr
    # Both interfaces connect the machine to itself; loopback is the last choice.
    assert "Common interface found: %s lo" % bed.interface in run.stdout.splitlines(), run.stdout
    results = _results(run.stdout)
    assert sorted(results) == [0, 1, 2, 3], run.stdout
    for rank, r in results.items():
        assert r["hostname"] == _name(bed, 1) and r["allreduce_ok"], r
        assert (r["local_rank"], r["cross_rank"], r["cross_size"]) == (rank % 2, rank // 2, 2), r
        # Ranks 2 and 3 went through host 1's sshd, ranks 0 and 1 were started directly.
        if rank < 2:
            assert r["ssh_connection"] is None, r
        else:
            assert r["ssh_connection"].split()[2] == _addr(bed, 1), r
