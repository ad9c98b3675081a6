// Hierarchical collectives for jobs spanning several hosts (HOROVOD_HIERARCHICAL_ALLREDUCE,
// HOROVOD_HIERARCHICAL_ALLGATHER; spec core.md §7).
//
// Across hosts the flat ring of the global communicator sends every byte over the network once per
// rank. With L ranks on each host, the hierarchical allreduce instead
//   1. reduces the buffer among the L ranks of each host (through shared memory when it is
//      available), leaving local rank l in charge of shard l (about count / L elements);
//   2. allreduces shard l among the ranks with local rank l on every host (the "cross"
//      communicators, one per local rank, each with one rank per host), so the L shards cross the
//      network in parallel, each 1/L of the buffer;
//   3. allgathers the reduced shards among the ranks of each host.
// The hierarchical allgather exchanges each rank's block first among the ranks with the same local
// rank on every host (the cross communicator), then the gathered blocks among the ranks of each
// host, and finally puts the blocks in global rank order.
//
// HierarchicalBackend wraps the job's global communicator (a ForwardingCommunicator) and owns the
// local and cross communicators. It takes over Allreduce and Allgather while their switches are on
// (and then names their timeline activities HIERARCHICAL_ALLREDUCE, HIERARCHICAL_ALLGATHER);
// everything else (the controller's control plane, broadcast, alltoall, reducescatter, Adasum's
// point-to-point, and Split for other process sets) is forwarded to the global communicator, which
// stays the job's identity. The switches are plain flags, flipped by the engine from the
// parameters in force (autotune changes them on every rank at the same point of the operation
// sequence), so turning the path off costs nothing but a branch.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/communicator.h"
#include "common/reduction.h"

namespace horovod {

// How the ranks of a job are spread over hosts.
struct HostLayout {
  std::vector<std::vector<int>> hosts;  // global ranks of each host, sorted; hosts ordered by their first rank
  int host = 0;                         // index of this rank's host
  int local_rank = 0;                   // this rank's index in its host's list
  bool homogeneous = true;              // every host has the same number of ranks
};

// Groups global ranks by `host_of_rank[r]` (any string naming rank r's host). `rank`: this rank.
HostLayout GroupByHost(const std::vector<std::string>& host_of_rank, int rank);

// The switches and counters of a HierarchicalBackend, shared with the engine: the engine flips
// the switches from the parameters in force (background thread), and Python reads the counters
// from any thread, also after a failure has destroyed the backend.
struct HierarchicalState {
  std::atomic<bool> allreduce{false};
  std::atomic<bool> allgather{false};
  std::atomic<int64_t> allreduces{0};  // allreduces that went the hierarchical way
  std::atomic<int64_t> allgathers{0};
  bool local_shared_memory = false;    // the steps within a host go through shared memory
};

class HierarchicalBackend : public ForwardingCommunicator {
 public:
  // Collective over `global`: creates the local communicator of this rank's host (a
  // SharedMemoryBackend over it when `shared_memory` and every local rank can attach; `pids[r]` is
  // the process id of global rank r) and the cross communicator of this rank's local rank, through
  // global.Split under options.key_prefix + "hier.". `layout` must be homogeneous with more than one
  // host, and the same on every rank. Takes ownership of `global`. Throws std::exception when a
  // communicator cannot be created.
  // `state`: the switches (read at every call) and counters; local_shared_memory is set here.
  HierarchicalBackend(std::unique_ptr<Communicator> global, const HostLayout& layout, const std::vector<int64_t>& pids,
                      const BackendOptions& options, bool shared_memory, bool single_copy,
                      std::shared_ptr<HierarchicalState> state);

  // "ALLREDUCE" and "ALLGATHER" are HIERARCHICAL_ALLREDUCE and HIERARCHICAL_ALLGATHER while their
  // switch is on; everything else is the global communicator's activity.
  std::string Activity(const char* op) const override;
  // The fused allreduce without a fusion buffer is not offered: this backend's own Allreduce is
  // the one that must run.
  bool SupportsPieces(int64_t, size_t) const override { return false; }
  void Allreduce(const AllreduceOptions& options) override;
  // bfloat16 accumulated in float32 (collectives/float32_accumulation.h) in the same three steps:
  // the host's ranks reduce in float32, each shard is reduce-scattered in float32 across the hosts,
  // each rank rounds its block of it once and allgathers it in bfloat16 across the hosts, then the
  // shards are allgathered within the host. Across hosts that is 0.75 of the float32 hierarchical
  // allreduce's bytes. While the switch is off, the global communicator's own (false: none).
  bool AllreduceBfloat16InFloat32(uint16_t* buffer, int64_t count, ReduceOp op, float prescale,
                                  float postscale) override;
  void Allgather(const AllgatherOptions& options) override;

 private:
  // The global communicator (ForwardingCommunicator's inner one).
  Communicator& global() const { return inner(); }
  // Step 1 of an allreduce of `count` elements of `buffer` in shards of `counts` elements: the
  // host's ranks reduce, local rank l ending with shard l reduced (with shared memory, every shard).
  void ReduceWithinHost(void* buffer, int64_t count, const std::vector<int64_t>& counts, DataType dtype, ReduceOp op);
  // Step 3: every local rank's shard, which it holds in shard_, gathered into `buffer`.
  void GatherWithinHost(void* buffer, const std::vector<int64_t>& counts, size_t element);

  HostLayout layout_;
  int local_size_ = 1;
  // Ranks of this host (null when each host has one rank: step 1 and 3 are then no-ops).
  std::unique_ptr<Communicator> local_;
  // Ranks with this rank's local rank, one per host (owned unless it is the global backend itself,
  // which it is when each host has one rank).
  std::unique_ptr<Communicator> cross_owned_;
  Communicator* cross_ = nullptr;
  // cross_groups_[l][c]: global rank of member c of the cross communicator of local rank l.
  std::vector<std::vector<int>> cross_groups_;
  std::shared_ptr<HierarchicalState> state_;
  std::vector<char> shard_;    // allreduce: this rank's reduced shard, the input of step 3
  Float32Staging wide_;        // bfloat16 allreduce: the float32 values
  std::vector<char> group_;    // allgather: the blocks of this rank's cross group, the input of step 2
  std::vector<char> blocks_;   // allgather: every rank's block, grouped by local rank then host
};

}  // namespace horovod
