// The engine: one object per initialised Horovod, owning the process sets (each with its backend,
// tensor queue and controller), the fusion buffer, the timeline and the background thread.
//
// The engine's own concerns are split over files: engine.cc is the start, the cycle and the
// handles; engine/pacing.cc when the background thread cycles, and caller execution;
// engine/thread_placement.cc where the background thread runs; engine/perform.cc executing a
// negotiated response list; engine/deadlock.cc the deadlock check across process sets;
// engine/process_sets.* the process-set registry. Building the communicators at init is
// backends/communicator_stack.*, naming lost peers common/liveness.*. What each operation does
// lives in csrc/collectives/, how memory is moved on each device in csrc/executors/, and the
// transports in csrc/backends/ (docs/engine.md: the floors and the includes allowed).
//
// Threading contract.
// - Caller threads (any Python thread): Start (rendezvous, backend and static process set creation
//   run here), Enqueue, GetHandle/ReleaseHandle, the process set queries, the timeline
//   switches, Shutdown and the read-only getters. Enqueue only takes a queue's mutex and wakes the
//   background thread; it never blocks on the network.
// - A cycle negotiates and executes the global set's requests, then those of every other set this
//   rank belongs to, in id order (the same order on every rank, so sets never deadlock). Every
//   cycle is a collective of the global set: each rank's cycles meet the other ranks' in order,
//   whichever thread runs them. One thread at a time runs cycles, holding cycle_mu_; only that
//   thread touches backends, controllers, executors and the fusion buffer after Start returns.
//   Registering and removing a process set are negotiated on the global set and carried out in a
//   cycle, at the same point of every rank's operation sequence.
// - The background thread runs a cycle at least every HOROVOD_CYCLE_TIME ms since the last cycle
//   of any thread (sooner when work is enqueued or a caller waits; less often while idle).
// - Caller execution (HOROVOD_CALLER_EXECUTION, on by default): a caller about to block on an
//   unfinished handle takes cycle_mu_ (waiting for another thread's cycle to end) and runs the
//   cycles itself until its handle is done (ExecuteWhileWaiting, through Wait). This saves the
//   two thread hand-offs (wake the background thread, wake the caller) that otherwise dominate a
//   small synchronous collective. When the caller's cycles stop making progress, it wakes the
//   background thread, which goes on, and waits. While a rank is busy (it submitted in the last 10 ms), Enqueue does not wake
//   the background thread: it looks once per cycle time for submitted operations that no caller
//   waits on (asynchronous gradients) and runs their cycle then. Off for MPI below
//   MPI_THREAD_SERIALIZED and once a GPU tensor was submitted on this rank (the GPU executors stay
//   on the background thread). Process sets make no difference: a cycle negotiates the global
//   set, then every other set of the rank, whichever thread runs it.
// - Where the background thread runs. HOROVOD_THREAD_AFFINITY pins it to the core of entry
//   [local_rank] for good. Otherwise, where this host's ranks are at least as many as the cores a
//   rank may use (no spare core: each rank's own thread keeps one busy), the background thread moves
//   before each of its cycles to the core on which an operation was last submitted
//   (HOROVOD_THREAD_FOLLOW_CALLER, on by default). Its collectives then take their time from the
//   core of the rank they serve, as a caller's own cycles do, and every rank pays for its own
//   share; left to the scheduler, a background thread woken by a peer's futex may be placed on
//   the core of the rank that woke it, which then pays for both (it falls behind and the others
//   wait for it). Where a rank has cores to spare, the scheduler places the thread (on an idle core).
//   Where no core is spare (whether the thread follows, is pinned or is placed by the scheduler)
//   and the cycle time is the default (not set by the user, not autotuned), it looks for
//   operations that no caller waits on every kBusyHostPollPeriod (10 ms) instead of every cycle
//   time: fewer cycles, each taking a core from the training and waking the peers, with larger
//   fused operations. A waiting caller still runs its cycle at once (caller
//   execution); a peer that submitted the operation without waiting on it joins within 10 ms.
// - The cycle ends for good when any rank asked for shutdown (the flag travels with negotiation of
//   the global set, so every rank stops in the same cycle), when the stall inspector gives up, or
//   when a backend fails (a peer was lost). Then every queue is closed: pending and later
//   operations fail with an error saying why.
#pragma once

#include <sched.h>

#include <atomic>
#include <chrono>
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
#include <utility>
#include <vector>

#include "backends/communicator_stack.h"
#include "common/config.h"
#include "common/store.h"
#include "common/tensor_queue.h"
#include "common/timeline.h"
#include "engine/autotune/parameter_manager.h"
#include "engine/controller.h"
#include "engine/flight_recorder.h"
#include "engine/process_sets.h"
#include "executors/device_executor.h"

namespace horovod {

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

  // Checks `requests` (each collective's CheckRequest, csrc/collectives/), registers a new handle
  // for `entries` and queues their requests on process set `process_set_id`; returns the handle
  // (handles come from one counter per engine: 1, 2, 3, ...). Throws EngineError: INVALID_ARGUMENT
  // for caller mistakes (unknown set, not a member, root or splits not matching the set, ...),
  // another type where the collective says so, or the shutdown/failure status once the engine has
  // stopped.
  // `stream`: GPU tensors, the framework's stream (a cudaStream_t) the tensors were produced on;
  // their ready events are recorded on it here (executors/device_executor.h).
  int64_t Enqueue(int32_t process_set_id, std::vector<Request> requests, std::vector<TensorTableEntry> entries,
                  intptr_t stream = 0);
  // Returns the state of a handle, or nullptr when the handle is unknown.
  std::shared_ptr<HandleState> GetHandle(int64_t handle);
  // Called by a thread about to block on an unfinished handle: the background thread stops
  // gathering submissions and starts a cycle at once.
  void NotifyWaiting();
  // Caller execution (see the threading contract above). Called by a caller about to block on the
  // unfinished handle `state`, without the GIL: when caller execution is on, takes the cycle lock
  // (waiting for another thread's cycle to end, at most `budget`) and runs cycles on this thread
  // until the handle is done, a cycle executed nothing and
  // took less than a quarter of the cycle time (every rank waits on another: the background
  // thread paces the retries), or `budget` has passed. Returns whether the handle is done; when
  // not, the caller calls NotifyWaiting and waits. Never throws: a failure in a cycle ends the
  // engine exactly as on the background thread (every pending operation fails with the reason).
  bool ExecuteWhileWaiting(HandleState& state, std::chrono::milliseconds budget);
  // How a caller waits on the unfinished handle `state` (between WaitStarted and WaitEnded), in
  // rounds of `budget`: ExecuteWhileWaiting, and when the handle is not done, NotifyWaiting and a
  // wait of up to `budget` for another thread to complete it. Returns whether the handle is done;
  // a caller that waits longer calls it again.
  bool Wait(HandleState& state, std::chrono::milliseconds budget);
  // Brackets a caller's blocking wait on an unfinished handle of set `process_set_id`: while some
  // caller waits, this rank counts as waiting on the set (deadlock detection, controller.h).
  void WaitStarted(int32_t process_set_id);
  void WaitEnded(int32_t process_set_id);
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

  // Writes the flight recorder to `<dir>/flight_recorder_rank_<rank>.json` ("": the configured
  // HOROVOD_FLIGHT_RECORDER_DIR) with `reason` in its header; returns the path. Throws
  // EngineError(INVALID_ARGUMENT) when the recorder is off (HOROVOD_FLIGHT_RECORDER_SIZE=0), no
  // directory is given or configured, or the file cannot be written.
  std::string DumpFlightRecorder(const std::string& dir, const std::string& reason);

  // Negotiation counters of the global set.
  NegotiationStats GlobalStats();
  // Cycles run by waiting callers instead of the background thread (caller execution).
  int64_t caller_cycles() const { return caller_cycles_.load(); }
  // The background thread's id (gettid) and the core it is bound to now (-1: not bound), see
  // "Where the background thread runs" above.
  int64_t background_thread_id() const { return background_tid_.load(); }
  int background_cpu() const { return background_cpu_.load(); }
  // The parameters in force (autotune may change them; the same on every rank from the cycle
  // they were broadcast in).
  TunedParameters CurrentParameters();
  // Whether the global set's collectives go through shared memory (csrc/backends/shm/shared_memory.h).
  bool shared_memory() const { return stack_.shared_memory; }
  bool shared_memory_single_copy() const { return stack_.shared_memory_single_copy; }
  // Hierarchical collectives of the global set (backends/communicator_stack.h).
  using HierarchicalStats = horovod::HierarchicalStats;
  HierarchicalStats hierarchical_stats() const { return HierarchicalStatsOf(stack_); }
  // Hosts the ranks are grouped into (by HOROVOD_HOSTNAME when set, else gethostname()).
  int num_hosts() const { return stack_.num_hosts; }
  int local_channels() const { return stack_.local_channels; }

  const Config& config() const { return config_; }
  bool is_homogeneous() const { return stack_.homogeneous; }
  const char* backend_name() const { return stack_.backend_name; }
  bool mpi_threads_supported();

 private:
  explicit Engine(const Config& config);
  void BackgroundLoop();
  // The background thread's end, once a cycle stopped the engine (engine.cc).
  void CloseAfterStop();
  // Thread placement (thread_placement.cc). HOROVOD_THREAD_AFFINITY: this rank's core (entry
  // [local_rank]), or -1 when unset; throws EngineError(INVALID_ARGUMENT) for a core this process
  // may not run on.
  static int ThreadAffinity(const Config& config);
  // At start: the core to pin to (`pinned_cpu`), whether to follow the caller, the polling period.
  void PlaceBackgroundThread(int pinned_cpu);
  // First thing on the background thread: its id, name and starting cores; pins it if asked to.
  void BackgroundThreadStarted();
  // Binds the calling (background) thread to core `cpu`; false if the kernel refuses.
  bool BindBackgroundThread(int cpu);
  // Binds the background thread to the core of the last submission, if it is not there already.
  void FollowCaller();
  // Whether this rank is stuck across process sets at `now` (deadlock.cc; cycle_mu_).
  bool StuckAcrossSets(std::chrono::steady_clock::time_point now);
  // One cycle, begun at `now`; false once the engine must stop.
  bool RunCycle(std::chrono::steady_clock::time_point now);
  // RunCycle and its bookkeeping, by the thread holding cycle_mu_. A cycle that ends the engine
  // (a shutdown, a failure) sets stopped_ and stop_status_ and returns false.
  bool CycleLocked(std::chrono::steady_clock::time_point start);
  // Caller execution is on and no GPU tensor was submitted on this rank.
  bool CallerExecutionUsable() const;
  void Wake();
  void RequestShutdown(const std::string& reason);
  void PerformAll(ProcessSet& set, const ResponseList& list);
  // `negotiated_us`: when the list arrived (WallMicros; 0 when the flight recorder is off).
  void Perform(ProcessSet& set, const Response& response, int64_t negotiated_us);
  // Autotune: puts `parameters` in force on this rank (every controller, the cycle time).
  void ApplyParameters(const TunedParameters& parameters);
  void ConfigureController(Controller& controller);
  // Host name of each global rank (empty for a single process).
  std::vector<std::string> Hosts() const;
  size_t CacheCapacity(const TunedParameters& parameters) const;

  Config config_;
  std::unique_ptr<Store> store_;
  CommunicatorStack stack_;  // the global communicator itself belongs to the global process set
  std::unique_ptr<ProcessSetRegistry> sets_;
  Executors executors_;
  Timeline timeline_;
  bool timeline_enabled_ = false;
  std::unique_ptr<FlightRecorder> recorder_;
  // Entries failed by error responses of the list being performed, and the messages (background thread).
  std::vector<std::pair<TensorTableEntry, std::string>> failed_;

  std::atomic<int64_t> last_handle_{0};
  std::mutex handles_mu_;
  std::unordered_map<int64_t, std::shared_ptr<HandleState>> handles_;

  // Held by the thread running a cycle: the background thread, or a waiting caller.
  std::timed_mutex cycle_mu_;
  std::atomic<int> callers_executing_{0};  // callers in ExecuteWhileWaiting
  bool stopped_ = false;  // (cycle_mu_) no cycle runs again; stop_status_ is what pending work fails with
  Status stop_status_;
  bool caller_execution_ = false;        // set in Start
  std::atomic<bool> gpu_submitted_{false};  // a GPU tensor was enqueued on this rank
  std::atomic<int64_t> caller_cycles_{0};

  std::mutex wake_mu_;
  std::condition_variable wake_cv_;
  bool wake_ = false;     // a submission (or a shutdown request) arrived since the last cycle
  bool waiting_ = false;  // a caller blocked on an unfinished handle since the last cycle
  // Submissions so far; while the background thread gathers a burst (coalescing_), Enqueue only
  // counts instead of waking it each time.
  std::atomic<uint64_t> submissions_{0};
  // HOROVOD_THREAD_FOLLOW_CALLER in force (Start): Enqueue records the core it runs on, and the
  // background thread moves there before its next cycle (FollowCaller).
  std::atomic<bool> follow_caller_{false};
  std::atomic<int> submit_cpu_{-1};
  // The least period at which the background thread polls for asynchronous work (Start):
  // kBusyHostPollPeriod where the host has no core to spare and the cycle time is the default
  // (neither set by the user nor autotuned), else 0 (the cycle time).
  std::chrono::microseconds busy_poll_period_{0};
  int pinned_cpu_ = -1;  // HOROVOD_THREAD_AFFINITY's core for this rank (-1: none)
  std::atomic<int64_t> background_tid_{0};  // the background thread's id (gettid)
  std::atomic<int> background_cpu_{-1};  // the core it is bound to (-1: any); written by itself only
  cpu_set_t started_cpus_{};  // (background thread) the cores it may use as started
  std::atomic<bool> coalescing_{false};
  // While the background thread polls the queues (caller execution), Enqueue does not wake it.
  std::atomic<bool> polling_{false};
  // When the last cycle began (steady_clock ticks), whichever thread ran it.
  std::atomic<int64_t> last_cycle_start_{std::chrono::steady_clock::now().time_since_epoch().count()};
  bool progress_ = false;  // the current cycle executed at least one response (cycle_mu_)
  // Deadlocks across process sets (cycle_mu_): when this rank last executed or
  // submitted something, and the submission count seen then.
  std::chrono::steady_clock::time_point last_activity_ = std::chrono::steady_clock::now();
  uint64_t seen_submissions_ = 0;
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

// Text of the error every pending and later operation gets after a shutdown.
extern const char* const kShutdownMessage;

}  // namespace horovod
