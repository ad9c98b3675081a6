"""The task side of the launcher's probe: one service per host that the driver and the previous
host's task can reach (see :mod:`horovod.runner.common.service.driver_service`)."""

import threading

from horovod.runner.common.util import network


class NotifyInitialRegistrationCompleteRequest:
    """Every task has registered with the driver: task-to-task probing may start."""


class BasicTaskService(network.BasicService):
    """The service of task ``index``.

    Args:
        name: the service name (other tasks check it).
        index: this task's index (its host's position in the host list).
        key: the job secret (bytes).
        nics: interface names to publish (a set), or None for all.
        command_env: reserved for running commands on behalf of the driver.
        verbose: verbosity (0-2).
    """

    def __init__(self, name, index, key, nics, command_env=None, verbose=0):
        super().__init__(name, key, nics)
        self._index = index
        self._command_env = command_env
        self._verbose = verbose
        self._registration_complete = threading.Event()

    def _handle(self, req, client_address):
        if isinstance(req, NotifyInitialRegistrationCompleteRequest):
            self._registration_complete.set()
            return network.AckResponse()
        return super()._handle(req, client_address)

    def wait_for_initial_registration(self, timeout):
        """Block until the driver says every task registered; ``timeout`` is a ``Timeout``."""
        while not self._registration_complete.wait(min(1.0, max(timeout.remaining(), 0.01))):
            timeout.check_time_out_for("tasks to start")


class BasicTaskClient(network.BasicClient):
    """Client of a :class:`BasicTaskService`."""

    def __init__(self, service_name, task_addresses, key, verbose, match_intf=False, attempts=3):
        super().__init__(service_name, task_addresses, key, verbose, match_intf=match_intf,
                         attempts=attempts)

    def notify_initial_registration_complete(self):
        self._send(NotifyInitialRegistrationCompleteRequest())
