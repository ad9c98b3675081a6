"""The multi-host test bed (horovod_testing.testbed, ci/testbed.sh) as pytest fixtures, for the
test suites of every package; a conftest takes them with
``from horovod_testing.pytest_testbed import *  # noqa: F403``.

``testbed``: a session fixture, hosts hvd-h1..hvd-h3 (198.18.0.1..3) brought up on first use and
taken down at the end of the session, also after a failure or Ctrl-C; the tests that need it skip
where this machine cannot make network namespaces (not root). HOROVOD_TESTBED_KEEP=1 leaves the
bed up after the session (the next session finds it up and starts at once). One test session at a
time holds the bed: the fixture takes an exclusive lock on /run/lock/horovod-testbed.lock (waiting
for another session, in another checkout, to finish with it) and keeps it until the session ends.

``slurm_testbed``: a module fixture, the bed with a Slurm cluster on hosts 1 and 2 (nodes hvd-h1
and hvd-h2, 2 CPUs each; ``Testbed.slurm_env()`` for the clients), started on first use in a test
module and stopped at that module's end whatever HOROVOD_TESTBED_KEEP says, so that the other
modules' tests find hosts that run only their sshd and no Slurm daemon outlives the session that
holds the bed; skips where Slurm or munge is not installed.

After each test that uses ``testbed``, no process may remain in a host besides its sshd (and slurmd): the test
errors at teardown (after the leftovers are killed) unless it carries
``@pytest.mark.testbed_leftovers_allowed``.
"""


import fcntl
import os
import sys

import pytest

from horovod_testing.testbed import Testbed, TestbedError, TestbedUnavailable

TESTBED_HOSTS = 3
SLURM_NODES = 2
LEFTOVER_TIMEOUT_S = 10
LOCK_PATH = "/run/lock/horovod-testbed.lock"


def _lock_bed():
    """The open lock file, held exclusively; None where /run/lock cannot be written (not root, and
    then there is no bed either)."""
    try:
        fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"\nwaiting for {LOCK_PATH}: another test session is using the test bed", file=sys.stderr)
        fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "testbed_leftovers_allowed: processes may remain on the test bed's hosts after this test")


@pytest.fixture(scope="session")
def testbed():
    lock = _lock_bed()
    try:
        yield from _testbed_session()
    finally:
        if lock is not None:
            os.close(lock)


def _testbed_session():
    bed = Testbed()
    try:
        bed.up(TESTBED_HOSTS)
    except TestbedUnavailable as e:
        pytest.skip(f"no multi-host test bed here: {e.reason}")
    except BaseException as e:
        # A half-made bed (an error, or Ctrl-C during up) is removed too.
        try:
            bed.down()
        except TestbedError as down_error:
            e.add_note(f"and taking the bed down failed: {down_error}")
        raise
    try:
        yield bed
    finally:
        if os.environ.get("HOROVOD_TESTBED_KEEP") != "1":
            bed.down()


@pytest.fixture(scope="module")
def slurm_testbed(testbed):
    try:
        testbed.slurm_up(SLURM_NODES)
    except TestbedUnavailable as e:
        pytest.skip(f"no Slurm cluster on the test bed here: {e.reason}")
    except BaseException as e:
        try:
            testbed.slurm_down()
        except TestbedError as down_error:
            e.add_note(f"and stopping Slurm failed: {down_error}")
        raise
    try:
        yield testbed
    finally:
        testbed.slurm_down()


@pytest.fixture(autouse=True)
def _testbed_leftovers(request):
    yield
    if "testbed" not in request.fixturenames or request.node.get_closest_marker("testbed_leftovers_allowed"):
        return
    bed = request.getfixturevalue("testbed")
    left = bed.wait_idle(LEFTOVER_TIMEOUT_S)
    if left:
        bed.kill_leftovers()
        lines = [f"{host}: {proc}" for host, procs in left.items() for proc in procs]
        pytest.fail(f"processes left on the test bed's hosts {LEFTOVER_TIMEOUT_S} s after the test "
                    "(killed now):\n" + "\n".join(lines), pytrace=False)


__all__ = ["pytest_configure", "testbed", "slurm_testbed", "_testbed_leftovers"]
