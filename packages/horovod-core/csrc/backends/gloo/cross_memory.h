// Cross-memory attach between ranks of one host: finding the ranks whose processes run on this
// host (HostPeers), probing whether this rank may read and write their memory, and the exchange of
// recursive halving and doubling done with process_vm_readv and process_vm_writev instead of
// messages (CrossMemoryExchange).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backends/gloo/peers.h"
#include "common/common.h"
#include "common/store.h"

namespace horovod::gloo_backend {

// A rank of this host whose memory this rank reads and writes.
struct CrossMemoryPeer {
  pid_t pid = 0;
  std::string host;          // this host's name, for errors
  uint64_t remote_data = 0;  // where the peer's data lies, in the allreduce under way
  std::vector<char> landing; // a piece of the peer's data, read to be reduced
};

// The ranks of a mesh that run on this host, and which of them allow cross-memory attach.
// Not movable: the peers read the probe word at its address.
class HostPeers {
 public:
  HostPeers() = default;
  HostPeers(const HostPeers&) = delete;
  HostPeers& operator=(const HostPeers&) = delete;

  // Collective over the store, while the mesh is built: every rank publishes its hostname, process
  // id, PID namespace and the address of a probe word under `prefix`, and notes the process of
  // every rank of its host (the same hostname and PID namespace). Where `cross_memory`, the
  // process first allows every other process of its user to read its memory (under Yama's
  // ptrace_scope=1 only a process's ancestors may otherwise).
  void Find(Store& store, const std::string& prefix, int rank, int size, bool cross_memory);

  // Collective over `peers`, after Find: finds the ranks of this host whose memory this rank can
  // read with process_vm_readv, and so write with process_vm_writev, which the kernel allows on
  // the same terms (same user, no seccomp or Yama restriction), by reading every such peer's probe
  // word; a pair uses cross-memory attach only when both of its ranks read the other's probe (each
  // tells every peer what it found).
  void EnableCrossMemory(Peers& peers);

  // Rank r's process where it runs on this host (0: elsewhere, or Find not called).
  pid_t pid(int r) const { return r < static_cast<int>(peers_.size()) ? peers_[r].pid : 0; }
  const std::string& host() const { return host_; }
  // Rank r's state for CrossMemoryExchange where EnableCrossMemory found it usable; else null.
  CrossMemoryPeer* cross_memory(int r) {
    return r < static_cast<int>(enabled_.size()) && enabled_[r] ? &peers_[r] : nullptr;
  }

 private:
  std::string host_;
  std::vector<CrossMemoryPeer> peers_;
  std::vector<uint64_t> probe_addresses_;
  std::vector<bool> enabled_;
  uint64_t probe_ = 0;  // read by the peers of this host
};

// The exchange of recursive halving and doubling (allreduce_halving_doubling.h) with a rank of this
// host whose memory this rank reads and writes. In the reduce-scatter (`reduce`) the two tell each
// other where their data lies, then each reads the elements it keeps, [keep_lo, keep_hi), straight
// from the other's data with process_vm_readv, a kCrossPieceBytes piece at a time, and reduces them
// (the lower rank's operand first). In the allgather, which meets the same partner later in the
// same allreduce, each writes its finished elements, [send_lo, send_hi), into the other's data at
// the same offsets with process_vm_writev, then says so, and neither returns (and lets its caller
// touch its data) before the other has said so. No rank reads or writes what another uses at the
// same time: the elements a rank reads from its partner in the reduce-scatter are those the
// partner gives up, which it no longer touches; the partner's elements a rank writes in the
// allgather are the same ones, which the rank itself read earlier and the partner waits for.
void CrossMemoryExchange(Peers& peers, int peer, CrossMemoryPeer& partner, char* data, int64_t send_lo,
                         int64_t send_hi, int64_t keep_lo, int64_t keep_hi, bool reduce, DataType dtype, ReduceOp op);

// Tells `peer` where this rank's data lies and learns where the peer's lies (partner.remote_data):
// the first thing the reduce-scatter's exchange does. An allreduce whose allgather moves another
// buffer than its reduce-scatter (a bfloat16 one after a float32 reduce-scatter) calls it with that
// buffer before the allgather; both ranks call it, in the same order of partners.
void CrossMemoryShareData(Peers& peers, int peer, CrossMemoryPeer& partner, const char* data);

}  // namespace horovod::gloo_backend
