// The engine: one object per initialised Horovod, owning the process sets (each with its backend,
// tensor queue and controller), the fusion buffer, the timeline and the background thread.
//
// Threading contract.
// - Caller threads (any Python thread): Start (rendezvous, backend and static process set creation
//   run here), NewHandle, Enqueue, GetHandle/ReleaseHandle, the process set queries, the timeline
//   switches, Shutdown and the read-only getters. Enqueue only takes a queue's mutex and wakes the
//   background thread; it never blocks on the network.
// - The background thread runs cycles: it waits at most HOROVOD_CYCLE_TIME ms (less when work is
//   enqueued), then negotiates and executes the global set's requests, then those of every other
//   set this rank belongs to, in id order (the same order on every rank, so sets never deadlock).
//   It is the only thread that touches backends, controllers and the fusion buffer after Start
//   returns. Registering and removing a process set are negotiated on the global set and carried
//   out by this thread, at the same point of every rank's operation sequence.
// - The cycle ends for good when any rank asked for shutdown (the flag travels with negotiation of
//   the global set, so every rank stops in the same cycle), when the stall inspector gives up, or
//   when a backend fails (a peer was lost). Then every queue is closed: pending and later
//   operations fail with an error saying why.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "autotune/parameter_manager.h"
#include "backends/communicator.h"
#include "backends/nccl/gpu_ops.h"
#include "config.h"
#include "controller.h"
#include "fusion.h"
#include "store.h"
#include "tensor_queue.h"
#include "timeline.h"

namespace horovod {

struct HierarchicalState;

// Where the rows of tensor `t` of an allgather response come from: bytes from each rank of the
// set (first dimensions in response.tensor_sizes[t * size + r]) and the gathered shape.
struct AllgatherLayout {
  std::vector<int64_t> bytes_per_rank;
  std::vector<int64_t> shape;
  int64_t bytes = 0;  // of the whole output
};
AllgatherLayout MakeAllgatherLayout(const Response& response, size_t t, const TensorView& input, int size);

// The bytes this rank (`me`) sends to and receives from each rank of an alltoall response, the
// received shape, and the received splits (rows per sender) as the host array the caller gets.
struct AlltoallLayout {
  std::vector<int64_t> send_bytes, recv_bytes;
  std::vector<int64_t> shape;
  int64_t bytes = 0;  // received in all
  std::shared_ptr<OutputBuffer> received_splits;
};
AlltoallLayout MakeAlltoallLayout(const Response& response, const TensorView& input, int size, int me);

// How a reducescatter splits a tensor of dim0 rows among the ranks of the set: counts[r] elements
// for rank r (rank r gets dim0 / size rows, one more when r < dim0 % size), this rank's (`me`)
// first element, and the shape of its part.
struct ReducescatterLayout {
  std::vector<int64_t> counts;
  int64_t offset = 0;
  std::vector<int64_t> shape;
};
ReducescatterLayout MakeReducescatterLayout(const TensorView& input, int size, int me);

// A registered process set. Members have a backend (communicator) and a controller.
struct ProcessSet {
  int32_t id = 0;
  std::vector<int> ranks;  // global ranks, sorted
  int set_rank = -1;       // this process's rank in the set; -1 when not a member
  std::unique_ptr<Communicator> backend;
  std::unique_ptr<Controller> controller;
  TensorQueue queue;
  // The NCCL communicator of the members, created by the first GPU operation on the set, and the
  // device it runs on (background thread only).
  std::unique_ptr<Communicator> gpu_communicator;
  int gpu_device = -1;
};

class Engine {
 public:
  // Creates the global communicator named by the config (rendezvous through `store`; null for a
  // single process), the static process sets `process_sets` (ids 1, 2, ... in order; every rank
  // must pass the same lists), and starts the background thread. Throws EngineError or
  // std::exception on failure.
  // MPI only: `mpi_comm` (an mpi4py communicator handle, 0 for none) or `mpi_ranks` (ranks of
  // MPI_COMM_WORLD) restrict Horovod to a sub-communicator.
  static std::unique_ptr<Engine> Start(const Config& config, std::unique_ptr<Store> store,
                                       const std::string& key_prefix,
                                       const std::vector<std::vector<int>>& process_sets, intptr_t mpi_comm = 0,
                                       const std::vector<int>& mpi_ranks = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Handles come from one counter per engine: 1, 2, 3, ...
  int64_t NewHandle() { return ++last_handle_; }
  // Registers `handle` for `entries` and queues their requests on process set `process_set_id`.
  // Throws EngineError: INVALID_ARGUMENT for caller mistakes (unknown set, not a member, root or
  // splits not matching the set), or the shutdown/failure status once the engine has stopped.
  void Enqueue(int32_t process_set_id, int64_t handle, std::vector<Request> requests,
               std::vector<TensorTableEntry> entries);
  // Returns the state of a handle, or nullptr when the handle is unknown.
  std::shared_ptr<HandleState> GetHandle(int64_t handle);
  // Called by a thread about to block on an unfinished handle: the background thread stops
  // gathering submissions and starts a cycle at once.
  void NotifyWaiting();
  void ReleaseHandle(int64_t handle);

  // Asks every rank to stop (through negotiation), waits for the background thread, and fails
  // whatever is still pending. Safe to call more than once.
  void Shutdown();

  // Process sets. Throw EngineError(INVALID_ARGUMENT) for an unknown set, or (rank) a non-member.
  std::map<int32_t, std::vector<int>> ProcessSetRanks();
  int ProcessSetRank(int32_t id);
  int ProcessSetSize(int32_t id);

  // Timeline (written on global rank 0 only). Throw EngineError(INVALID_ARGUMENT) when the
  // timeline was not enabled at init (HOROVOD_TIMELINE unset).
  void StartTimeline(const std::string& path, bool mark_cycles);
  void StopTimeline();

  // Negotiation counters of the global set.
  NegotiationStats GlobalStats();
  // The parameters in force (autotune may change them; the same on every rank from the cycle
  // they were broadcast in).
  TunedParameters CurrentParameters();
  // Whether the global set's collectives go through shared memory (csrc/backends/shm/shared_memory.h).
  bool shared_memory() const { return shared_memory_; }
  bool shared_memory_single_copy() const { return shared_memory_single_copy_; }
  // Hierarchical collectives (csrc/backends/hierarchical/hierarchical.h): whether the global set has them (a
  // multi-host homogeneous job that asked for them or autotunes them), whether each is switched
  // on now, how many ran, and whether their steps within a host go through shared memory.
  struct HierarchicalStats {
    bool available = false, allreduce = false, allgather = false, local_shared_memory = false;
    int64_t allreduces = 0, allgathers = 0;
  };
  HierarchicalStats hierarchical_stats() const;
  // Hosts the ranks are grouped into (by HOROVOD_HOSTNAME when set, else gethostname()).
  int num_hosts() const { return num_hosts_; }

  const Config& config() const { return config_; }
  bool is_homogeneous() const { return homogeneous_; }
  const char* backend_name() const { return backend_name_; }
  bool mpi_threads_supported();

 private:
  explicit Engine(const Config& config);
  std::shared_ptr<ProcessSet> FindSet(int32_t id);
  // Collective over the global set: creates set `id` of `ranks`.
  void CreateProcessSet(int32_t id, const std::vector<int>& ranks);
  void BackgroundLoop();
  bool RunCycle();
  void RequestShutdown(const std::string& reason);
  void PerformAll(ProcessSet& set, const ResponseList& list);
  void Perform(ProcessSet& set, const Response& response);
  void PerformAllreduce(ProcessSet& set, const Response& response, std::vector<TensorTableEntry*>& entries);
  void PerformAllgather(ProcessSet& set, const Response& response, std::vector<TensorTableEntry*>& entries,
                        std::vector<std::vector<std::shared_ptr<OutputBuffer>>>& outputs);
  void PerformBroadcast(ProcessSet& set, const Response& response, std::vector<TensorTableEntry*>& entries);
  void PerformAlltoall(ProcessSet& set, const Response& response, std::vector<TensorTableEntry*>& entries,
                       std::vector<std::vector<std::shared_ptr<OutputBuffer>>>& outputs);
  void PerformReducescatter(ProcessSet& set, const Response& response, std::vector<TensorTableEntry*>& entries,
                            std::vector<std::vector<std::shared_ptr<OutputBuffer>>>& outputs);
  // GPU tensors (gpu_executor.cc): the same operations through the NCCL plugin. Errors of CUDA
  // or NCCL are thrown as GpuError.
  void PerformGpu(ProcessSet& set, const Response& response, std::vector<TensorTableEntry*>& entries,
                  std::vector<std::vector<std::shared_ptr<OutputBuffer>>>& outputs);
  Communicator& GpuCommunicator(ProcessSet& set, int device);
  // Autotune: puts `parameters` in force on this rank (every controller, the cycle time).
  void ApplyParameters(const TunedParameters& parameters);
  size_t CacheCapacity(const TunedParameters& parameters) const;
  int64_t PerformAddProcessSet(const Response& response);
  int64_t PerformRemoveProcessSet(const Response& response);
  // Which ranks' processes are gone (same-host ranks are checked by pid), for the error message.
  std::string DescribeLostRanks();
  std::string Activity(const char* op) const;

  Config config_;
  std::unique_ptr<Store> store_;
  std::string key_prefix_;
  const char* backend_name_ = "";
  std::string allreduce_activity_;  // timeline name of the backend's allreduce, e.g. GLOO_ALLREDUCE
  bool homogeneous_ = true;
  bool shared_memory_ = false;  // the global set's collectives go through shared memory
  bool shared_memory_single_copy_ = false;  // ... and its large allreduces read peers' buffers directly
  // The switches and counters of the global set's backend when it is hierarchical (null when not);
  // ApplyParameters flips the switches.
  std::shared_ptr<HierarchicalState> hierarchical_;
  int num_hosts_ = 1;
  FusionBuffer fusion_buffer_;
  GpuOps* gpu_ = nullptr;  // the NCCL plugin, once a GPU tensor was executed (background thread only)
  Timeline timeline_;
  bool timeline_enabled_ = false;
  // Host name and pid of every global rank.
  std::vector<std::pair<std::string, int64_t>> peers_;

  std::mutex sets_mu_;  // guards the map (members are used by the background thread only)
  std::map<int32_t, std::shared_ptr<ProcessSet>> sets_;
  std::deque<int32_t> free_ids_;  // removed ids, reused oldest-freed first
  int32_t next_id_ = 1;
  int64_t sets_created_ = 0;  // names each set's rendezvous keys

  std::atomic<int64_t> last_handle_{0};
  std::mutex handles_mu_;
  std::unordered_map<int64_t, std::shared_ptr<HandleState>> handles_;

  std::mutex wake_mu_;
  std::condition_variable wake_cv_;
  bool wake_ = false;     // a submission (or a shutdown request) arrived since the last cycle
  bool waiting_ = false;  // a caller blocked on an unfinished handle since the last cycle
  // Submissions so far; while the background thread gathers a burst (coalescing_), Enqueue only
  // counts instead of waking it each time.
  std::atomic<uint64_t> submissions_{0};
  std::atomic<bool> coalescing_{false};
  bool progress_ = false;  // the current cycle executed at least one response (background thread only)
  std::atomic<bool> shutdown_requested_{false};
  std::mutex reason_mu_;
  std::string shutdown_reason_;  // why this rank asks to shut down ("" = hvd.shutdown())
  std::string exit_reason_;      // the verdict every pending operation fails with
  NegotiationStats global_stats_;
  std::mutex stats_mu_;
  // Autotune (spec core.md §12): the tuner (global rank 0 with HOROVOD_AUTOTUNE only) and the
  // parameters in force.
  std::unique_ptr<ParameterManager> parameter_manager_;
  std::mutex parameters_mu_;
  TunedParameters parameters_;
  std::atomic<int64_t> cycle_time_us_{1000};
  std::thread thread_;
};

// The backend a config selects: HOROVOD_CPU_OPERATIONS, else HOROVOD_CONTROLLER, else MPI when the
// process was started by an MPI launcher and the MPI backend is available, else Gloo.
std::string CpuBackendName(const Config& config);

// Text of the error every pending and later operation gets after a shutdown.
extern const char* const kShutdownMessage;

}  // namespace horovod
