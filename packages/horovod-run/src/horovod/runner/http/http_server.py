"""The launcher's rendezvous and KV store servers (authenticated; see horovod.common.rendezvous)."""

from horovod.common.rendezvous import (KVStoreHandler, KVStoreHTTPServer, KVStoreServer,
                                       RendezvousHandler, RendezvousHTTPServer, RendezvousServer)

__all__ = ["RendezvousServer", "RendezvousHandler", "RendezvousHTTPServer", "KVStoreServer",
           "KVStoreHandler", "KVStoreHTTPServer"]
