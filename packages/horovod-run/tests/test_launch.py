"""horovodrun end to end: real launcher and worker processes on the local host."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from horovod_testing.processes import wait_gone

LAUNCH_TIMEOUT_S = 120

# Reports its environment, checks that the job secret appears in no process's command line,
# and exchanges a key with the next rank through the rendezvous server.
ENV_WORKER = textwrap.dedent("""
    import json, os, sys
    import psutil
    from horovod.common.rendezvous import RendezvousClient

    secret = os.environ["_HOROVOD_SECRET_KEY"]
    leaks = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if any(secret in arg for arg in (proc.info["cmdline"] or [])):
            leaks.append(proc.info["pid"])
    rank, size = int(os.environ["HOROVOD_RANK"]), int(os.environ["HOROVOD_SIZE"])
    client = RendezvousClient(os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"],
                              int(os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"]))
    client.set("test", str(rank), ("greetings from %d" % rank).encode())
    peer = client.get("test", str((rank + 1) % size), timeout_s=60).decode()
    env = {k: v for k, v in os.environ.items()
           if k.startswith(("HOROVOD_", "NCCL_")) or k == "PYTHONUNBUFFERED"}
    print("RESULT " + json.dumps({"env": env, "secret": secret, "leaks": leaks, "peer": peer,
                                  "argv": sys.argv}))
    print("to stderr from %d" % rank, file=sys.stderr)
""")

# Rank FAIL_RANK fails as told by argv[1] ('exit3' or 'kill') once every rank has started;
# the others report their pid and sleep.
FAILING_WORKER = textwrap.dedent("""
    import os, signal, sys, time
    rank = int(os.environ["HOROVOD_RANK"])
    print("PID %d" % os.getpid(), flush=True)
    if rank == int(sys.argv[2]):
        time.sleep(1.5)
        if sys.argv[1] == "exit3":
            sys.exit(3)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)
""")

SLEEPING_WORKER = textwrap.dedent("""
    import os, time
    print("PID %d" % os.getpid(), flush=True)
    time.sleep(600)
""")


def _horovodrun(args, **kwargs):
    # These tests are about the launcher-rendezvous path, which is the default only without MPI.
    if "--mpi" not in args:
        args = ["--gloo"] + args
    return subprocess.run([sys.executable, "-m", "horovod.runner.launch"] + args,
                          capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, **kwargs)


def _script(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _lines(output, rank, stream="stdout"):
    prefix = "[%d]<%s>:" % (rank, stream)
    return [line[len(prefix):] for line in output.splitlines() if line.startswith(prefix)]


def _results(output, num_proc):
    results = {}
    for rank in range(num_proc):
        payloads = [line[len("RESULT "):] for line in _lines(output, rank)
                    if line.startswith("RESULT ")]
        assert len(payloads) == 1, output
        results[rank] = json.loads(payloads[0])
    return results


def _pids(output, ranks):
    return {rank: int(_lines(output, rank)[0].split()[1]) for rank in ranks}


def _read_pids(proc, num_proc, timeout_s=60):
    """Read ``proc``'s stdout until ``num_proc`` ranks reported ``PID <n>``, EOF or the deadline.

    Returns ``{rank: pid}`` of the ranks seen; the caller asserts that it is complete.
    """
    pids = {}
    deadline = time.monotonic() + timeout_s
    while len(pids) < num_proc and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        match = re.match(r"\[(\d+)\]<stdout>:PID (\d+)", line)
        if match:
            pids[int(match.group(1))] = int(match.group(2))
    return pids


def test_two_workers_environment_output_and_rendezvous(tmp_path):
    worker = _script(tmp_path, "w.py", ENV_WORKER)
    run = _horovodrun(["-np", "2", sys.executable, worker])
    assert run.returncode == 0, run.stderr
    results = _results(run.stdout, 2)
    secrets = {r["secret"] for r in results.values()}
    assert len(secrets) == 1 and len(secrets.pop()) == 64  # 32 bytes, hex
    for rank, result in results.items():
        env = result["env"]
        assert env["HOROVOD_RANK"] == str(rank)
        assert env["HOROVOD_SIZE"] == "2"
        assert env["HOROVOD_LOCAL_RANK"] == str(rank)
        assert env["HOROVOD_LOCAL_SIZE"] == "2"
        assert env["HOROVOD_CROSS_RANK"] == "0"
        assert env["HOROVOD_CROSS_SIZE"] == "1"
        assert env["HOROVOD_HOSTNAME"] == "localhost"
        assert env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "127.0.0.1"
        assert int(env["HOROVOD_GLOO_RENDEZVOUS_PORT"]) > 0
        assert env["HOROVOD_CONTROLLER"] == "gloo"
        assert env["HOROVOD_CPU_OPERATIONS"] == "gloo"
        assert env["HOROVOD_GLOO_IFACE"] == "lo"
        assert env["PYTHONUNBUFFERED"] == "1"
        assert result["leaks"] == []
        assert result["peer"] == "greetings from %d" % ((rank + 1) % 2)
        assert _lines(run.stderr, rank, "stderr") == ["to stderr from %d" % rank]
    assert results[0]["secret"] not in run.stdout.replace(json.dumps(results[0]["secret"]), "")


def test_hosts_flag_and_tuning_flags_reach_workers(tmp_path):
    worker = _script(tmp_path, "w.py", ENV_WORKER)
    run = _horovodrun(["-np", "3", "-H", "localhost:3", "--fusion-threshold-mb", "2",
                       "--cycle-time-ms", "3.5", "--cache-capacity", "0",
                       "--gloo-timeout-seconds", "45", "--log-level", "DEBUG",
                       "--no-stall-check", "--start-timeout", "20",
                       sys.executable, worker, "--extra", "arg"])
    assert run.returncode == 0, run.stderr
    for rank, result in _results(run.stdout, 3).items():
        env = result["env"]
        assert env["HOROVOD_SIZE"] == "3" and env["HOROVOD_RANK"] == str(rank)
        assert env["HOROVOD_FUSION_THRESHOLD"] == str(2 * 1024 * 1024)
        assert env["HOROVOD_CYCLE_TIME"] == "3.5"
        assert env["HOROVOD_CACHE_CAPACITY"] == "0"
        assert env["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "45"
        assert env["HOROVOD_LOG_LEVEL"] == "DEBUG"
        assert env["HOROVOD_STALL_CHECK_DISABLE"] == "1"
        assert result["argv"][1:] == ["--extra", "arg"]


def test_hostfile(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    run = _horovodrun(["-np", "2", "--hostfile", str(hostfile), sys.executable, "-c",
                       "import os; print(os.environ['HOROVOD_LOCAL_SIZE'])"])
    assert run.returncode == 0, run.stderr
    assert _lines(run.stdout, 0) == ["2"] and _lines(run.stdout, 1) == ["2"]


def test_hostfile_names_that_do_not_resolve_are_refused(tmp_path):
    # As from an MPI Operator launcher whose worker is not running (or a shortened name).
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=1\nno-such-job-worker-1.no-such-job-worker.default.svc slots=1\n")
    marker = tmp_path / "ran"
    command = [sys.executable, "-c", "open(%r, 'w').close()" % str(marker)]
    for args, env, described in (
            (["-np", "2", "--hostfile", str(hostfile)], None, str(hostfile)),
            (["-np", "2"], dict(os.environ, OMPI_MCA_orte_default_hostfile=str(hostfile)),
             "%s (named by OMPI_MCA_orte_default_hostfile)" % hostfile)):
        run = _horovodrun(args + command, env=env)
        assert run.returncode != 0
        assert ("host name no-such-job-worker-1.no-such-job-worker.default.svc of the hostfile %s does not "
                "resolve from this host" % described) in run.stderr, run.stderr
        assert not marker.exists()


def test_exactly_np_workers_when_more_slots(tmp_path):
    run = _horovodrun(["-np", "1", "-H", "localhost:3", sys.executable, "-c",
                       "import os; print(os.environ['HOROVOD_SIZE'])"])
    assert run.returncode == 0, run.stderr
    assert _lines(run.stdout, 0) == ["1"]
    assert _lines(run.stdout, 1) == []


def test_single_string_runs_in_shell():
    run = _horovodrun(["-np", "1", "echo first && echo rank=$HOROVOD_RANK"])
    assert run.returncode == 0, run.stderr
    assert _lines(run.stdout, 0) == ["first", "rank=0"]


def test_worker_exit_code_fails_job_and_stops_others(tmp_path):
    worker = _script(tmp_path, "w.py", FAILING_WORKER)
    start = time.monotonic()
    run = _horovodrun(["-np", "2", sys.executable, worker, "exit3", "0"])
    assert time.monotonic() - start < 30
    assert run.returncode != 0
    assert "Process 0 exit with status code 3." in run.stdout
    assert "Terminating remaining workers after failure of Process 0." in run.stdout
    assert "one or more processes exited with non-zero status" in run.stderr
    assert "Process name: 0\nExit code: 3" in run.stderr
    assert wait_gone(_pids(run.stdout, [1])[1])


def test_killed_worker_reported_as_137(tmp_path):
    worker = _script(tmp_path, "w.py", FAILING_WORKER)
    run = _horovodrun(["-np", "2", sys.executable, worker, "kill", "1"])
    assert run.returncode != 0
    assert "Process 1 exit with status code 137." in run.stdout
    assert "Process name: 1\nExit code: 137" in run.stderr
    assert wait_gone(_pids(run.stdout, [0])[0])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_horovodrun_stops_workers(tmp_path, sig):
    worker = _script(tmp_path, "w.py", SLEEPING_WORKER)
    proc = subprocess.Popen([sys.executable, "-m", "horovod.runner.launch", "--gloo", "-np", "2",
                             sys.executable, worker], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        pids = _read_pids(proc, 2)
        assert len(pids) == 2
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert "horovodrun: error" in err
    for pid in pids.values():
        assert wait_gone(pid)


def test_output_filename_writes_raw_rank_files(tmp_path):
    out_dir = tmp_path / "logs"
    run = _horovodrun(["-np", "2", "--output-filename", str(out_dir), sys.executable, "-c",
                       "import os, sys; r = os.environ['HOROVOD_RANK']; print('out', r); "
                       "print('err', r, file=sys.stderr)"])
    assert run.returncode == 0, run.stderr
    for rank in range(2):
        assert (out_dir / ("rank.%d" % rank) / "stdout").read_text() == "out %d\n" % rank
        assert (out_dir / ("rank.%d" % rank) / "stderr").read_text() == "err %d\n" % rank
    assert _lines(run.stdout, 1) == ["out 1"]


def test_prefix_output_with_timestamp():
    run = _horovodrun(["-np", "1", "--prefix-output-with-timestamp", sys.executable, "-c",
                       "print('stamped')"])
    assert run.returncode == 0, run.stderr
    assert re.search(r"^\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\[0\]<stdout>:stamped$",
                     run.stdout, re.M), run.stdout


def test_verbose_lines_hide_the_secret(tmp_path):
    worker = _script(tmp_path, "w.py", ENV_WORKER)
    run = _horovodrun(["-np", "2", "--verbose", sys.executable, worker])
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    for expected in ["Filtering local host names.", "Remote host found: ",
                     "All hosts are local, finding the interfaces with address 127.0.0.1",
                     "Local interface found lo"]:
        assert expected in lines
    assert any("HOROVOD_RANK=1" in line and worker in line for line in lines)
    secret = _results(run.stdout, 2)[0]["secret"]
    launcher_lines = [line for line in lines if not line.startswith("[")]
    assert not any(secret in line for line in launcher_lines)


def test_unresolvable_remote_host_is_named():
    run = _horovodrun(["-np", "2", "--disable-cache", "-H", "localhost:1,remote-host.invalid:1",
                       "true"])
    assert run.returncode == 1
    assert "could not connect to remote-host.invalid via ssh" in run.stderr, run.stderr
    assert "ssh not successful for host remote-host.invalid" in run.stdout, run.stdout


def test_elastic_with_one_fixed_host_is_refused_clearly():
    run = _horovodrun(["-np", "2", "--min-np", "1", "true"])
    assert run.returncode == 1
    assert "fewer than 2 hosts" in run.stderr and "--host-discovery-script" in run.stderr


def test_missing_program_fails_job():
    run = _horovodrun(["-np", "1", "/nonexistent/program", "arg"])
    assert run.returncode == 1
    assert "Process 0 could not be started" in run.stderr
    assert "Exit code: 1" in run.stderr
    # A single argument runs in the shell, which reports the missing program itself.
    run = _horovodrun(["-np", "1", "/nonexistent/program"])
    assert run.returncode == 1
    assert "Exit code: 127" in run.stderr


def test_closed_stdout_does_not_block_workers(tmp_path):
    worker = _script(tmp_path, "w.py", "for i in range(100000):\n    print('line', i)\n")
    proc = subprocess.Popen([sys.executable, "-m", "horovod.runner.launch", "--gloo", "-np", "2",
                             sys.executable, worker], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    proc.stdout.close()
    try:
        assert proc.wait(timeout=LAUNCH_TIMEOUT_S) is not None
    finally:
        if proc.poll() is None:
            proc.kill()


def test_workers_stopped_when_horovodrun_is_killed(tmp_path):
    worker = _script(tmp_path, "w.py", SLEEPING_WORKER)
    proc = subprocess.Popen([sys.executable, "-m", "horovod.runner.launch", "--gloo", "-np", "2",
                             sys.executable, worker], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        pids = _read_pids(proc, 2)
        assert len(pids) == 2
        proc.kill()
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for pid in pids.values():
        assert wait_gone(pid, timeout_s=15)


def test_gloo_run_in_process_with_minimal_settings(capfd):
    from horovod.runner.common.util.settings import Settings
    from horovod.runner.gloo_run import gloo_run

    settings = Settings(verbose=0, num_proc=2, hosts="localhost:2", run_func_mode=True)
    gloo_run(settings, ["lo"], {}, "127.0.0.1",
             [sys.executable, "-c", "import os; print(len(os.environ['_HOROVOD_SECRET_KEY']))"])
    out = capfd.readouterr().out
    assert "[0]<stdout>:64" in out and "[1]<stdout>:64" in out


# horovod.runner.launch._run (compat_internals.md §2), as tooling calls it, with the parsed
# arguments' ``nics`` replaced by argv[1]: "none" or "empty" (an empty list).
RUN_WITH_NICS = textwrap.dedent("""
    import sys
    from horovod.runner import launch

    args = launch.parse_args(["--gloo", "--disable-cache", "-np", "2", "-H", "localhost:2",
                              sys.executable, sys.argv[2]])
    args.nics = {"none": None, "empty": []}[sys.argv[1]]
    launch._run(args)
""")


@pytest.mark.parametrize("nics", ["none", "empty"])
def test_run_with_no_interface_restriction(tmp_path, nics):
    # An empty collection of interfaces restricts nothing, as None does (upstream reads it so).
    worker = _script(tmp_path, "w.py", ENV_WORKER)
    run = subprocess.run([sys.executable, _script(tmp_path, "run.py", RUN_WITH_NICS), nics, worker],
                         capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    assert run.returncode == 0, run.stdout + run.stderr
    results = _results(run.stdout, 2)
    for rank, result in results.items():
        assert result["env"]["HOROVOD_GLOO_IFACE"] == "lo"
        assert result["peer"] == "greetings from %d" % ((rank + 1) % 2)
