"""The multi-host test bed itself (ci/testbed.sh through horovod_testing.testbed): real ssh between
the launcher's namespace and hosts hvd-h1..hvd-h3, each a network namespace with its own sshd."""

import os
import shutil
import subprocess
import time

import pytest

from horovod_testing.testbed import TestbedUnavailable, find_script

TIMEOUT_S = 60
# Prints what a test wants to know of the far end: its hostname, then the 4 fields of
# SSH_CONNECTION (client address, client port, server address, server port).
WHO = 'echo "$(hostname) $SSH_CONNECTION"'


def who(stdout):
    hostname, client, _client_port, server, server_port = stdout.split()
    return hostname, client, server, int(server_port)


def test_ssh_from_launcher_to_every_host_on_both_ports(testbed):
    env = testbed.env()
    # The bare name `ssh`, as the launcher and mpirun call it, is the bed's wrapper.
    assert shutil.which("ssh", path=env["PATH"]) == os.path.join(testbed.bin_dir, "ssh")
    assert [name for name, _ in testbed.hosts] == ["hvd-h1", "hvd-h2", "hvd-h3"]
    for name, address in testbed.hosts:
        for port in (22, 2222):
            proc = subprocess.run(["ssh", "-p", str(port), address, WHO], env=env, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=TIMEOUT_S)
            assert proc.returncode == 0, proc.stderr
            assert who(proc.stdout) == (name, testbed.launcher_address, address, port)


def test_ssh_between_hosts(testbed):
    for src, dst, port in ((1, 2, 22), (3, 1, 2222)):
        _, src_address = testbed.host(src)
        dst_name, dst_address = testbed.host(dst)
        proc = testbed.exec(src, ["ssh", "-p", str(port), dst_address, WHO], env=testbed.env(),
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT_S)
        assert proc.returncode == 0, proc.stderr
        assert who(proc.stdout) == (dst_name, src_address, dst_address, port)
    # The hosts know each other's names (not the launcher: it has only addresses).
    proc = testbed.exec(2, ["ssh", "hvd-h3", "hostname"], env=testbed.env(), stdin=subprocess.DEVNULL,
                        capture_output=True, text=True, timeout=TIMEOUT_S)
    assert (proc.returncode, proc.stdout.strip()) == (0, "hvd-h3"), proc.stderr


def test_only_the_bed_key_is_accepted(testbed):
    ok = testbed.ssh(1, "true", agent=False, key=testbed.key_path, capture_output=True, text=True,
                     timeout=TIMEOUT_S)
    assert ok.returncode == 0, ok.stderr
    for key in (testbed.unauthorized_key_path, None):
        # Without the agent, the unauthorized key (or no key at all) is all ssh can offer.
        refused = testbed.ssh(1, "true", agent=False, key=key, capture_output=True, text=True, timeout=TIMEOUT_S)
        assert refused.returncode == 255
        assert "Permission denied (publickey)" in refused.stderr


def test_hosts_have_their_own_name_and_only_test_addresses(testbed):
    for index, (name, address) in enumerate(testbed.hosts, 1):
        assert testbed.exec(index, ["hostname"], capture_output=True, text=True).stdout.strip() == name
        resolved = testbed.exec(index, ["getent", "hosts", name], capture_output=True, text=True).stdout.split()
        assert resolved == [address, name]
        addresses = testbed.exec(index, ["ip", "-o", "addr", "show"], capture_output=True, text=True,
                                 check=True).stdout
        assert sorted((line.split()[1], line.split()[3]) for line in addresses.splitlines()) == sorted([
            ("lo", "127.0.0.1/8"), ("lo", "::1/128"), (testbed.interface, f"{address}/24")])
        # No route out of the bed's subnet.
        routes = testbed.exec(index, ["ip", "-4", "route", "show"], capture_output=True, text=True,
                              check=True).stdout
        assert [line.split()[0] for line in routes.splitlines()] == ["198.18.0.0/24"]
    bridge = subprocess.run(["ip", "-o", "addr", "show", "dev", testbed.interface], capture_output=True,
                            text=True, check=True).stdout
    assert [line.split()[3] for line in bridge.splitlines()] == [f"{testbed.launcher_address}/24"]


def test_only_sshd_runs_in_the_hosts(testbed):
    assert testbed.wait_idle(5) == {}
    for index, (name, _) in enumerate(testbed.hosts, 1):
        listed = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, check=True).stdout
        assert [int(pid) for pid in listed.split()] == [testbed.sshd_pid(index)]
        with open(f"/proc/{testbed.sshd_pid(index)}/comm") as f:
            assert f.read().strip() == "sshd"


def test_leftover_processes_are_seen(testbed):
    proc = subprocess.Popen(testbed.command(2, ["sleep", "60"]))
    try:
        # nsenter execs the command: its PID is the sleep's, in the host once nsenter has entered.
        deadline = time.monotonic() + 10
        while testbed.pids(2) != [proc.pid] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert testbed.pids(2) == [proc.pid]
        assert list(testbed.leftovers()) == ["hvd-h2"]
    finally:
        proc.kill()
        proc.wait()
    assert testbed.pids(2) == []


def test_known_hosts_stay_in_the_state_dir(testbed):
    with open(os.path.join(testbed.state_dir, "known_hosts")) as f:
        known = f.read()
    for _, address in testbed.hosts:
        assert address in known
    user_known_hosts = os.path.expanduser("~/.ssh/known_hosts")
    if os.path.exists(user_known_hosts):
        with open(user_known_hosts) as f:
            assert "198.18." not in f.read()


def test_up_again_and_status(testbed):
    before = [testbed.sshd_pid(index) for index in range(1, 4)]
    testbed.up(2)  # fewer hosts than are up: nothing to do
    assert len(testbed.hosts) == 3
    assert [testbed.sshd_pid(index) for index in range(1, 4)] == before
    status = testbed.status()
    for name, address in testbed.hosts:
        assert f"{name} {address}: sshd PID" in status and "port 22 ok port 2222 ok" in status


def test_shape(testbed):
    try:
        testbed.shape("delay 1ms")
    except TestbedUnavailable as e:
        pytest.skip(e.reason)
    try:
        here = subprocess.run(["tc", "qdisc", "show", "dev", "hvdv1"], capture_output=True, text=True).stdout
        there = testbed.exec(1, ["tc", "qdisc", "show", "dev", testbed.interface], capture_output=True,
                             text=True).stdout
        assert "netem" in here and "delay 1ms" in here
        assert "netem" in there and "delay 1ms" in there
    finally:
        testbed.unshape()
    assert "netem" not in subprocess.run(["tc", "qdisc", "show", "dev", "hvdv1"], capture_output=True,
                                         text=True).stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="changes to an unprivileged user")
def test_unprivileged_machine_is_unavailable():
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "bash",
                           str(find_script()), "check"], capture_output=True, text=True, timeout=TIMEOUT_S)
    if proc.stderr.startswith("setpriv:"):
        pytest.skip(f"cannot change to an unprivileged user here: {proc.stderr.strip()}")
    assert proc.returncode == 77
    assert len(proc.stderr.strip().splitlines()) == 1 and "root" in proc.stderr
