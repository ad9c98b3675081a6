// What the Gloo backend's algorithms (allreduce_*.h) see of a transport: this rank, the number of
// ranks, and ordered point-to-point messages to and from each peer. The synchronous TCP mesh
// (sync_mesh.h) implements it, with shared-memory channels between ranks of one host
// (shm_channel.h); the unit tests run the same algorithms over an in-process loopback and over
// bare channels. One thread uses a Peers at a time.
#pragma once

#include <cstddef>

namespace horovod::gloo_backend {

struct CrossMemoryPeer;

class Peers {
 public:
  virtual ~Peers() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sends `bytes` (at most kSyncChunkBytes) from `data` to `peer`; `data` may be reused on return.
  // The algorithms keep at most two messages of a rank unread by a peer, which every transport
  // holds without the writer blocking on the reader.
  virtual void Send(int peer, const void* data, size_t bytes) = 0;
  // The next message from `peer`, which must be of `bytes`; valid until the next Recv or RecvInto
  // from that peer.
  virtual const char* Recv(int peer, size_t bytes) = 0;
  // The same, copied into `into` (or read there directly where the transport can).
  virtual void RecvInto(int peer, void* into, size_t bytes) = 0;
  // Where this rank may read and write `peer`'s memory (a rank of its host; cross_memory.h), the
  // peer's state for it; null where it may not.
  virtual CrossMemoryPeer* cross_memory(int peer) { return nullptr; }
};

}  // namespace horovod::gloo_backend
