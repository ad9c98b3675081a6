// The synchronous mesh: a second full mesh of TCP connections whose pairs Gloo runs in synchronous
// mode: the calling thread writes and reads the sockets itself, instead of handing each message to
// Gloo's event loop thread and waiting for it to wake the caller, and a message goes out at once
// into a buffer that the peer registered when the mesh was built, instead of after the
// notify/ready round trip that Gloo's unbound buffers take. A small collective then costs one
// network latency per step and no thread hand-off, and a large one keeps both directions of every
// link busy. It carries the control plane (the per-cycle AND, the gather of requests, the
// broadcast of responses; control_plane.cc), the allreduces and the broadcasts; one thread uses it
// at a time (the communicator's). Between ranks of one host, its messages go through
// shared-memory channels (shm_channel.h) instead of TCP, and halving and doubling's exchanges
// through cross-memory attach (cross_memory.h).
//
// Every message is at most kSyncChunkBytes; small ones are staged through the pair's own buffers,
// larger ones go straight from and to the caller's memory (kDirectBytes). In the allreduce a rank
// sends each step's messages before reading the step's arrivals, and cannot start a step before it
// has read every peer's message of the one before, which each peer sent only after reading all of
// the step before that: so at most two messages of a rank are unread by a peer at any time, and the
// two sockets' kernel buffers hold them without a writer blocking.
#pragma once

#include <gloo/context.h>
#include <gloo/transport/buffer.h>
#include <gloo/transport/device.h>
#include <gloo/transport/pair.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/communicator.h"
#include "backends/gloo/cross_memory.h"
#include "backends/gloo/peers.h"
#include "backends/gloo/shm_channel.h"
#include "common/reduction.h"
#include "common/store.h"

namespace horovod::gloo_backend {

class SyncMesh : public Peers {
 public:
  SyncMesh(int rank, int size, std::chrono::milliseconds timeout, horovod::Store& store, const std::string& prefix,
           std::shared_ptr<gloo::transport::Device> device, bool busy_poll, std::chrono::microseconds spin,
           bool cross_memory, bool local_channel);
  SyncMesh(const SyncMesh&) = delete;
  SyncMesh& operator=(const SyncMesh&) = delete;
  ~SyncMesh() override = default;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void Send(int peer, const void* data, size_t bytes) override;
  // `bytes` 0: a staged message of a length the sender chose (framing).
  const char* Recv(int peer, size_t bytes) override;
  void RecvInto(int peer, void* into, size_t bytes) override;
  CrossMemoryPeer* cross_memory(int peer) override { return host_peers_.cross_memory(peer); }

  // How many peers this rank reaches through a shared-memory channel.
  int local_channels() const;
  // Allreduces up to this many bytes take one step (and may be carried by the cache round).
  int64_t one_step_bytes() const { return static_cast<int64_t>(one_step_bytes_); }

  // In-place allreduce of `count` elements. Up to one_step_bytes() each rank sends its data to
  // every other and reduces all of it in rank order (allreduce_one_step.h, the same bits as the
  // shared-memory transport); beyond, at a power-of-two number of ranks, recursive halving and
  // doubling, and at other numbers the ring. All leave the same bits on every rank. (Two steps at
  // more than two ranks, each rank sending a block to every other, took 2-4 times as long as the
  // ring for 64-512 KiB at 2 hosts x 2 ranks on the test bed: every rank's messages arrive at once
  // from all its peers.)
  void Allreduce(void* buffer, int64_t count, DataType dtype, ReduceOp op);
  // In-place bfloat16 allreduce of `count` elements accumulated in float32 and rounded once
  // (collectives/float32_accumulation.h): up to one_step_bytes() of float32 in one step (then every
  // rank rounds the same float32 reduction), beyond at a power-of-two number of ranks by recursive
  // halving and doubling (HalvingDoublingAllreduceBfloat16). Returns false, touching nothing, at
  // other numbers of ranks beyond one step.
  bool AllreduceBfloat16InFloat32(uint16_t* data, int64_t count, ReduceOp op, float prescale, float postscale);
  // `bytes` of `root`'s buffer on every rank, in messages of kSyncChunkBytes.
  void Broadcast(void* buffer, int64_t bytes, int root);

  // The control plane (control_plane.cc).
  bool AllreduceBitsAndEager(std::vector<uint64_t>& words, const EagerAllreduceOptions& eager);
  std::vector<std::vector<char>> Gatherv(const std::vector<char>& data, int root);
  void BroadcastBytes(std::vector<char>& data, int root);

 private:
  struct Peer {
    std::vector<char> out, in;  // staging, for messages under kDirectBytes
    std::vector<char> landing;  // direct messages this rank reduces, grown to the largest
    std::unique_ptr<gloo::transport::Buffer> send, recv;
    gloo::transport::Pair* pair = nullptr;
    int fd = -1;                // the pair's socket, only to poll it
    std::vector<char> round;    // the peer's last cache-round message (AllreduceBitsAndEager)
    std::unique_ptr<ShmChannel> channel;  // null: TCP
  };

  void SizeSendBuffers();
  void OpenChannels();
  // Framing: a byte string of any length: its length, then as much of it as fits, in the first
  // (staged) message, the rest in whole messages.
  static constexpr size_t kFrameHeader = sizeof(int64_t);
  void SendFramed(int peer, const std::vector<char>& data);
  std::vector<char> RecvFramed(int peer);
  void RecvFramed(int peer, std::vector<char>& bytes);
  void Post(int peer, size_t bytes);
  void RecvDirect(Peer& p, void* into, size_t bytes);
  void AwaitReadable(Peer& p, size_t bytes);

  int rank_, size_;
  size_t one_step_bytes_;
  std::chrono::microseconds spin_;
  bool busy_poll_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::Context> context_;  // declared before peers_: their buffers go first
  std::vector<Peer> peers_;
  std::vector<char> scratch_;
  Float32Staging wide_;  // AllreduceBfloat16InFloat32's float32 values
  std::vector<char> round_out_;  // this rank's cache-round message (AllreduceBitsAndEager)
  HostPeers host_peers_;
};

}  // namespace horovod::gloo_backend
