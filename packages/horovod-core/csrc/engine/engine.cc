#include "engine.h"


#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "collectives/collective.h"
#include "common/liveness.h"
#include "common/logging.h"
#include "executors/gpu_error.h"

namespace horovod {

const char* const kShutdownMessage =
    "Horovod has been shut down. This was caused by an exception on one of the ranks or an attempt to "
    "run a collective operation after one of the ranks finished execution. If the shutdown was caused "
    "by an exception, you should see the exception in the log before the first shutdown message.";

std::unique_ptr<Engine> Engine::Start(const Config& config, std::unique_ptr<Store> store,
                                      const std::string& key_prefix,
                                      const std::vector<std::vector<int>>& process_sets, intptr_t mpi_comm,
                                      const std::vector<int>& mpi_ranks) {
  SetLogLevel(config.log_level, config.log_hide_time);
  const int pinned_cpu = ThreadAffinity(config);
  std::unique_ptr<Engine> engine(new Engine(config));
  Engine& e = *engine;
  e.PlaceBackgroundThread(pinned_cpu);
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
  SwitchHierarchical(stack_, parameters.hierarchical_allreduce, parameters.hierarchical_allgather);
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

// The background thread's end, once a cycle stopped the engine: fails what is pending and
// closes the connections.
void Engine::CloseAfterStop() {
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
  const bool stuck = StuckAcrossSets(now);
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

}  // namespace horovod
