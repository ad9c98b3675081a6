#include "engine.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "backends/nccl/gpu_ops.h"
#include "collectives/collective.h"
#include "common/liveness.h"
#include "common/logging.h"

namespace horovod {

const char* const kShutdownMessage =
    "Horovod has been shut down. This was caused by an exception on one of the ranks or an attempt to "
    "run a collective operation after one of the ranks finished execution. If the shutdown was caused "
    "by an exception, you should see the exception in the log before the first shutdown message.";

namespace {

// A burst of submissions is over once none came for this long (see BackgroundLoop).
constexpr std::chrono::microseconds kQuietPeriod{50};
// Caller execution: while this rank submitted work in the last kActiveWindow, the background
// thread looks at the queues once per cycle time instead of being woken by each submission (see
// BackgroundLoop).
constexpr std::chrono::milliseconds kActiveWindow{10};
// Where a rank has no core to spare and the cycle time is the default, the background thread looks
// for asynchronous work at most this often while it polls (see BackgroundLoop).
constexpr std::chrono::milliseconds kBusyHostPollPeriod{10};

// HOROVOD_THREAD_AFFINITY (spec core.md §7): this rank's core (entry [local_rank]), or -1 when
// unset. Raises InvalidArgument for a core this process may not run on.
int ThreadAffinity(const Config& config) {
  if (config.thread_affinity.empty()) return -1;
  const int core = config.thread_affinity[static_cast<size_t>(config.local_rank)];
  cpu_set_t allowed;
  if (::sched_getaffinity(0, sizeof(allowed), &allowed) == 0 && !CPU_ISSET(core, &allowed)) {
    throw EngineError(Status::InvalidArgument(
        "HOROVOD_THREAD_AFFINITY gives local rank " + std::to_string(config.local_rank) + " core " +
        std::to_string(core) + ", which this process may not run on (its CPU affinity has " +
        std::to_string(CPU_COUNT(&allowed)) + " cores)."));
  }
  return core;
}

}  // namespace

std::unique_ptr<Engine> Engine::Start(const Config& config, std::unique_ptr<Store> store,
                                      const std::string& key_prefix,
                                      const std::vector<std::vector<int>>& process_sets, intptr_t mpi_comm,
                                      const std::vector<int>& mpi_ranks) {
  SetLogLevel(config.log_level, config.log_hide_time);
  const int pinned_cpu = ThreadAffinity(config);
  std::unique_ptr<Engine> engine(new Engine(config));
  Engine& e = *engine;
  e.pinned_cpu_ = pinned_cpu;
  // No core to spare: this host's ranks are at least as many as the cores a rank may use.
  cpu_set_t cpus;
  const int available = ::sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 0;
  const bool no_spare_core = available > 0 && available <= config.local_size;
  e.follow_caller_ = pinned_cpu < 0 && config.thread_follow_caller && no_spare_core;
  // A cycle time the user set, or autotune's, is kept as it is.
  if (no_spare_core && !config.cycle_time_fixed && !config.autotune) e.busy_poll_period_ = kBusyHostPollPeriod;
  HVD_LOG(DEBUG) << "background thread: " << available << " core(s) for " << config.local_size
                 << " rank(s) on this host; "
                 << (pinned_cpu >= 0        ? "pinned"
                     : e.follow_caller_     ? "follows the submitting thread's core"
                                            : "placed by the scheduler");
  e.store_ = store ? std::move(store) : std::make_unique<MemoryStore>();
  e.stack_ = BuildCommunicatorStack(e.config_, e.store_.get(), key_prefix, mpi_comm, mpi_ranks);
  TunedParameters& initial = e.parameters_;
  initial.fusion_threshold_bytes = config.fusion_threshold_bytes;
  initial.cycle_time_ms = config.cycle_time_ms;
  initial.cache_enabled = config.cache_capacity > 0;
  initial.hierarchical_allreduce = config.hierarchical_allreduce;
  initial.hierarchical_allgather = config.hierarchical_allgather;
  initial.torus_allreduce = config.torus_allreduce;
  initial.tuning = config.autotune;
  e.cycle_time_us_ = std::llround(config.cycle_time_ms * 1000);
  if (config.autotune && e.config_.rank == 0) {
    e.parameter_manager_ = std::make_unique<ParameterManager>(e.config_, initial, e.stack_.hierarchical != nullptr);
  }
  Timeline* timeline = e.config_.rank == 0 ? &e.timeline_ : nullptr;
  e.sets_ = std::make_unique<ProcessSetRegistry>(e.config_, e.store_.get(), key_prefix, timeline,
                                                 [&e](Controller& controller) { e.ConfigureController(controller); });
  e.sets_->CreateGlobal(std::move(e.stack_.global));
  const std::vector<std::string> hosts = e.Hosts();
  e.sets_->Find(0)->controller->SetHosts(hosts);
  e.sets_->CreateStatic(process_sets);
  e.recorder_ = std::make_unique<FlightRecorder>(static_cast<size_t>(config.flight_recorder_size),
                                                 config.flight_recorder_dir, e.config_.rank, e.config_.size,
                                                 hosts.empty() ? e.config_.hostname : hosts[e.config_.rank]);

  e.timeline_enabled_ = !config.timeline.empty();
  if (e.timeline_enabled_ && config.timeline != "DYNAMIC" && e.config_.rank == 0) {
    e.timeline_.Start(config.timeline, config.timeline_mark_cycles);
  }
  // Caller execution needs a backend that any thread may drive (one at a time).
  // (The global set's communicator speaks for the backend; a single process has none.)
  const std::shared_ptr<ProcessSet> global = e.sets_->Find(0);
  e.caller_execution_ = config.caller_execution && (!global->communicator || global->communicator->any_thread());
  e.thread_ = std::thread(&Engine::BackgroundLoop, &e);
  HVD_LOG(INFO) << "Horovod initialized: rank " << e.config_.rank << " of " << e.config_.size << ", backend "
                << e.stack_.backend_name << (e.stack_.shared_memory ? " with shared memory" : "")
                << (e.stack_.hierarchical ? " with hierarchical collectives" : "");
  return engine;
}

Engine::Engine(const Config& config) : config_(config), executors_(config_) {}

Engine::~Engine() { Shutdown(); }

std::map<int32_t, std::vector<int>> Engine::ProcessSetRanks() { return sets_->Ranks(); }

int Engine::ProcessSetRank(int32_t id) { return sets_->RequireMember(id)->set_rank; }

int Engine::ProcessSetSize(int32_t id) { return static_cast<int>(sets_->Require(id)->ranks.size()); }

void Engine::StartTimeline(const std::string& path, bool mark_cycles) {
  if (!timeline_enabled_) {
    throw EngineError(Status::InvalidArgument(
        "The timeline was not enabled when Horovod was initialized: set HOROVOD_TIMELINE=DYNAMIC (or a file path) "
        "before hvd.init() to use hvd.start_timeline()."));
  }
  if (config_.rank == 0) timeline_.Start(path, mark_cycles);
}

void Engine::StopTimeline() {
  if (config_.rank == 0) timeline_.Stop();
}

bool Engine::mpi_threads_supported() {
  std::shared_ptr<ProcessSet> global = sets_->Find(0);
  return global && global->communicator && global->communicator->threads_supported();
}

std::string Engine::DumpFlightRecorder(const std::string& dir, const std::string& reason) {
  if (!recorder_->enabled()) {
    throw EngineError(Status::InvalidArgument(
        "The flight recorder is off (HOROVOD_FLIGHT_RECORDER_SIZE=0 when Horovod was initialized)."));
  }
  const std::string& target = dir.empty() ? recorder_->dir() : dir;
  if (target.empty()) {
    throw EngineError(Status::InvalidArgument(
        "No directory for the flight recorder: pass one, or set HOROVOD_FLIGHT_RECORDER_DIR before hvd.init()."));
  }
  return recorder_->Dump(target, reason, sets_->Ranks());
}

NegotiationStats Engine::GlobalStats() {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return global_stats_;
}

TunedParameters Engine::CurrentParameters() {
  std::lock_guard<std::mutex> lock(parameters_mu_);
  return parameters_;
}

Engine::HierarchicalStats Engine::hierarchical_stats() const {
  HierarchicalStats stats;
  const auto& state = stack_.hierarchical;
  if (!state) return stats;
  stats.available = true;
  stats.allreduce = state->allreduce;
  stats.allgather = state->allgather;
  stats.local_shared_memory = state->local_shared_memory;
  stats.allreduces = state->allreduces;
  stats.allgathers = state->allgathers;
  return stats;
}

size_t Engine::CacheCapacity(const TunedParameters& parameters) const {
  return parameters.cache_enabled ? static_cast<size_t>(std::max<int64_t>(config_.cache_capacity, 0)) : 0;
}

std::vector<std::string> Engine::Hosts() const {
  std::vector<std::string> hosts;
  for (const auto& peer : stack_.peers) hosts.push_back(peer.first);
  return hosts;
}

void Engine::ConfigureController(Controller& controller) {
  controller.SetHosts(Hosts());
  TunedParameters parameters = CurrentParameters();
  controller.ApplyParameters(parameters.fusion_threshold_bytes, CacheCapacity(parameters));
}

void Engine::ApplyParameters(const TunedParameters& parameters) {
  {
    std::lock_guard<std::mutex> lock(parameters_mu_);
    parameters_ = parameters;
  }
  cycle_time_us_ = std::llround(parameters.cycle_time_ms * 1000);
  for (auto& set : sets_->Members()) {
    set->controller->ApplyParameters(parameters.fusion_threshold_bytes, CacheCapacity(parameters));
  }
  if (stack_.hierarchical) {
    stack_.hierarchical->allreduce = parameters.hierarchical_allreduce;
    stack_.hierarchical->allgather = parameters.hierarchical_allgather;
  }
  if (parameter_manager_) parameter_manager_->Applied(std::chrono::steady_clock::now());
}

int64_t Engine::Enqueue(int32_t process_set_id, std::vector<Request> requests, std::vector<TensorTableEntry> entries,
                        intptr_t stream) {
  std::shared_ptr<ProcessSet> set = sets_->RequireMember(process_set_id, " and cannot submit operations on it");
  EnqueueContext context{process_set_id, &set->ranks, config_.size, config_.dynamic_process_sets};
  for (size_t i = 0; i < requests.size(); ++i) {
    Status status = CollectiveFor(requests[i].type).CheckRequest(requests[i], entries[i], context);
    if (!status.ok()) throw EngineError(status);
  }
  if (RecordReadyEvents(entries, stream)) gpu_submitted_.store(true, std::memory_order_relaxed);
  const FlightRecorder::Id recorded = recorder_->Submitted(requests, process_set_id);
  if (recorded != 0) {
    for (size_t i = 0; i < entries.size(); ++i) entries[i].flight_id = recorded + i;
  }
  const int64_t handle = ++last_handle_;
  auto state = std::make_shared<HandleState>(entries.size());
  state->process_set_id = process_set_id;
  for (size_t i = 0; i < entries.size(); ++i) {
    entries[i].handle = state;
    entries[i].index = i;
  }
  {
    std::lock_guard<std::mutex> lock(handles_mu_);
    handles_[handle] = state;
  }
  const size_t count = entries.size();
  try {
    set->queue.Add(std::move(requests), std::move(entries));
  } catch (const std::exception& e) {
    ReleaseHandle(handle);
    recorder_->Ended(recorded, count, e.what());
    throw;
  }
  if (follow_caller_.load(std::memory_order_relaxed)) submit_cpu_.store(::sched_getcpu(), std::memory_order_relaxed);
  submissions_.fetch_add(1, std::memory_order_seq_cst);
  // The background thread counts instead (a burst), or polls the queues now (caller execution).
  if (!coalescing_.load(std::memory_order_seq_cst) && !polling_.load(std::memory_order_seq_cst)) Wake();
  return handle;
}

void Engine::NotifyWaiting() {
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    waiting_ = true;
    wake_ = true;
  }
  wake_cv_.notify_one();
}

void Engine::Wake() {
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    wake_ = true;
  }
  wake_cv_.notify_one();
}

bool Engine::CallerExecutionUsable() const {
  return caller_execution_ && !gpu_submitted_.load(std::memory_order_relaxed);
}

bool Engine::ExecuteWhileWaiting(HandleState& state, std::chrono::milliseconds budget) {
  if (!CallerExecutionUsable()) return state.done();
  // While callers execute (or wait for the lock to do so), the background thread does not start
  // cycles for them (BackgroundLoop).
  struct Executing {
    std::atomic<int>& count;
    explicit Executing(std::atomic<int>& c) : count(c) { count.fetch_add(1, std::memory_order_seq_cst); }
    ~Executing() { count.fetch_sub(1, std::memory_order_seq_cst); }
  } executing(callers_executing_);
  const auto deadline = std::chrono::steady_clock::now() + budget;
  // When another thread is in a cycle, wait for it: that cycle may complete the handle, and if it
  // does not, this caller runs the next one.
  std::unique_lock<std::timed_mutex> lock(cycle_mu_, std::defer_lock);
  if (!lock.try_lock_until(deadline)) return state.done();
  // (A GPU tensor submitted meanwhile: the cycles go to the background thread.)
  while (!stopped_ && !state.done() && CallerExecutionUsable()) {
    const auto start = std::chrono::steady_clock::now();
    caller_cycles_.fetch_add(1, std::memory_order_relaxed);
    if (!CycleLocked(start)) {
      // The engine stopped in this cycle: the background thread fails what is pending and closes
      // the connections.
      lock.unlock();
      Wake();
      break;
    }
    if (state.done()) break;
    const auto end = std::chrono::steady_clock::now();
    const auto cycle = std::chrono::microseconds(cycle_time_us_.load());
    if ((!progress_ && end - start < cycle / 4) || end >= deadline) break;
  }
  return state.done();
}

bool Engine::Wait(HandleState& state, std::chrono::milliseconds budget) {
  if (ExecuteWhileWaiting(state, budget)) return true;
  NotifyWaiting();
  return state.WaitFor(budget);
}

void Engine::WaitStarted(int32_t process_set_id) {
  if (std::shared_ptr<ProcessSet> set = sets_->Find(process_set_id)) ++set->waiters;
}

void Engine::WaitEnded(int32_t process_set_id) {
  if (std::shared_ptr<ProcessSet> set = sets_->Find(process_set_id)) --set->waiters;
}

std::shared_ptr<HandleState> Engine::GetHandle(int64_t handle) {
  std::lock_guard<std::mutex> lock(handles_mu_);
  auto it = handles_.find(handle);
  return it == handles_.end() ? nullptr : it->second;
}

void Engine::ReleaseHandle(int64_t handle) {
  std::lock_guard<std::mutex> lock(handles_mu_);
  handles_.erase(handle);
}

void Engine::RequestShutdown(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(reason_mu_);
    if (shutdown_reason_.empty()) shutdown_reason_ = reason;
  }
  shutdown_requested_ = true;
  Wake();
}

void Engine::Shutdown() {
  RequestShutdown("");
  if (thread_.joinable()) thread_.join();
  timeline_.Stop();
}

bool Engine::BindBackgroundThread(int cpu) {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  CPU_SET(cpu, &cpus);
  if (::pthread_setaffinity_np(::pthread_self(), sizeof(cpus), &cpus) != 0) return false;
  background_cpu_.store(cpu, std::memory_order_relaxed);
  return true;
}

void Engine::FollowCaller() {
  const int cpu = submit_cpu_.load(std::memory_order_relaxed);
  if (cpu < 0 || cpu == background_cpu_.load(std::memory_order_relaxed) || BindBackgroundThread(cpu)) return;
  // The core was taken from this process (its cpuset changed): back to the cores the thread
  // started with, and the scheduler places it from now on.
  ::pthread_setaffinity_np(::pthread_self(), sizeof(started_cpus_), &started_cpus_);
  follow_caller_.store(false);
  background_cpu_.store(-1, std::memory_order_relaxed);
}

void Engine::BackgroundLoop() {
  using Clock = std::chrono::steady_clock;
  background_tid_.store(static_cast<int64_t>(::syscall(SYS_gettid)));
  ::pthread_setname_np(::pthread_self(), "hvd-background");  // top -H, /proc/<pid>/task/*/comm
  ::pthread_getaffinity_np(::pthread_self(), sizeof(started_cpus_), &started_cpus_);
  if (pinned_cpu_ >= 0 && !BindBackgroundThread(pinned_cpu_)) {
    HVD_LOG(WARNING) << "HOROVOD_THREAD_AFFINITY: could not bind the background thread to core " << pinned_cpu_;
  }
  bool again = false;
  int idle = 0;  // consecutive cycles that had nothing to do on this rank
  // Caller execution: when this rank last submitted something (as seen from this thread).
  uint64_t submissions_seen = submissions_.load();
  auto last_submission = Clock::now() - kActiveWindow;
  while (true) {
    // Read every cycle: autotune changes it (ApplyParameters).
    const auto cycle = std::chrono::microseconds(cycle_time_us_.load());
    bool woken = false;
    {
      // An idle rank cycles less and less often (up to 16 cycle times apart): it has nothing to
      // batch, and its own submissions wake it at once. Its cycles only let the others notice a
      // shutdown or a stall, which takes a few milliseconds longer instead of costing a tenth of
      // a core per process while idle.
      // The periodic cycle is due this long after the last cycle of any thread (a caller's count too).
      auto due = [&](std::chrono::microseconds period) {
        return Clock::time_point(Clock::duration(last_cycle_start_.load())) + period * (1 << std::min(idle, 4));
      };
      // While the rank submits asynchronous work and the host has no core to spare, every cycle
      // of this thread takes a core from the training, and its negotiation wakes the peers'
      // threads on theirs: there it gathers the submissions of busy_poll_period_ into one cycle
      // (fewer, larger fused operations) unless the user chose the cycle time. A caller of this
      // rank that waits is not delayed: it runs the cycle itself, or wakes this thread at once.
      const auto poll_period = std::max<std::chrono::microseconds>(cycle, busy_poll_period_);
      std::unique_lock<std::mutex> lock(wake_mu_);
      while (!again) {
        // With caller execution, a submission does not wake this thread while the rank is busy
        // (it submitted in the last kActiveWindow): the caller usually waits right away and runs
        // the cycle itself, and waking this thread for every operation would take a core from
        // the callers of this rank and its peers at the moment they need it. Instead this thread
        // looks once per cycle time for operations that were submitted and that no caller waits on
        // (asynchronous ones, such as gradients during the backward pass), and runs the cycle
        // for them. A caller that waits without running the cycle itself wakes it (NotifyWaiting).
        const uint64_t count = submissions_.load(std::memory_order_seq_cst);
        const auto now = Clock::now();
        if (count != submissions_seen) {
          submissions_seen = count;
          last_submission = now;
        }
        const bool poll = CallerExecutionUsable() && now - last_submission < kActiveWindow;
        if (poll) polling_.store(true, std::memory_order_seq_cst);
        const auto period = poll ? poll_period : cycle;
        const auto until = poll ? std::min<Clock::time_point>(due(period), now + period) : due(period);
        woken = wake_cv_.wait_until(lock, until, [this] { return wake_; });
        polling_.store(false, std::memory_order_seq_cst);
        if (woken || Clock::now() >= due(period)) break;
        lock.unlock();
        woken = callers_executing_.load(std::memory_order_seq_cst) == 0 && sets_->AnyWaiting() &&
                !sets_->AnyCallerWaiting();
        lock.lock();
        if (woken) break;
      }
      if (woken && !waiting_) {
        // Woken by a submission: gather the rest of its burst first (a training step submits
        // its gradients back to back), until nothing was submitted for kQuietPeriod, a caller
        // blocks on a handle, or the cycle time (the bound on batching) is over. Cycling on
        // every submission instead costs one negotiation each, and on a machine with as many
        // processes as cores it takes the core from the thread that is submitting.
        coalescing_.store(true, std::memory_order_seq_cst);
        const auto deadline = std::chrono::steady_clock::now() + cycle;
        uint64_t seen = submissions_.load(std::memory_order_seq_cst);
        while (!waiting_ && !shutdown_requested_.load() && std::chrono::steady_clock::now() < deadline) {
          wake_cv_.wait_for(lock, std::min<std::chrono::microseconds>(kQuietPeriod, cycle),
                            [this] { return waiting_ || shutdown_requested_.load(); });
          const uint64_t now = submissions_.load(std::memory_order_seq_cst);
          if (now == seen) break;
          seen = now;
        }
        coalescing_.store(false, std::memory_order_seq_cst);
      }
      wake_ = false;
      waiting_ = false;
    }
    std::unique_lock<std::timed_mutex> cycle_lock(cycle_mu_);
    if (stopped_) break;  // a caller's cycle ended the engine
    // Woken by a submission or a waiting caller, but nothing of this rank is left to negotiate:
    // a caller ran the cycle that executed it (caller execution), or the cycle that just ran
    // was completing the handle a caller then started to wait on (a step that waits on its
    // handles in turn). A cycle now would be an empty negotiation round that the other ranks'
    // next cycles must meet first.
    // The same when this thread meant to cycle again at once for operations that waited on other
    // ranks, and a caller executed them while this thread waited for the lock.
    if ((woken || again) && !shutdown_requested_.load() && !sets_->AnyWaiting()) {
      again = false;
      continue;
    }
    if (follow_caller_.load(std::memory_order_relaxed)) FollowCaller();
    const auto start = Clock::now();
    if (!CycleLocked(start)) break;
    // The cycle time bounds how long submitted work waits; it is not a sleep every operation
    // pays. While this rank has operations waiting for the other ranks, the next cycle starts
    // at once: its negotiation blocks until another rank's cycle meets it (when that rank submits
    // them, or its cycle time expires), so the operations run as soon as the last rank submits.
    // A quick cycle that ran nothing means every rank is waiting on the others (a stall, or
    // ranks that submitted in incompatible orders): then the cycle time applies again, instead
    // of spinning.
    again = false;
    const bool waiting = sets_->AnyWaiting();
    // (Not while a caller executes: it runs the next cycle itself.)
    if (progress_ || std::chrono::steady_clock::now() - start >= cycle / 4) {
      again = waiting && callers_executing_.load(std::memory_order_seq_cst) == 0;
    }
    idle = (progress_ || waiting) ? 0 : idle + 1;
  }
  std::lock_guard<std::timed_mutex> cycle_lock(cycle_mu_);
  const Status status = stop_status_;
  std::vector<std::shared_ptr<ProcessSet>> sets = sets_->All();
  for (auto& set : sets) {
    for (TensorTableEntry& entry : set->queue.Close(status)) {
      recorder_->Ended(entry.flight_id, 1, status.reason());
      entry.handle->Complete(entry.index, status);
    }
  }
  if (status.reason() != kShutdownMessage && !exit_reason_.empty()) HVD_LOG(ERROR) << status.reason();
  // A stall shutdown, a lost peer or another failure (not a plain shutdown): keep the record.
  if (status.reason() != kShutdownMessage) recorder_->DumpAutomatically(status.reason(), sets_->Ranks());
  // Close every connection now, so that peers blocked on this rank fail at once instead of
  // waiting for their timeout.
  for (auto& set : sets) {
    set->gpu_communicator.reset();
    set->controller.reset();
    set->communicator.reset();
  }
  // CUDA resources go on this thread, before the interpreter exits (spec: shutdown runs at exit).
  executors_.Release();
}

bool Engine::CycleLocked(std::chrono::steady_clock::time_point start) {
  progress_ = false;
  last_cycle_start_.store(start.time_since_epoch().count(), std::memory_order_relaxed);
  Status status;
  try {
    if (RunCycle(start)) {
      if (progress_) last_activity_ = start;
      return true;
    }
    status = Status::UnknownError(exit_reason_.empty() ? kShutdownMessage : exit_reason_);
  } catch (const GpuError& e) {
    status = Status::UnknownError(std::string("Horovod stopped on a GPU error; every pending and later collective "
                                              "operation fails. Cause: ") + e.what());
    HVD_LOG(ERROR) << status.reason();
  } catch (const std::logic_error& e) {
    status = Status::UnknownError(std::string("Horovod stopped on an internal error (please report it): ") + e.what());
    HVD_LOG(ERROR) << status.reason();
  } catch (const std::exception& e) {
    status = Status::UnknownError("Horovod lost its connection to " + DescribeLostRanks(stack_.peers, config_.rank) +
                                  "; every pending and later collective operation fails. Cause: " + e.what());
    HVD_LOG(ERROR) << status.reason();
  }
  stopped_ = true;
  stop_status_ = status;
  return false;
}

bool Engine::RunCycle(std::chrono::steady_clock::time_point now) {
  timeline_.MarkCycleStart();
  std::shared_ptr<ProcessSet> global = sets_->Find(0);
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(reason_mu_);
    reason = shutdown_reason_;
  }
  // Deadlocks across process sets (controller.h): this rank is stuck when a caller waits and
  // nothing completed or was submitted here for twice the deadlock timeout (so that a deadlock
  // within one set, reported after the timeout, or 1.5 times it for cached tensors, is reported as
  // such first, and the ranks it frees are no longer stuck).
  const uint64_t submissions = submissions_.load();
  if (submissions != seen_submissions_) {
    seen_submissions_ = submissions;
    last_activity_ = now;
  }
  const auto timeout = std::chrono::duration<double>(2 * config_.deadlock_timeout_seconds);
  const bool stuck = timeout.count() > 0 && now - last_activity_ >= timeout && sets_->AnyCallerWaiting();
  ResponseList list =
      global->controller->ComputeResponseList(global->queue.PopRequests(), shutdown_requested_, reason,
                                             global->waiters.load() > 0, stuck, false, &global->queue);
  // Every rank was stuck: the global set's own pending tensors failed in this negotiation; the
  // other sets' fail in theirs below.
  const bool job_deadlocked = global->controller->job_stuck();
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    global_stats_ = global->controller->stats();
  }
  if (list.shutdown) {
    exit_reason_ = list.shutdown_reason;
    return false;
  }
  // Autotune: parameters published by rank 0 take effect here on every rank; rank 0's tuner
  // scores the cycle and may publish the next ones (sent with the next negotiation).
  if (list.parameters) ApplyParameters(*list.parameters);
  PerformAll(*global, list);
  if (parameter_manager_) {
    auto next = parameter_manager_->Update(list.responses, std::chrono::steady_clock::now());
    if (next) global->controller->PublishParameters(*next);
  }
  for (auto& set : sets_->Members()) {
    if (set->id == 0) continue;
    ResponseList set_list =
        set->controller->ComputeResponseList(set->queue.PopRequests(), false, "", set->waiters.load() > 0, false,
                                             job_deadlocked, &set->queue);
    // A stall in this set shuts every rank down through the global set's next negotiation.
    if (set_list.shutdown) RequestShutdown(set_list.shutdown_reason);
    PerformAll(*set, set_list);
  }
  return true;
}

void Engine::PerformAll(ProcessSet& set, const ResponseList& list) {
  if (timeline_.recording()) {
    // Each operation waits in the QUEUE activity until the ones before it in the list are done.
    for (const Response& response : list.responses) {
      for (const auto& name : response.names) {
        timeline_.Start(name, response.type);
        timeline_.ActivityStart(name, "QUEUE");
      }
    }
  }
  if (list.responses.empty()) return;
  progress_ = true;
  const int64_t negotiated_us = recorder_->enabled() ? WallMicros() : 0;
  for (const Response& response : list.responses) Perform(set, response, negotiated_us);
  if (!failed_.empty()) {
    // Error responses (a mismatch, a deadlock) failed operations of this rank: the flight recorder
    // is written before their callers learn it (and go on submitting).
    recorder_->DumpAutomatically(failed_.front().second, sets_->Ranks());
    for (auto& [entry, message] : failed_) entry.handle->Complete(entry.index, Status::PreconditionError(message));
    failed_.clear();
  }
}

void Engine::Perform(ProcessSet& set, const Response& response, int64_t negotiated_us) {
  // This rank's entries; a rank that has joined has none for the others' allreduces.
  std::vector<TensorTableEntry> owned(response.names.size());
  std::vector<TensorTableEntry*> entries(response.names.size(), nullptr);
  for (size_t i = 0; i < response.names.size(); ++i) {
    if (set.queue.TryTake(response.names[i], &owned[i])) entries[i] = &owned[i];
  }
  recorder_->Started(entries, negotiated_us);
  const bool record = timeline_.recording();
  auto end_all = [&] {
    if (record) {
      for (const auto& name : response.names) timeline_.End(name);
    }
  };
  if (record) {
    for (const auto& name : response.names) timeline_.ActivityEnd(name);  // QUEUE
  }
  if (response.type == OpType::ERROR) {
    end_all();
    recorder_->Ended(entries, response.error_message);
    for (auto* e : entries) {
      if (e) failed_.emplace_back(std::move(*e), response.error_message);  // completed by PerformAll
    }
    return;
  }
  const Collective& collective = CollectiveFor(response.type);
  const bool may_lack = collective.joined_ranks_take_part() && set.controller->joined();
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!entries[i] && !may_lack) {
      throw std::logic_error("negotiated tensor '" + response.names[i] + "' is not in this rank's table");
    }
  }
  // Engine-allocated outputs, per entry (empty where the caller gave the output).
  std::vector<std::vector<std::shared_ptr<OutputBuffer>>> outputs(entries.size());
  std::optional<int64_t> value;
  try {
    DeviceExecutor& executor = executors_.For(set, response.device, entries);
    // The body captures one reference, so the std::function holds it without allocating.
    auto body = [&] {
      ExecutionContext context{response,      entries,  outputs,      executor.CommunicatorOf(set),
                               executor,      set.ranks, set.set_rank, timeline_,
                               sets_.get(),   std::nullopt};
      collective.Execute(context);
      value = context.value;
    };
    executor.Run(entries, [&body] { body(); });
  } catch (const std::exception& e) {
    // The failure ends the engine (BackgroundLoop); these entries are no longer in the queue, so
    // they are failed here.
    end_all();
    Status failed = Status::UnknownError(std::string("Horovod ") + OpTypeName(response.type) + " failed: " + e.what());
    recorder_->Ended(entries, failed.reason());
    for (auto* entry : entries) {
      if (entry) entry->handle->Complete(entry->index, failed);
    }
    throw;
  }
  if (record) {
    for (size_t i = 0; i < entries.size(); ++i) {
      const auto& name = response.names[i];
      if (!outputs[i].empty()) {
        timeline_.End(name, outputs[i][0]->dtype(), outputs[i][0]->shape());
      } else if (entries[i] && entries[i]->output.data != nullptr) {
        timeline_.End(name, entries[i]->output.dtype, entries[i]->output.shape);
      } else {
        timeline_.End(name);
      }
    }
  }
  recorder_->Ended(entries, "");
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!entries[i]) continue;
    if (value) {
      entries[i]->handle->CompleteWithValue(entries[i]->index, *value);
    } else {
      entries[i]->handle->Complete(entries[i]->index, Status::OK(), std::move(outputs[i]));
    }
  }
}

}  // namespace horovod
