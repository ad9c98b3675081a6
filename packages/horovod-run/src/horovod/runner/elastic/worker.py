"""Host-change notifications delivered to elastic workers (runner.md §5.5).

The elastic driver tells the rank-0 worker when the set of hosts changes; the
:class:`WorkerNotificationManager` of that process passes the news to every registered listener
(elastic ``State`` objects), which act on it at their next ``commit()``.
"""

import enum
import os
import threading


class HostUpdateResult(enum.IntFlag):
    """How the set of hosts changed; flags combine (``removed | added == mixed``)."""
    no_update = 0
    removed = 1
    added = 2
    mixed = 3


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

        Calling it again after a successful call does nothing. Raises nothing; in particular a
        plain ``python`` process or a static ``horovodrun`` launch is left alone.
        """
        with self._lock:
            if self._rendezvous is not None:
                return
            if os.environ.get('HOROVOD_ELASTIC') != '1':
                return
            rendezvous_addr = rendezvous_addr or os.environ.get('HOROVOD_GLOO_RENDEZVOUS_ADDR')
            if not rendezvous_addr:
                return
            # The driver pushes updates through a notification service registered under
            # worker_addresses/<host>:<local_rank>; that service comes with the elastic launcher.
            # Until then the parameters are recorded and updates arrive via handle_hosts_updated.
            self._rendezvous = {
                'addr': rendezvous_addr,
                'port': int(rendezvous_port or os.environ.get('HOROVOD_GLOO_RENDEZVOUS_PORT', 0)),
                'nic': nic or os.environ.get('HOROVOD_GLOO_IFACE'),
                'hostname': hostname or os.environ.get('HOROVOD_HOSTNAME'),
                'local_rank': int(local_rank if local_rank is not None
                                  else os.environ.get('HOROVOD_LOCAL_RANK', 0)),
            }

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
