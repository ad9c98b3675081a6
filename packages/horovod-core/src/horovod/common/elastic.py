"""Elastic training state shared by every framework package (core.md §13).

A training function wrapped by :func:`run_fn` receives a :class:`State`. When a collective fails
(``HorovodInternalError``) the state is rolled back to its last commit; when the launcher reports
that hosts changed (``HostsUpdatedInterrupt``) the state is kept. Either way Horovod is
re-initialised, the state is synchronised from rank 0 and the function runs again.
"""

import functools
import queue
import sys

from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt, WorkerRemovedError

try:
    from horovod.runner.elastic.worker import HostUpdateResult, WorkerNotificationManager
except ImportError:
    # horovod-core without horovod-run: no elastic launcher can exist, so nothing will ever
    # notify this worker; the stand-ins keep the state API working.
    import enum

    class HostUpdateResult(enum.IntFlag):
        """Bit flags describing how the set of hosts changed."""
        no_update = 0
        removed = 1
        added = 2
        mixed = 3

    class WorkerNotificationManager:
        """Stand-in used when horovod-run is not installed: no notifications ever arrive."""

        def init(self, *args, **kwargs):
            """Does nothing."""

        def register_listener(self, listener):
            """Does nothing."""

        def remove_listener(self, listener):
            """Does nothing."""


notification_manager = WorkerNotificationManager()


class State(object):
    """Training state that survives a reset of Horovod.

    Args:
        bcast_object: ``bcast_object(obj) -> obj``, broadcasting a picklable object from rank 0.
        get_rank: ``get_rank() -> int``, this process's rank.
    """

    def __init__(self, bcast_object, get_rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._host_messages = queue.Queue()
        self._last_updated_timestamp = 0
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Adds callables run after each reset, in order.

        Args:
            callbacks: an iterable of callables taking no arguments; they run on every rank after
                Horovod was re-initialised and :meth:`reset` ran.
        """
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        """Called after Horovod was re-initialised: forgets queued host updates, calls
        :meth:`reset`, then every registered reset callback."""
        self._host_messages = queue.Queue()
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp, update_res):
        """Queues a host update (called from the notification service's thread).

        Args:
            timestamp (int): when the launcher saw the change; larger is newer.
            update_res (HostUpdateResult): what changed.
        """
        self._host_messages.put((timestamp, update_res))

    def commit(self):
        """Saves the state, then checks for host updates.

        Raises:
            HostsUpdatedInterrupt: hosts were added or removed since the last check.
        """
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Applies queued host updates, agreeing on them with rank 0 (a collective: every rank
        must call it).

        Raises:
            HostsUpdatedInterrupt: rank 0 saw an update newer than the last one handled;
                ``skip_sync`` is True when hosts were only removed.
        """
        prev_timestamp = self._last_updated_timestamp
        last_timestamp = prev_timestamp
        flags = HostUpdateResult.no_update
        while not self._host_messages.empty():
            timestamp, update_res = self._host_messages.get()
            if timestamp > last_timestamp:
                last_timestamp = timestamp
                flags |= update_res

        # Only rank 0 is notified by the launcher, so its view decides for everyone.
        prev_timestamp, last_timestamp, flags = self._bcast_object(
            (prev_timestamp, last_timestamp, flags))
        self._last_updated_timestamp = last_timestamp
        if last_timestamp > prev_timestamp:
            raise HostsUpdatedInterrupt(skip_sync=(flags == HostUpdateResult.removed))

    def save(self):
        """Snapshots the state in memory (implemented by subclasses).

        Raises:
            NotImplementedError: always, here; subclasses override it.
        """
        raise NotImplementedError()

    def restore(self):
        """Rolls the state back to the last snapshot (implemented by subclasses).

        Raises:
            NotImplementedError: always, here; subclasses override it.
        """
        raise NotImplementedError()

    def sync(self):
        """Makes every rank's state equal to rank 0's (implemented by subclasses; collective).

        Raises:
            NotImplementedError: always, here; subclasses override it.
        """
        raise NotImplementedError()

    def reset(self):
        """Hook run by :meth:`on_reset`; does nothing by default."""


class ObjectState(State):
    """State made of picklable Python objects, one attribute per keyword argument.

    Args:
        bcast_object: ``bcast_object(obj) -> obj``, broadcasting from rank 0.
        get_rank: ``get_rank() -> int``.
        **kwargs: initial attribute values; they are also the first snapshot.
    """

    def __init__(self, bcast_object, get_rank, **kwargs):
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        """Snapshots the current values of the managed attributes."""
        self._saved_state = {attr: getattr(self, attr) for attr in self._saved_state}

    def restore(self):
        """Sets the managed attributes back to the last snapshot."""
        self._set_attrs()

    def sync(self):
        """Replaces the snapshot and attributes with rank 0's snapshot (collective)."""
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)


def run_fn(func, reset):
    """Wraps ``func(state, *args, **kwargs)`` so that it is retried after failures.

    Args:
        func: the training function; its first argument is a :class:`State`.
        reset: called with no arguments to re-initialise Horovod (normally ``shutdown(); init()``).

    Returns:
        ``wrapper(state, *args, **kwargs)`` returning what ``func`` returns. Before each attempt
        the state is synchronised from rank 0, except after a ``HostsUpdatedInterrupt`` with
        ``skip_sync``. After ``HorovodInternalError`` (from ``func`` or from the sync) the state
        is restored to its last commit, Horovod is reset and the attempt starts again.
        When the elastic launcher removed this worker's slot, the re-initialisation raises
        ``WorkerRemovedError`` and the process exits with status 0 after one line on stderr.
        Other exceptions propagate.
    """
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        notification_manager.init()
        notification_manager.register_listener(state)
        skip_sync = False
        try:
            while True:
                try:
                    # The sync is inside: a peer lost while rank 0's state is broadcast after a
                    # reset is one more failure to recover from, not the end of this worker.
                    if not skip_sync:
                        state.sync()
                    return func(state, *args, **kwargs)
                except HorovodInternalError:
                    state.restore()
                    skip_sync = False
                except HostsUpdatedInterrupt as e:
                    skip_sync = e.skip_sync
                try:
                    reset()
                except WorkerRemovedError as e:
                    # The launcher no longer has a slot for this process: leave quietly.
                    print(f"horovod elastic: {e}; this worker exits", file=sys.stderr, flush=True)
                    sys.exit(0)
                state.on_reset()
        finally:
            notification_manager.remove_listener(state)
    return wrapper
