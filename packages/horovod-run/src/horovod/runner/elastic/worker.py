"""Host-change notifications delivered to elastic workers (runner.md §5.5).

The elastic driver tells the rank-0 worker when the set of hosts changes; the
:class:`WorkerNotificationManager` of that process passes the news to every registered listener
(elastic ``State`` objects), which act on it at their next ``commit()``.
"""

import enum
import os
import socket
import threading

from horovod.runner.common.util import network, secret
from horovod.runner.common.util import env_names


class HostUpdateResult(enum.IntFlag):
    """How the set of hosts changed; flags combine (``removed | added == mixed``)."""
    no_update = 0
    removed = 1
    added = 2
    mixed = 3


class HostsUpdatedRequest:
    """The driver's news that the hosts changed at ``timestamp`` (``res``: what changed)."""

    def __init__(self, timestamp, res=HostUpdateResult.no_update):
        self.timestamp = timestamp
        self.res = res


class WorkerNotificationService(network.BasicService):
    """The service through which the driver reaches one worker process."""

    NAME = 'worker notification service'

    def __init__(self, key, nic, manager):
        super().__init__(WorkerNotificationService.NAME, key, {nic} if nic else None)
        self._manager = manager

    def _handle(self, req, client_address):
        if isinstance(req, HostsUpdatedRequest):
            self._manager.handle_hosts_updated(req.timestamp, req.res)
            return network.AckResponse()
        return super()._handle(req, client_address)


class WorkerNotificationClient(network.BasicClient):
    """The driver's client of one worker's :class:`WorkerNotificationService`."""

    def __init__(self, addresses, key, verbose, match_intf=False):
        super().__init__(WorkerNotificationService.NAME, addresses, key, verbose,
                         match_intf=match_intf, probe_timeout=5, attempts=3)

    def notify_hosts_updated(self, timestamp, update_res):
        self._send(HostsUpdatedRequest(timestamp, update_res))


class WorkerNotificationManager:
    """Fans host-update notifications out to listeners; one per worker process.

    Listeners are objects with ``on_hosts_updated(timestamp, update_res)``. They may be registered
    before or after :meth:`init`.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._listeners = set()
        self._rendezvous = None

    def init(self, rendezvous_addr=None, rendezvous_port=None, nic=None, hostname=None,
             local_rank=None):
        """Joins the elastic job's notification channel; a no-op unless this worker was
        started by an elastic launcher (``HOROVOD_ELASTIC=1`` with a rendezvous address).

        Args:
            rendezvous_addr (str): launcher's rendezvous host; default env
                ``HOROVOD_GLOO_RENDEZVOUS_ADDR``.
            rendezvous_port (int): its port; default env ``HOROVOD_GLOO_RENDEZVOUS_PORT``.
            nic (str): network interface to listen on; default env ``HOROVOD_GLOO_IFACE``.
            hostname (str): this worker's host name; default env ``HOROVOD_HOSTNAME``.
            local_rank (int): this worker's local rank; default env ``HOROVOD_LOCAL_RANK``.

        Starts a :class:`WorkerNotificationService` (with a key of its own) and publishes its
        addresses and key under ``worker_addresses/<hostname>:<local_rank>`` of the rendezvous
        server, where the elastic driver picks them up. Calling it again after a successful call
        does nothing. Without an address (a plain ``python`` process), or with the address only
        from the environment of a launch that is not elastic (``HOROVOD_ELASTIC`` unset), it
        does nothing.
        """
        with self._lock:
            if self._rendezvous is not None:
                return
            if not rendezvous_addr and os.environ.get(env_names.ELASTIC) != '1':
                return
            rendezvous_addr = rendezvous_addr or os.environ.get(env_names.GLOO_RENDEZVOUS_ADDR)
            if not rendezvous_addr:
                return
            from horovod.runner.http.http_client import put_data_into_kvstore
            port = int(rendezvous_port or os.environ.get(env_names.GLOO_RENDEZVOUS_PORT, 0))
            nic = nic or os.environ.get(env_names.GLOO_IFACE)
            hostname = hostname or os.environ.get(env_names.HOSTNAME) or socket.gethostname()
            local_rank = int(local_rank if local_rank is not None
                             else os.environ.get(env_names.LOCAL_RANK, 0))
            key = secret.make_secret_key()
            service = WorkerNotificationService(key, nic, self)
            try:
                put_data_into_kvstore(rendezvous_addr, port, 'worker_addresses',
                                      '%s:%d' % (hostname, local_rank),
                                      (service.addresses(), key))
            except BaseException:
                service.shutdown()
                raise
            self._service = service
            self._rendezvous = {'addr': rendezvous_addr, 'port': port, 'nic': nic,
                                'hostname': hostname, 'local_rank': local_rank}

    def register_listener(self, listener):
        """Adds ``listener`` (an object with ``on_hosts_updated``); adding it twice keeps one."""
        with self._lock:
            self._listeners.add(listener)

    def remove_listener(self, listener):
        """Removes ``listener``; a listener that is not registered is ignored."""
        with self._lock:
            self._listeners.discard(listener)

    def handle_hosts_updated(self, timestamp, update_res):
        """Calls ``on_hosts_updated(timestamp, update_res)`` on every registered listener.

        Args:
            timestamp (int): when the driver saw the change; larger is newer.
            update_res (HostUpdateResult): what changed.
        """
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener.on_hosts_updated(timestamp, update_res)
