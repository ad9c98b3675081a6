"""Read and write Python objects in the launcher's KV store.

Values are base64-encoded cloudpickles. Both calls authenticate with the job secret found as
described in :class:`horovod.common.rendezvous.RendezvousClient`, and only an authenticated
response is unpickled.
"""

from horovod.common.rendezvous import RendezvousClient
from horovod.runner.common.util import codec


def read_data_from_kvstore(addr, port, scope, key):
    """Return the object stored at ``scope``/``key`` on the server ``addr``:``port``.

    Raises ``RuntimeError`` if the key is absent or the server answers with an error, and the
    exceptions of :class:`RendezvousClient` (``PermissionError``, ``ConnectionError``,
    ``ValueError`` for a missing secret).
    """
    value = RendezvousClient(addr, port).try_get(scope, key)
    if value is None:
        raise RuntimeError("key %s/%s not found in the KV store at %s:%s"
                           % (scope, key, addr, port))
    return codec.loads_base64(value)


def put_data_into_kvstore(addr, port, scope, key, value):
    """Store the object ``value`` at ``scope``/``key`` on the server ``addr``:``port``.

    Raises ``RuntimeError`` for an HTTP error, and the exceptions of :class:`RendezvousClient`.
    """
    RendezvousClient(addr, port).set(scope, key, codec.dumps_base64(value).encode("ascii"))
