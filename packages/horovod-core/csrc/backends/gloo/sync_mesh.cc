#include "backends/gloo/sync_mesh.h"

#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/address.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>

#include "backends/gloo/allreduce_halving_doubling.h"
#include "backends/gloo/allreduce_one_step.h"
#include "backends/gloo/allreduce_ring.h"
#include "backends/gloo/store_adapter.h"
#include "backends/gloo/tcp_sockets.h"
#include "backends/gloo/tuning.h"

namespace horovod::gloo_backend {

SyncMesh::SyncMesh(int rank, int size, std::chrono::milliseconds timeout, horovod::Store& store,
                   const std::string& prefix, std::shared_ptr<gloo::transport::Device> device, bool busy_poll,
                   std::chrono::microseconds spin, bool cross_memory, bool local_channel)
    : rank_(rank),
      size_(size),
      one_step_bytes_(size == 2 ? kPairExchangeBytes : kSyncExchangeBytes),
      spin_(busy_poll ? std::chrono::microseconds(0) : spin),
      busy_poll_(busy_poll),
      timeout_(timeout),
      scratch_(one_step_bytes_) {
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(timeout);
  StoreAdapter adapter(store, prefix);
  context->connectFullMesh(adapter, device);
  peers_.resize(size);
  std::map<std::string, int> sockets;
  if (spin_.count() > 0) sockets = SocketsByAddress();
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    auto& pair = context->getPair(r);
    // Synchronous before the buffer exists: a peer that is done building the mesh may already
    // be sending, and Gloo's event loop leaves a message for an unregistered buffer in the
    // socket, where this thread will read it; once registered, the loop would read it, and the
    // next, into the one staging buffer.
    pair->setSync(true, busy_poll);
    Peer& peer = peers_[r];
    peer.pair = pair.get();
    peer.out.resize(kDirectBytes);
    peer.in.resize(kDirectBytes);
    peer.send = pair->createSendBuffer(kSyncSlot, peer.out.data(), kDirectBytes);
    peer.recv = pair->createRecvBuffer(kSyncSlot, peer.in.data(), kDirectBytes);
    // The pair's socket, to poll; none found (or no polling): this peer's waits sleep at once.
    const auto* address = dynamic_cast<const gloo::transport::tcp::Address*>(&pair->address());
    auto socket = address ? sockets.find(AddressKey(address->getSockaddr())) : sockets.end();
    if (socket != sockets.end()) peer.fd = socket->second;
  }
  context_ = std::move(context);
  SizeSendBuffers();
  if (cross_memory || local_channel) host_peers_.Find(store, prefix, rank_, size_, cross_memory);
  if (local_channel) OpenChannels();
  if (cross_memory) host_peers_.EnableCrossMemory(*this);
}

// Collective, while the mesh is built: one kSendBufferBytes message to every peer and from it.
// Gloo sizes a socket's send buffer (SO_SNDBUF, which also ends the kernel's tuning of it) to
// the largest message sent so far, but only ever upwards: after 32 KiB messages it is 64 KiB
// (the kernel doubles what is asked), which a 64 KiB message, with the kernel's bookkeeping,
// overflows. Its writer then waits for the peer's acknowledgements, which the peer, writing its
// own message at the same moment, delays: on the test bed such allreduces stalled for
// milliseconds. This first message sizes every send buffer once for all (to kSendBufferBytes,
// or twice net.core.wmem_max where that is less), larger than any message the mesh sends later.
void SyncMesh::SizeSendBuffers() {
  std::vector<char> bytes(kSendBufferBytes);
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) Send(r, bytes.data(), bytes.size());
  }
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) RecvDirect(peers_[r], bytes.data(), bytes.size());
  }
}

// Collective, while the mesh is built (after HostPeers::Find): a shared-memory channel for every
// pair of ranks of one host, where the host has no more than kChannelMaxLocalRanks ranks of the
// mesh. The lower rank of a pair creates the segment and sends its name over TCP; the higher one
// maps it and answers whether it could; the lower one then removes the name from /dev/shm (both
// keep their mappings). A pair whose segment failed keeps TCP: /dev/shm full or missing is no
// error. Both ranks switch to the channel after this exchange, before their next message.
void SyncMesh::OpenChannels() {
  int local = 1;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_ && host_peers_.pid(r) > 0) ++local;
  }
  // Every rank of the host counts the same ranks, so they all decide alike.
  if (local < 2 || local > kChannelMaxLocalRanks) return;
  std::vector<std::string> names(size_);
  std::vector<SharedSegment> segments(size_);
  for (int r = rank_ + 1; r < size_; ++r) {
    if (host_peers_.pid(r) <= 0) continue;
    segments[r] = ShmChannel::CreateSegment(&names[r]);
    SendFramed(r, std::vector<char>(names[r].begin(), names[r].end()));
  }
  for (int r = 0; r < rank_; ++r) {
    if (host_peers_.pid(r) <= 0) continue;
    const std::vector<char> name = RecvFramed(r);
    if (!name.empty()) segments[r] = ShmChannel::OpenSegment(std::string(name.begin(), name.end()));
    const uint64_t ok = static_cast<bool>(segments[r]);
    Send(r, &ok, sizeof(ok));
  }
  for (int r = rank_ + 1; r < size_; ++r) {
    if (host_peers_.pid(r) <= 0) continue;
    uint64_t ok = 0;
    std::memcpy(&ok, Recv(r, sizeof(ok)), sizeof(ok));
    if (names[r].empty()) continue;
    SharedSegment::Unlink(names[r]);
    if (ok == 0) segments[r].Reset();
  }
  for (int r = 0; r < size_; ++r) {
    if (!segments[r]) continue;
    ChannelWaiting waiting{spin_, busy_poll_, timeout_, r, host_peers_.pid(r), host_peers_.host()};
    peers_[r].channel = std::make_unique<ShmChannel>(std::move(segments[r]), rank_ < r ? 0 : 1, std::move(waiting));
  }
}

int SyncMesh::local_channels() const {
  int n = 0;
  for (const Peer& p : peers_) n += p.channel != nullptr;
  return n;
}

void SyncMesh::Allreduce(void* buffer, int64_t count, DataType dtype, ReduceOp op) {
  char* data = static_cast<char*>(buffer);
  if (count * DataTypeSize(dtype) <= one_step_bytes()) {
    OneStepAllreduce(*this, data, count, dtype, op, scratch_);
  } else if ((size_ & (size_ - 1)) == 0) {
    HalvingDoublingAllreduce(*this, data, count, dtype, op);
  } else {
    RingAllreduce(*this, data, count, dtype, op);
  }
}

bool SyncMesh::AllreduceBfloat16InFloat32(uint16_t* data, int64_t count, ReduceOp op, float prescale,
                                          float postscale) {
  const bool one_step = count * static_cast<int64_t>(sizeof(float)) <= one_step_bytes();
  if (!one_step && (size_ & (size_ - 1)) != 0) return false;
  float* wide = wide_.Widen(data, count, prescale);
  if (!one_step) {
    HalvingDoublingAllreduceBfloat16(*this, data, wide, count, op, postscale);
    return true;
  }
  OneStepAllreduce(*this, reinterpret_cast<char*>(wide), count, DataType::FLOAT32, op, scratch_);
  NarrowToBfloat16(wide, count, postscale, data);
  return true;
}

void SyncMesh::Broadcast(void* buffer, int64_t bytes, int root) {
  char* data = static_cast<char*>(buffer);
  for (int64_t off = 0; off < bytes; off += kSyncChunkBytes) {
    const size_t len = static_cast<size_t>(std::min<int64_t>(kSyncChunkBytes, bytes - off));
    if (rank_ == root) {
      for (int r = 0; r < size_; ++r) {
        if (r != root) Send(r, data + off, len);
      }
    } else {
      RecvInto(root, data + off, len);
    }
  }
}

void SyncMesh::SendFramed(int peer, const std::vector<char>& data) {
  const int64_t total = static_cast<int64_t>(data.size());
  const size_t first = std::min(data.size(), kDirectBytes - kFrameHeader);
  char* out = peers_[peer].out.data();
  std::memcpy(out, &total, kFrameHeader);
  if (first > 0) std::memcpy(out + kFrameHeader, data.data(), first);
  Post(peer, kFrameHeader + first);
  for (size_t off = first; off < data.size(); off += kSyncChunkBytes) {
    Send(peer, data.data() + off, std::min(kSyncChunkBytes, data.size() - off));
  }
}

std::vector<char> SyncMesh::RecvFramed(int peer) {
  std::vector<char> bytes;
  RecvFramed(peer, bytes);
  return bytes;
}

// Into `bytes`, resized to the message (keeping its capacity).
void SyncMesh::RecvFramed(int peer, std::vector<char>& bytes) {
  const char* in = Recv(peer, 0);
  int64_t total = 0;
  std::memcpy(&total, in, kFrameHeader);
  bytes.resize(static_cast<size_t>(total));
  size_t got = std::min(bytes.size(), kDirectBytes - kFrameHeader);
  if (got > 0) std::memcpy(bytes.data(), in + kFrameHeader, got);
  for (; got < bytes.size(); got += kSyncChunkBytes) {
    RecvInto(peer, bytes.data() + got, std::min(kSyncChunkBytes, bytes.size() - got));
  }
}

void SyncMesh::Send(int peer, const void* data, size_t bytes) {
  Peer& p = peers_[peer];
  if (p.channel) return p.channel->Send(data, bytes);
  if (bytes >= kDirectBytes) {
    auto direct = p.pair->createSendBuffer(kDirectSlot, const_cast<void*>(data), bytes);
    direct->send(0, bytes);
    direct->waitSend();
    return;
  }
  std::memcpy(p.out.data(), data, bytes);
  Post(peer, bytes);
}

// Sends the first `bytes` of the peer's staging buffer.
void SyncMesh::Post(int peer, size_t bytes) {
  Peer& p = peers_[peer];
  if (p.channel) return p.channel->Send(p.out.data(), bytes);
  p.send->send(0, bytes);
  p.send->waitSend();
}

const char* SyncMesh::Recv(int peer, size_t bytes) {
  Peer& p = peers_[peer];
  if (p.channel) return p.channel->Recv(bytes);
  if (bytes >= kDirectBytes) {
    if (p.landing.size() < bytes) p.landing.resize(bytes);
    RecvDirect(p, p.landing.data(), bytes);
    return p.landing.data();
  }
  AwaitReadable(p, bytes);
  p.recv->waitRecv();
  return p.in.data();
}

void SyncMesh::RecvInto(int peer, void* into, size_t bytes) {
  Peer& p = peers_[peer];
  if (p.channel) {
    std::memcpy(into, p.channel->Recv(bytes), bytes);
    p.channel->Release();
    return;
  }
  if (bytes < kDirectBytes) {
    std::memcpy(into, Recv(peer, bytes), bytes);
    return;
  }
  RecvDirect(p, into, bytes);
}

// A message of `bytes` >= kDirectBytes, read by Gloo straight into `into`.
void SyncMesh::RecvDirect(Peer& p, void* into, size_t bytes) {
  AwaitReadable(p, bytes);
  auto direct = p.pair->createRecvBuffer(kDirectSlot, into, bytes);
  direct->waitRecv();
}

// Polls the peer's socket for up to spin_ when nothing has arrived yet (Gloo's read then sleeps),
// giving the core to any other runnable thread between polls: where the hosts' ranks share cores
// (2 hosts x 2 ranks on 2 cores), the thread that is about to send often waits for this one's.
// A message of more than kWholeMessageBytes (`bytes`; 0: unknown) that has begun to arrive is
// polled for, for up to kRestSpin more, until all of its payload is in the socket (SO_RCVLOWAT,
// which poll honours): Gloo's read would otherwise take the first segments and sleep until the
// next (each sleep costs a wake-up; a 256 KiB allreduce between two hosts took 3 times as long
// as when polling throughout).
void SyncMesh::AwaitReadable(Peer& p, size_t bytes) {
  if (p.fd < 0) return;
  pollfd ready{p.fd, POLLIN, 0};
  if (!PollFor(ready, spin_)) return;
  if (bytes <= kWholeMessageBytes) return;
  const int whole = static_cast<int>(bytes), one = 1;
  ::setsockopt(p.fd, SOL_SOCKET, SO_RCVLOWAT, &whole, sizeof(whole));
  PollFor(ready, std::min(spin_, kRestSpin));
  ::setsockopt(p.fd, SOL_SOCKET, SO_RCVLOWAT, &one, sizeof(one));
}

}  // namespace horovod::gloo_backend
