// The Gloo backend: TCP full meshes built through the rendezvous store. Allreduce, reduce-scatter,
// broadcast and the control plane go over a mesh whose sockets the calling thread drives itself
// (sync_mesh.h), with the algorithms of allreduce_*.h; allgather, alltoall, barrier and Adasum's
// exchanges use Gloo's own algorithms on the other. Between ranks of one host, the synchronous
// mesh's messages go through shared memory instead of TCP (shm_channel.h).
//
// The files of this folder, from the bottom up: tuning.h (message sizes and crossovers), peers.h
// (what an algorithm sees of a transport), tcp_sockets.* and store_adapter.h (Gloo's TCP pairs and
// rendezvous), shm_channel.* (a pair's shared-memory channel), cross_memory.* (process_vm_readv
// between ranks of a host), allreduce_one_step.*, allreduce_ring.* (with the reduce-scatter),
// allreduce_halving_doubling.*, sync_mesh.* and control_plane.cc (the transport), and this file.
#include <gloo/allgatherv.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/communicator.h"
#include "backends/gloo/allreduce_ring.h"
#include "backends/gloo/store_adapter.h"
#include "backends/gloo/sync_mesh.h"
#include "backends/gloo/tuning.h"
#include "backends/registry.h"

namespace horovod {
namespace {

using gloo_backend::kPeerSlotPrefix;
using gloo_backend::StoreAdapter;
using gloo_backend::SyncMesh;

class GlooBackend : public Communicator {
 public:
  explicit GlooBackend(const BackendOptions& options) : GlooBackend(options, nullptr) {}

  // `device` is shared by the communicators of one engine (the process sets); null: create one.
  GlooBackend(const BackendOptions& options, std::shared_ptr<gloo::transport::Device> device)
      : Communicator(options.rank, options.size), timeout_(options.timeout), device_(std::move(device)) {
    if (!device_) {
      gloo::transport::tcp::attr attr;
      if (!options.gloo.iface.empty()) {
        attr.iface = options.gloo.iface;
      } else {
        attr.hostname = options.gloo.hostname;
      }
      device_ = gloo::transport::tcp::CreateDevice(attr);
    }
    auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
    context->setTimeout(timeout_);
    if (size_ > 1) {
      StoreAdapter store(*options.store, options.key_prefix);
      context->connectFullMesh(store, device_);
      sync_ = std::make_unique<SyncMesh>(rank_, size_, timeout_, *options.store, options.key_prefix + "sync/", device_,
                                         options.gloo.busy_poll, options.gloo.spin, options.gloo.cross_memory,
                                         options.gloo.local_channel);
    } else {
      horovod::MemoryStore memory;
      StoreAdapter store(memory, options.key_prefix);
      context->connectFullMesh(store, device_);
    }
    context_ = std::move(context);
  }

  const char* name() const override { return "gloo"; }
  int local_channels() const override { return size_ > 1 ? sync_->local_channels() : 0; }

  std::vector<std::vector<char>> Gatherv(const std::vector<char>& data, int root) override {
    if (size_ == 1) return {data};
    return sync_->Gatherv(data, root);
  }

  // The cache round without data.
  void AllreduceBitsAnd(std::vector<uint64_t>& words) override {
    if (size_ > 1) sync_->AllreduceBitsAndEager(words, {});
  }

  int64_t EagerAllreduceBytes() const override { return size_ > 1 ? sync_->one_step_bytes() : 0; }

  bool AllreduceBitsAndEager(std::vector<uint64_t>& words, const EagerAllreduceOptions& eager) override {
    return size_ > 1 && sync_->AllreduceBitsAndEager(words, eager);
  }

  void BroadcastBytes(std::vector<char>& data, int root) override {
    if (size_ > 1) sync_->BroadcastBytes(data, root);
  }

  void Allreduce(const AllreduceOptions& options) override {
    if (size_ > 1 && options.count > 0) sync_->Allreduce(options.buffer, options.count, options.dtype, options.op);
  }

  bool AllreduceBfloat16InFloat32(uint16_t* buffer, int64_t count, ReduceOp op, float prescale,
                                  float postscale) override {
    return size_ > 1 && sync_->AllreduceBfloat16InFloat32(buffer, count, op, prescale, postscale);
  }

  void Allgather(const AllgatherOptions& options) override {
    const std::vector<int64_t>& bytes_per_rank = options.bytes_per_rank;
    const void* input = options.input;
    void* output = options.output;
    if (size_ == 1) {
      if (bytes_per_rank[0] > 0) std::memcpy(output, input, bytes_per_rank[0]);
      return;
    }
    std::vector<size_t> counts(bytes_per_rank.begin(), bytes_per_rank.end());
    size_t total = 0;
    for (size_t c : counts) total += c;
    if (total == 0) return;
    gloo::AllgathervOptions opts(context_);
    opts.setTimeout(timeout_);
    // Gloo wants a non-null input even for an empty contribution.
    char dummy = 0;
    opts.setInput(counts[rank_] ? static_cast<char*>(const_cast<void*>(input)) : &dummy, counts[rank_]);
    opts.setOutput(static_cast<char*>(output), counts);
    gloo::allgatherv(opts);
  }

  void Broadcast(const BroadcastOptions& options) override {
    if (size_ > 1 && options.bytes > 0) sync_->Broadcast(options.buffer, options.bytes, options.root);
  }

  void Alltoall(const AlltoallOptions& options) override {
    const void* input = options.input;
    void* output = options.output;
    const std::vector<int64_t>& send_bytes = options.send_bytes;
    const std::vector<int64_t>& recv_bytes = options.recv_bytes;
    int64_t total_send = 0, total_recv = 0;
    for (int64_t b : send_bytes) total_send += b;
    for (int64_t b : recv_bytes) total_recv += b;
    if (size_ == 1) {
      if (total_send > 0) std::memcpy(output, input, send_bytes[0]);
      return;
    }
    // Gloo wants real buffers even where nothing moves.
    char dummy_in = 0, dummy_out = 0;
    gloo::AlltoallvOptions opts(context_);
    opts.setTimeout(timeout_);
    opts.setInput(total_send ? static_cast<char*>(const_cast<void*>(input)) : &dummy_in, send_bytes);
    opts.setOutput(total_recv ? static_cast<char*>(output) : &dummy_out, recv_bytes);
    gloo::alltoallv(opts);
  }

  // The ring's reduce-scatter phase (allreduce_ring.h): half the work of an allreduce.
  void Reducescatter(const ReducescatterOptions& options) override {
    if (size_ > 1 && options.count > 0) {
      gloo_backend::RingReduceScatter(*sync_, static_cast<char*>(options.buffer), options.counts, options.dtype,
                                      options.op);
    }
  }

  std::unique_ptr<Communicator> Split(const std::vector<int>& ranks, const BackendOptions& options) override {
    auto it = std::find(ranks.begin(), ranks.end(), rank_);
    if (it == ranks.end()) return nullptr;
    BackendOptions child = options;
    child.rank = static_cast<int>(it - ranks.begin());
    child.size = static_cast<int>(ranks.size());
    child.gloo.local_channel = false;  // the global mesh's channels only (shm_channel.h)
    return std::make_unique<GlooBackend>(child, device_);
  }

  void SendRecv(const SendRecvOptions& options) override {
    const int peer = options.peer;
    const int64_t send_bytes = options.send_bytes, recv_bytes = options.recv_bytes;
    auto slot = gloo::Slot::build(kPeerSlotPrefix, 0);
    std::unique_ptr<gloo::transport::UnboundBuffer> out, in;
    if (recv_bytes > 0) {
      in = context_->createUnboundBuffer(options.recv, static_cast<size_t>(recv_bytes));
      in->recv(peer, slot);
    }
    if (send_bytes > 0) {
      out = context_->createUnboundBuffer(const_cast<void*>(options.send), static_cast<size_t>(send_bytes));
      out->send(peer, slot);
    }
    if (out && !out->waitSend(timeout_)) throw std::runtime_error("timed out sending to rank " + std::to_string(peer));
    if (in && !in->waitRecv(timeout_)) throw std::runtime_error("timed out receiving from rank " + std::to_string(peer));
  }

  void Barrier() override {
    if (size_ == 1) return;
    gloo::BarrierOptions opts(context_);
    opts.setTimeout(timeout_);
    gloo::barrier(opts);
  }

 private:
  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  std::unique_ptr<SyncMesh> sync_;  // null when size_ == 1
};

const bool kRegistered = BackendRegistry::Register(
    "gloo", [](const BackendOptions& options) { return std::make_unique<GlooBackend>(options); });

}  // namespace
}  // namespace horovod
