"""The driver side of the launcher's probe: tasks register here and report what they reached.

Each host runs one task (:mod:`horovod.runner.common.service.task_service`). Task ``i``
registers its addresses and host hash; once all have, each task probes the next one
(``(i + 1) % n``) and reports the addresses of the next task it could reach. From those reports
the driver learns which interfaces connect every host to the next.
"""

import threading

from horovod.runner.common.util import network


class RegisterTaskRequest:
    def __init__(self, index, task_addresses, host_hash):
        self.index = index
        self.task_addresses = task_addresses
        self.host_hash = host_hash


class RegisterTaskToTaskAddressesRequest:
    def __init__(self, index, task_addresses):
        self.index = index
        self.task_addresses = task_addresses


class AllTaskAddressesRequest:
    def __init__(self, index):
        self.index = index


class AllTaskAddressesResponse:
    def __init__(self, all_task_addresses):
        self.all_task_addresses = all_task_addresses


class BasicDriverService(network.BasicService):
    """Collects the registrations of ``num_proc`` tasks.

    Args:
        num_proc: number of tasks (hosts) that register.
        name: the service name.
        key: the job secret (bytes).
        nics: interface names to listen on (a set), or None for all.
    """

    def __init__(self, num_proc, name, key, nics):
        super().__init__(name, key, nics)
        self._num_proc = num_proc
        self._all_task_addresses = {}
        self._task_addresses_for_driver = {}
        self._task_addresses_for_tasks = {}
        self._task_host_hashes = {}
        self._cond = threading.Condition()

    def _handle(self, req, client_address):
        if isinstance(req, RegisterTaskRequest):
            with self._cond:
                self._all_task_addresses[req.index] = req.task_addresses
                # The driver reaches a task through the interface the task reached it from.
                source = client_address[0]
                for_driver = {intf: [a for a in addrs if a[0] == source]
                              for intf, addrs in req.task_addresses.items()}
                for_driver = {intf: addrs for intf, addrs in for_driver.items() if addrs}
                self._task_addresses_for_driver[req.index] = for_driver or req.task_addresses
                self._task_host_hashes[req.index] = req.host_hash
                self._cond.notify_all()
            return network.AckResponse()
        if isinstance(req, RegisterTaskToTaskAddressesRequest):
            with self._cond:
                self._task_addresses_for_tasks[req.index] = req.task_addresses
                self._cond.notify_all()
            return network.AckResponse()
        if isinstance(req, AllTaskAddressesRequest):
            with self._cond:
                return AllTaskAddressesResponse(self._all_task_addresses.get(req.index))
        return super()._handle(req, client_address)

    def all_task_addresses(self, index):
        with self._cond:
            return self._all_task_addresses.get(index)

    def task_addresses_for_driver(self, index):
        with self._cond:
            return self._task_addresses_for_driver.get(index)

    def task_addresses_for_tasks(self, index):
        with self._cond:
            return self._task_addresses_for_tasks.get(index)

    def task_host_hash(self, index):
        with self._cond:
            return self._task_host_hashes.get(index)

    def registered_tasks(self):
        """Indices of the tasks that have registered so far (sorted)."""
        with self._cond:
            return sorted(self._all_task_addresses)

    def reported_tasks(self):
        """Indices of the tasks that have reported what they reached (sorted)."""
        with self._cond:
            return sorted(self._task_addresses_for_tasks)

    def _wait_for(self, done, timeout, activity, stop=None):
        """Wait until ``done()``; ``timeout`` is a :class:`Timeout`. ``stop()`` ends it early."""
        with self._cond:
            while not done():
                if stop is not None and stop():
                    return
                timeout.check_time_out_for(activity)
                self._cond.wait(min(0.1, max(timeout.remaining(), 0.01)))

    def wait_for_initial_registration(self, timeout, stop=None):
        self._wait_for(lambda: len(self._all_task_addresses) >= self._num_proc, timeout,
                       "tasks to start", stop)

    def wait_for_task_to_task_address_updates(self, timeout, stop=None):
        self._wait_for(lambda: len(self._task_addresses_for_tasks) >= self._num_proc, timeout,
                       "tasks to update task-to-task addresses", stop)


class BasicDriverClient(network.BasicClient):
    """Client of a :class:`BasicDriverService`."""

    def __init__(self, name, driver_addresses, key, verbose, match_intf=False):
        super().__init__(name, driver_addresses, key, verbose, match_intf=match_intf)

    def register_task(self, index, task_addresses, host_hash):
        self._send(RegisterTaskRequest(index, task_addresses, host_hash))

    def all_task_addresses(self, index):
        return self._send(AllTaskAddressesRequest(index)).all_task_addresses

    def register_task_to_task_addresses(self, index, task_addresses):
        self._send(RegisterTaskToTaskAddressesRequest(index, task_addresses))
