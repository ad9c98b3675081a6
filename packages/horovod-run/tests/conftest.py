"""The multi-host test bed for the launcher's tests (horovod_testing.testbed, ci/testbed.sh).

``testbed``: a session fixture, hosts hvd-h1..hvd-h3 (198.18.0.1..3) brought up on first use and
taken down at the end of the session, also after a failure or Ctrl-C; the tests that need it skip
where this machine cannot make network namespaces (not root). HOROVOD_TESTBED_KEEP=1 leaves the
bed up after the session (the next session finds it up and starts at once).

After each test that uses ``testbed``, no process may remain in a host besides its sshd: the test
errors at teardown (after the leftovers are killed) unless it carries
``@pytest.mark.testbed_leftovers_allowed``.
"""

import os

import pytest

from horovod_testing.testbed import Testbed, TestbedError, TestbedUnavailable

TESTBED_HOSTS = 3
LEFTOVER_TIMEOUT_S = 10


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "testbed_leftovers_allowed: processes may remain on the test bed's hosts after this test")


@pytest.fixture(scope="session")
def testbed():
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
