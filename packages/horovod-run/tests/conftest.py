"""The multi-host test bed's fixtures (``testbed``, the leftover check after each test that uses
it): horovod_testing.pytest_testbed."""

from horovod_testing.pytest_testbed import *  # noqa: F403
