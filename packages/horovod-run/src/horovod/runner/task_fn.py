"""One host's part of ``horovodrun``'s interface probe.

``python -m horovod.runner.task_fn <index> <num_hosts> <driver_addresses> -``: the first three
arguments are base64 cloudpickles; the launcher's settings (which hold the job secret) arrive as
one base64 line on standard input rather than on the command line. (A fourth base64 argument
instead of ``-`` is accepted too, as upstream passed it, but then the secret is visible in
process listings.) The task registers with the driver, waits until every host has, probes the
next host's task on all of its interfaces and reports which ones answered. It then stays up, so
that the previous host can probe it, until its standard input is closed.
"""

import socket
import sys

from horovod.runner.common.util import codec, host_hash, network
from horovod.runner.driver import driver_service
from horovod.runner.task import task_service


def _check_nics(nics):
    """Exit with a message naming this host when one of ``nics`` has no IPv4 address here."""
    if not nics:
        return
    present = network.local_ipv4_addresses()
    missing = sorted(set(nics) - set(present))
    if missing:
        print("horovodrun: host %s has no network interface %s with an IPv4 address (it has: %s)"
              % (socket.gethostname(), ", ".join(repr(n) for n in missing),
                 ", ".join(sorted(present))), file=sys.stderr, flush=True)
        sys.exit(2)


def _task_fn(index, num_hosts, driver_addresses, settings):
    _check_nics(settings.nics)
    task = task_service.HorovodRunTaskService(index, settings.key, settings.nics)
    try:
        driver = driver_service.HorovodRunDriverClient(driver_addresses, settings.key,
                                                       settings.verbose)
        driver.register_task(index, task.addresses(), host_hash.host_hash())
        task.wait_for_initial_registration(settings.start_timeout)
        next_index = (index + 1) % num_hosts
        next_addresses = driver.all_task_addresses(next_index)
        next_task = task_service.HorovodRunTaskClient(next_index, next_addresses, settings.key,
                                                      settings.verbose, match_intf=True,
                                                      attempts=3)
        driver.register_task_to_task_addresses(next_index, next_task.addresses())
        # Stay reachable until the launcher is done with every host's probe.
        while sys.stdin.buffer.read1(4096):
            pass
    finally:
        task.shutdown()


def main(argv):
    if len(argv) != 5:
        sys.exit("usage: python -m horovod.runner.task_fn <index> <num_hosts> "
                 "<driver_addresses> <settings|->  (each base64)")
    index = codec.loads_base64(argv[1])
    num_hosts = codec.loads_base64(argv[2])
    driver_addresses = codec.loads_base64(argv[3])
    encoded = sys.stdin.buffer.readline().strip() if argv[4] == "-" else argv[4]
    if not encoded:
        sys.exit(0)
    settings = codec.loads_base64(encoded)
    _task_fn(index, num_hosts, driver_addresses, settings)


if __name__ == "__main__":
    main(sys.argv)
