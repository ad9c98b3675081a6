"""The image's tests (run by `nox -s image` after it built the image): the test bed's fixtures
(horovod_testing.pytest_testbed) and the pods of docker/tests/pods.py."""

from horovod_testing.pytest_testbed import *  # noqa: F403
