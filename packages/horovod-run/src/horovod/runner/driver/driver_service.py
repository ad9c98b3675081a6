"""``horovodrun``'s interface probe: which network interfaces connect all the hosts of a job.

The launcher starts a :class:`HorovodRunDriverService` and one task
(:mod:`horovod.runner.task_fn`) per host, over ssh for remote hosts. Every task registers with
the driver, then probes the next host's task on all of its interfaces; the interfaces (by name) on
which every host reached its successor are the job's common interfaces. Where the launcher is
none of the hosts, each host must also have reached the driver on them. Gloo, the rendezvous and
mpirun's TCP transport use them.
"""

import os
import shlex
import subprocess
import sys
import threading

from horovod.runner.common.service import driver_service
from horovod.runner.common.util import codec, orphan_guard, safe_shell_exec
from horovod.runner.common.util.timeout import TimeoutException
from horovod.runner.task import task_service
from horovod.runner.util import network, remote

_TASK_EXIT_WAIT_S = 10.0


class HorovodRunDriverService(driver_service.BasicDriverService):
    NAME = "horovod driver service"

    def __init__(self, num_hosts, key, nics):
        super().__init__(num_hosts, HorovodRunDriverService.NAME, key, nics)


class HorovodRunDriverClient(driver_service.BasicDriverClient):
    def __init__(self, driver_addresses, key, verbose, match_intf=False):
        super().__init__(HorovodRunDriverService.NAME, driver_addresses, key, verbose,
                         match_intf=match_intf)


class _Task:
    """One probe task process (local, or the ssh client of a remote one) and its output."""

    def __init__(self, index, host, argv, settings_line, env):
        self.index = index
        self.host = host
        self.output = []
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, env=env, start_new_session=True)
        orphan_guard.get_guard().register(self.proc.pid)
        self.proc.stdin.write(settings_line)
        self.proc.stdin.flush()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.output.append(line.decode("utf-8", "replace").rstrip("\n"))

    def failed(self):
        return self.proc.poll() not in (None, 0)

    def describe_failure(self):
        self._reader.join(timeout=2)
        text = "\n".join(self.output[-20:]) or "(no output)"
        return "host %s: the probe task exited with status %s:\n%s" % (
            self.host, self.proc.returncode, text)

    def stop(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=_TASK_EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
        safe_shell_exec.terminate_process_group(self.proc)
        orphan_guard.get_guard().unregister(self.proc.pid)


def _task_argv(index, num_hosts, driver_addresses, settings, host, local):
    command = [sys.executable, "-m", "horovod.runner.task_fn",
               codec.dumps_base64(index), codec.dumps_base64(num_hosts),
               codec.dumps_base64(driver_addresses), "-"]
    if local:
        return command
    remote_command = "cd %s > /dev/null 2>&1 ; exec %s" % (
        shlex.quote(os.getcwd()), " ".join(shlex.quote(a) for a in command))
    return remote.ssh_argv(host, settings.ssh_port, settings.ssh_identity_file) + [remote_command]


def _launch_task_servers(all_host_names, local_host_names, driver_addresses, settings):
    """Start one probe task per host (over ssh unless the host is local); return them."""
    settings_line = codec.dumps_base64(settings, to_ascii=False) + b"\n"
    tasks = []
    for index, host in enumerate(all_host_names):
        argv = _task_argv(index, len(all_host_names), driver_addresses, settings, host,
                          host in local_host_names)
        if settings.verbose >= 2:
            print("Launching horovod task function: %s" % " ".join(shlex.quote(a) for a in argv),
                  flush=True)
        tasks.append(_Task(index, host, argv, settings_line, dict(os.environ)))
    return tasks


def _run_probe(driver, settings, num_hosts, tasks=(), local_tasks=()):
    """Drive the registration and the host-to-host checks; return the common interfaces.

    ``local_tasks``: the indices of the hosts that are this host (the launcher's).
    """
    def failed_task():
        return next((t for t in tasks if t.failed()), None)

    def check_tasks():
        task = failed_task()
        if task is not None:
            raise RuntimeError("the network interface probe failed on " + task.describe_failure())

    def wait(step, done, what):
        """Run the driver's wait ``step``; a task that failed meanwhile is reported first, and
        a timeout names the hosts whose task is not in ``done()``."""
        try:
            step(settings.start_timeout, stop=lambda: failed_task() is not None)
        except TimeoutException as e:
            check_tasks()
            waiting = ", ".join(t.host for t in tasks if t.index not in done()) or "none"
            raise TimeoutException("%s (hosts that did not %s: %s)" % (e, what, waiting)) from None
        check_tasks()

    if settings.verbose >= 2:
        print("Waiting for the hosts to acknowledge.", flush=True)
    wait(driver.wait_for_initial_registration, driver.registered_tasks, "register")
    for index in range(num_hosts):
        task_service.HorovodRunTaskClient(index, driver.task_addresses_for_driver(index),
                                          settings.key, settings.verbose
                                          ).notify_initial_registration_complete()
    if settings.verbose >= 2:
        print("Notified all the hosts that the registration is complete.", flush=True)
        print("Waiting for hosts to perform host-to-host interface checking.", flush=True)
    wait(driver.wait_for_task_to_task_address_updates, driver.reported_tasks, "report")
    if settings.verbose >= 2:
        print("Host-to-host interface checking successful.", flush=True)

    # The interfaces on which each host reached the next one (a ring over all hosts), by name.
    common = None
    for index in range(num_hosts):
        reached = set(driver.task_addresses_for_tasks(index))
        common = reached if common is None else common & reached
    if not local_tasks:
        # The launcher is none of the hosts: the rendezvous on its address must also be
        # reachable from every host, so keep the interfaces on which each reached the driver.
        # When the launcher is one of the hosts, the ring already proved that the others reach
        # it on these interfaces, and a task on this host reaches the driver over loopback, an
        # interface the others cannot use: that path says nothing.
        for index in range(num_hosts):
            common &= set(driver.task_addresses_for_driver(index))
    if not common:
        raise Exception(
            "Unable to find a set of common task-to-task communication interfaces: %s"
            % [(index, driver.task_addresses_for_tasks(index)) for index in range(num_hosts)])
    return common


def _driver_fn(all_host_names, local_host_names, settings):
    """Run the probe over ``all_host_names``; return the common interface names (a set)."""
    driver = HorovodRunDriverService(len(all_host_names), settings.key, settings.nics)
    if settings.verbose >= 2:
        print("Launched horovod server.", flush=True)
    tasks = []
    try:
        tasks = _launch_task_servers(all_host_names, local_host_names, driver.addresses(),
                                     settings)
        if settings.verbose >= 2:
            print("Attempted to launch horovod task servers.", flush=True)
        local_tasks = [index for index, host in enumerate(all_host_names)
                       if host in local_host_names]
        return _run_probe(driver, settings, len(all_host_names), tasks, local_tasks)
    finally:
        for task in tasks:
            task.stop()
        driver.shutdown()


def get_local_interfaces(settings):
    """The interfaces holding 127.0.0.1 (restricted to ``settings.nics``); ``ValueError`` if
    there are none."""
    if settings.verbose >= 2:
        print("All hosts are local, finding the interfaces with address 127.0.0.1", flush=True)
    nics = network.get_loopback_intfs(settings.nics)
    if not nics:
        raise ValueError("no network interface holds the address 127.0.0.1"
                         + (" among %s" % ", ".join(sorted(settings.nics))
                            if settings.nics else ""))
    if settings.verbose >= 2:
        print("Local interface found " + " ".join(nics), flush=True)
    return nics


def _order(nics):
    """Interface names in a stable order: the loopback ones last."""
    loopback = set(network.get_loopback_intfs())
    return sorted(nics, key=lambda name: (name in loopback, name))


def get_common_interfaces(settings, all_host_names, remote_host_names=None, fn_cache=None):
    """The network interfaces (a list, the one to prefer first) all the job's hosts share.

    Args:
        settings: launcher settings (``nics``, ``key``, ``start_timeout``, ``verbose``, ssh
            options).
        all_host_names: every host of the job, in order.
        remote_host_names: those that are not this host (computed when None).
        fn_cache: a :class:`~horovod.runner.util.cache.Cache` for the probe's result, or None.

    With only local hosts, the loopback interfaces. Otherwise a probe runs a task on every host
    (locally on this host, over ssh on the others) and keeps the interface names on which each
    host reached the next one; when this host is not one of the job's, also those on which
    every host reached this one. ``settings.nics``, when given and not empty, restricts the
    probe: a host lacking one of them fails with a message naming the host and the interface.
    An empty collection means no restriction, as None does.

    Raises:
        ValueError: no usable local interface.
        RuntimeError: a probe task failed (its host and output are named).
        TimeoutException: hosts did not register within the start timeout (they are named).
        Exception: the hosts share no interface.
    """
    if remote_host_names is None:
        remote_host_names = network.filter_local_addresses(all_host_names)
    if not remote_host_names:
        return get_local_interfaces(settings)
    if settings.nics:
        missing = sorted(set(settings.nics) - set(network.get_local_intfs()))
        if missing:
            raise ValueError("this host (the launcher) has no network interface %s (it has: %s)"
                             % (", ".join(repr(n) for n in missing),
                                ", ".join(sorted(network.get_local_intfs()))))
    if settings.verbose >= 2:
        print("Testing interfaces on all the hosts.", flush=True)
    local_host_names = [h for h in all_host_names if h not in set(remote_host_names)]
    key = "common_interfaces %s" % sorted(settings.nics or [])
    nics = fn_cache.get(key) if fn_cache is not None else None
    if not nics:
        nics = _order(_driver_fn(list(all_host_names), local_host_names, settings))
        if fn_cache is not None:
            fn_cache.put(key, nics)
    if settings.verbose >= 2:
        print("Interfaces on all the hosts were successfully checked.", flush=True)
        print("Common interface found: " + " ".join(nics), flush=True)
    return nics
