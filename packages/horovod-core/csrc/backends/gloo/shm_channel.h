// The shared-memory channel between two ranks of one host, which carries the synchronous mesh's
// messages between them instead of the pair's TCP socket (SyncMesh::OpenChannels). Per direction,
// a ring of kChannelRingBytes and two counters of byte positions in it (modulo 2^32): how far the
// writer has put messages in and how far the reader is done with them. A message is a record of a
// 64-byte head (its length) and its bytes, rounded up to 64; a record that would not fit before the
// ring's end is preceded by a head that says "go back to the start". The reader keeps the last
// message it took in the ring (the caller reads it there) and releases it when it takes the next
// one. The ring holds at least 3 of the largest messages (kSyncChunkBytes): as much as the mesh has
// unread between two ranks (TCP's socket buffers held about as much). Waiting polls the counter
// (yielding the core) for kChannelSpin or the mesh's own poll time, whichever is longer, then
// sleeps on it as a futex. The mesh opens channels only where a host has at most
// kChannelMaxLocalRanks ranks of it, and only in the job's global mesh (not in those of process
// sets and of the hierarchical collectives' groups, GlooBackend::Split): each pair's segment takes
// 1 MiB of /dev/shm, which other users of it (data loaders, NCCL) may need, and a container's is
// often only 64 MiB.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "backends/shm/segment.h"

namespace horovod::gloo_backend {

constexpr int kChannelMaxLocalRanks = 4;

// How a channel's end waits for its peer, and whom to name when the wait fails.
struct ChannelWaiting {
  std::chrono::microseconds spin{0};  // the mesh's poll time (at least kChannelSpin is polled)
  bool busy_poll = false;             // poll throughout instead of sleeping
  std::chrono::milliseconds timeout{0};
  int peer = 0;        // the peer's rank,
  pid_t peer_pid = 0;  // process (whose exit ends a wait)
  std::string host;    // and host, for errors
};

class ShmChannel {
 public:
  // Creates a fresh segment for a channel (named under /horovod.gloo.); empty where /dev/shm cannot
  // hold it, which is no error: the pair keeps TCP. *name: its name, for the peer.
  static SharedSegment CreateSegment(std::string* name);
  // Maps the segment the peer created; empty where it cannot or it is not a channel's.
  static SharedSegment OpenSegment(const std::string& name);

  // This rank's end of the channel in `segment`: side 0 for the lower rank of the pair (it writes
  // the first ring), 1 for the higher.
  ShmChannel(SharedSegment segment, int side, ChannelWaiting waiting);
  // Tells the peer that this end is gone (a peer waiting on it then fails at once).
  ~ShmChannel();
  ShmChannel(const ShmChannel&) = delete;
  ShmChannel& operator=(const ShmChannel&) = delete;

  // Puts a message of at most kSyncChunkBytes into the ring, once it has room.
  void Send(const void* data, size_t bytes);
  // The next message, in the ring, valid until the next one is taken (its record is released
  // then); `bytes`: its expected length, 0 where the sender chose it.
  const char* Recv(size_t bytes);
  // Releases the message last taken, if it is still held.
  void Release();

 private:
  struct Header;
  struct Counter;
  char* Ring(int direction) const;
  void Await(Counter& counter, uint32_t target);
  void CheckPeer(std::chrono::steady_clock::time_point start);

  SharedSegment segment_;
  Header* header_;
  int side_;
  ChannelWaiting waiting_;
  uint32_t sent_ = 0;     // position of this rank's next record in the ring it writes
  uint32_t taken_ = 0;    // position after the last record it took from the other ring
  bool holding_ = false;  // whether that record is still in use (see Recv)
};

}  // namespace horovod::gloo_backend
