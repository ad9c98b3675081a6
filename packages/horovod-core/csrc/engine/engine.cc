#include "engine.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "adasum.h"
#include "backends/hierarchical/hierarchical.h"
#include "backends/shm/shared_memory.h"
#include "logging.h"
#include "reduction.h"

namespace horovod {

const char* const kShutdownMessage =
    "Horovod has been shut down. This was caused by an exception on one of the ranks or an attempt to "
    "run a collective operation after one of the ranks finished execution. If the shutdown was caused "
    "by an exception, you should see the exception in the log before the first shutdown message.";

namespace {

// A burst of submissions is over once none came for this long (see BackgroundLoop).
constexpr std::chrono::microseconds kQuietPeriod{50};

}  // namespace

namespace {
int64_t RowBytes(const TensorView& input) {
  std::vector<int64_t> row_shape(input.shape.begin() + 1, input.shape.end());
  return NumElements(row_shape) * static_cast<int64_t>(DataTypeSize(input.dtype));
}
}  // namespace

AllgatherLayout MakeAllgatherLayout(const Response& response, size_t t, const TensorView& input, int size) {
  const int64_t row_bytes = RowBytes(input);
  AllgatherLayout layout;
  layout.bytes_per_rank.resize(size);
  int64_t rows = 0;
  for (int r = 0; r < size; ++r) {
    const int64_t dim0 = response.tensor_sizes[t * size + r];
    layout.bytes_per_rank[r] = dim0 * row_bytes;
    rows += dim0;
  }
  layout.shape = input.shape;
  layout.shape[0] = rows;
  layout.bytes = rows * row_bytes;
  return layout;
}

AlltoallLayout MakeAlltoallLayout(const Response& response, const TensorView& input, int size, int me) {
  const int64_t row_bytes = RowBytes(input);
  AlltoallLayout layout;
  layout.send_bytes.resize(size);
  layout.recv_bytes.resize(size);
  layout.received_splits = std::make_shared<OutputBuffer>(DataType::INT32, std::vector<int64_t>{size});
  auto* received_rows = static_cast<int32_t*>(layout.received_splits->data());
  int64_t rows = 0;
  for (int r = 0; r < size; ++r) {
    layout.send_bytes[r] = response.tensor_sizes[me * size + r] * row_bytes;
    const int64_t from = response.tensor_sizes[r * size + me];
    layout.recv_bytes[r] = from * row_bytes;
    received_rows[r] = static_cast<int32_t>(from);
    rows += from;
  }
  layout.shape = input.shape;
  layout.shape[0] = rows;
  layout.bytes = rows * row_bytes;
  return layout;
}

ReducescatterLayout MakeReducescatterLayout(const TensorView& input, int size, int me) {
  const int64_t dim0 = input.shape[0];
  std::vector<int64_t> row_shape(input.shape.begin() + 1, input.shape.end());
  const int64_t row_elements = NumElements(row_shape);
  ReducescatterLayout layout;
  layout.counts.resize(size);
  for (int r = 0; r < size; ++r) {
    layout.counts[r] = (dim0 / size + (r < dim0 % size ? 1 : 0)) * row_elements;
    if (r < me) layout.offset += layout.counts[r];
  }
  layout.shape = input.shape;
  layout.shape[0] = dim0 / size + (me < dim0 % size ? 1 : 0);
  return layout;
}

std::string CpuBackendName(const Config& config) {
  if (!config.cpu_operations.empty()) return config.cpu_operations;
  if (!config.controller.empty()) return config.controller;
  if (config.launched_by_mpi && BackendRegistry::Built("mpi")) return "mpi";
  return "gloo";
}

namespace {

// Every rank's bytes, on every rank (a gather to rank 0 and a broadcast of the concatenation).
std::vector<std::vector<char>> AllgatherBytes(Communicator& backend, const std::vector<char>& mine) {
  std::vector<std::vector<char>> all = backend.Gatherv(mine, 0);
  std::vector<char> packed;
  if (backend.rank() == 0) {
    for (const auto& bytes : all) {
      uint64_t n = bytes.size();
      packed.insert(packed.end(), reinterpret_cast<const char*>(&n), reinterpret_cast<const char*>(&n) + sizeof(n));
      packed.insert(packed.end(), bytes.begin(), bytes.end());
    }
  }
  backend.BroadcastBytes(packed, 0);
  all.assign(backend.size(), {});
  size_t pos = 0;
  for (int r = 0; r < backend.size(); ++r) {
    uint64_t n;
    std::memcpy(&n, packed.data() + pos, sizeof(n));
    pos += sizeof(n);
    all[r].assign(packed.data() + pos, packed.data() + pos + n);
    pos += n;
  }
  return all;
}

std::vector<char> PackInts(const std::vector<std::vector<int>>& lists) {
  std::ostringstream out;
  for (const auto& list : lists) {
    out << "[";
    for (int r : list) out << r << ",";
    out << "]";
  }
  std::string s = out.str();
  return std::vector<char>(s.begin(), s.end());
}

// Whether process `pid` on this host has exited (gone, or a zombie not yet reaped).
bool ProcessGone(int64_t pid) {
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && (line[paren + 2] == 'Z' || line[paren + 2] == 'X');
}

}  // namespace

std::unique_ptr<Engine> Engine::Start(const Config& config, std::unique_ptr<Store> store,
                                      const std::string& key_prefix,
                                      const std::vector<std::vector<int>>& process_sets, intptr_t mpi_comm,
                                      const std::vector<int>& mpi_ranks) {
  SetLogLevel(config.log_level, config.log_hide_time);
  std::unique_ptr<Engine> engine(new Engine(config));
  engine->store_ = store ? std::move(store) : std::make_unique<MemoryStore>();
  engine->key_prefix_ = key_prefix;
  BackendOptions options;
  options.rank = config.rank;
  options.size = config.size;
  options.store = engine->store_.get();
  options.key_prefix = key_prefix;
  options.iface = config.gloo_iface;
  options.hostname = config.local_size == config.size ? "127.0.0.1" : config.hostname;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(config.gloo_timeout_seconds * 1000));
  options.mpi_comm = mpi_comm;
  options.mpi_ranks = mpi_ranks;
  options.mpi_threads_disable = config.mpi_threads_disable;
  std::unique_ptr<Communicator> backend = BackendRegistry::Create(CpuBackendName(config), options);
  Communicator& global = *backend;
  engine->backend_name_ = global.name();
  engine->allreduce_activity_ = engine->Activity("ALLREDUCE");
  // MPI knows the job's layout from its launcher; the HOROVOD_* topology variables are not needed.
  Config& layout = engine->config_;
  if (global.Topology(&layout.local_rank, &layout.local_size, &layout.cross_rank, &layout.cross_size)) {
    layout.rank = global.rank();
    layout.size = global.size();
  }
  TunedParameters& initial = engine->parameters_;
  initial.fusion_threshold_bytes = config.fusion_threshold_bytes;
  initial.cycle_time_ms = config.cycle_time_ms;
  initial.cache_enabled = config.cache_capacity > 0;
  initial.hierarchical_allreduce = config.hierarchical_allreduce;
  initial.hierarchical_allgather = config.hierarchical_allgather;
  initial.torus_allreduce = config.torus_allreduce;
  initial.tuning = config.autotune;
  engine->cycle_time_us_ = std::llround(config.cycle_time_ms * 1000);

  // Topology facts and the static process sets, agreed by every rank. Ranks are grouped into
  // hosts by HOROVOD_HOSTNAME when the launcher set it (horovodrun sets it per slot, so
  // `-H localhost:2,127.0.0.1:2` is two hosts even on one machine), else by gethostname().
  std::ostringstream me;
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  me << engine->config_.local_size << "\n" << host << "\n" << ::getpid() << "\n"
     << (config.hostname_given ? config.hostname : std::string(host));
  std::string mine_text = me.str();
  std::vector<std::vector<char>> all = AllgatherBytes(global, std::vector<char>(mine_text.begin(), mine_text.end()));
  std::vector<std::string> group_hosts;
  for (const auto& bytes : all) {
    std::istringstream in(std::string(bytes.begin(), bytes.end()));
    std::string local_size, host, pid, group;
    std::getline(in, local_size);
    std::getline(in, host);
    std::getline(in, pid);
    std::getline(in, group);
    if (std::stoi(local_size) != engine->config_.local_size) engine->homogeneous_ = false;
    engine->peers_.emplace_back(host, std::stoll(pid));
    group_hosts.push_back(group);
  }
  std::vector<int64_t> pids;
  for (const auto& peer : engine->peers_) pids.push_back(peer.second);
  const HostLayout host_layout = GroupByHost(group_hosts, global.rank());
  engine->num_hosts_ = static_cast<int>(host_layout.hosts.size());
  // One host: the hot path goes through shared memory (csrc/backends/shm/shared_memory.h).
  bool one_host = global.size() > 1 && host_layout.hosts.size() == 1;
  if (one_host && engine->config_.shared_memory) {
    std::string why;
    bool single_copy = engine->config_.shared_memory_single_copy;
    std::unique_ptr<Communicator> shared = MakeSharedMemoryBackend(backend, pids, options, &single_copy, &why);
    if (shared) {
      backend = std::move(shared);
      engine->shared_memory_ = true;
      engine->shared_memory_single_copy_ = single_copy;
    } else {
      HVD_LOG(WARNING) << "Horovod could not set up shared memory between its ranks (" << why << "); collectives go "
                       << "through " << engine->backend_name_ << " instead.";
    }
  }
  // Several hosts: the hierarchical collectives (csrc/backends/hierarchical/hierarchical.h), when asked for or
  // when autotune may switch them on. Their communicators cost a rendezvous and a segment per
  // host, so a job that can never use them does not build them.
  const bool may_tune_hierarchical =
      config.autotune && !(config.hierarchical_allreduce_fixed && config.hierarchical_allgather_fixed);
  const bool wants_hierarchical = config.hierarchical_allreduce || config.hierarchical_allgather || may_tune_hierarchical;
  const bool asked_hierarchical = config.hierarchical_allreduce || config.hierarchical_allgather;
  if (host_layout.hosts.size() == 1 && asked_hierarchical && global.size() > 1 && global.rank() == 0) {
    HVD_LOG(INFO) << "Every rank is on one host: hierarchical allreduce/allgather do not apply; collectives go "
                  << "through " << (engine->shared_memory_ ? "shared memory" : engine->backend_name_) << ".";
  }
  if (host_layout.hosts.size() > 1 && wants_hierarchical) {
    if (!host_layout.homogeneous) {
      if (global.rank() == 0) {
        // A warning when the user asked for the path; only information when autotune might have
        // tried it.
        const LogLevel level = asked_hierarchical ? LogLevel::WARNING : LogLevel::INFO;
        std::ostringstream counts;
        for (size_t h = 0; h < host_layout.hosts.size(); ++h) counts << (h ? ", " : "") << host_layout.hosts[h].size();
        if (level >= CurrentLogLevel()) {
          LogMessage(__FILE__, __LINE__, level).stream()
              << "Hierarchical allreduce/allgather need the same number of ranks on every host, but this job has "
              << counts.str() << " ranks on its " << host_layout.hosts.size() << " hosts; collectives use the flat "
              << engine->backend_name_ << " communicator instead.";
        }
      }
    } else {
      BackendOptions hier_options = options;
      hier_options.key_prefix = key_prefix;
      auto state = std::make_shared<HierarchicalState>();
      state->allreduce = config.hierarchical_allreduce;
      state->allgather = config.hierarchical_allgather;
      backend = std::make_unique<HierarchicalBackend>(std::move(backend), host_layout, pids, hier_options,
                                                      engine->config_.shared_memory,
                                                      engine->config_.shared_memory_single_copy, state);
      engine->hierarchical_ = state;
      HVD_LOG(INFO) << "Hierarchical collectives available: " << host_layout.hosts.size() << " hosts of "
                    << host_layout.hosts[0].size() << " ranks"
                    << (engine->hierarchical_->local_shared_memory ? ", shared memory within each host" : "")
                    << "; allreduce " << (config.hierarchical_allreduce ? "on" : "off") << ", allgather "
                    << (config.hierarchical_allgather ? "on" : "off") << ".";
    }
  }
  if (config.autotune && global.rank() == 0) {
    engine->parameter_manager_ =
        std::make_unique<ParameterManager>(engine->config_, initial, engine->hierarchical_ != nullptr);
  }
  for (const auto& ranks : process_sets) {
    for (int r : ranks) {
      if (r < 0 || r >= global.size()) {
        throw EngineError(Status::InvalidArgument("Process set rank " + std::to_string(r) +
                                                  " is out of range: expected 0 <= rank < " +
                                                  std::to_string(global.size()) + "."));
      }
    }
  }
  std::vector<char> my_sets = PackInts(process_sets);
  std::vector<std::vector<char>> sets_everywhere = AllgatherBytes(global, my_sets);
  for (int r = 0; r < global.size(); ++r) {
    if (sets_everywhere[r] != my_sets) {
      throw EngineError(Status::InvalidArgument(
          "hvd.init(process_sets=...) must be given the same process sets on every rank; rank " +
          std::to_string(global.rank()) + " has " + std::string(my_sets.begin(), my_sets.end()) + " but rank " +
          std::to_string(r) + " has " + std::string(sets_everywhere[r].begin(), sets_everywhere[r].end()) + "."));
    }
  }

  auto global_set = std::make_shared<ProcessSet>();
  global_set->id = 0;
  for (int r = 0; r < global.size(); ++r) global_set->ranks.push_back(r);
  global_set->set_rank = global.rank();
  global_set->backend = std::move(backend);
  Timeline* timeline = global.rank() == 0 ? &engine->timeline_ : nullptr;
  global_set->controller = std::make_unique<Controller>(*global_set->backend, global_set->ranks, engine->config_, timeline);
  engine->sets_[0] = global_set;
  for (const auto& ranks : process_sets) engine->CreateProcessSet(engine->next_id_++, ranks);

  engine->timeline_enabled_ = !config.timeline.empty();
  if (engine->timeline_enabled_ && config.timeline != "DYNAMIC" && engine->config_.rank == 0) {
    engine->timeline_.Start(config.timeline, config.timeline_mark_cycles);
  }
  engine->thread_ = std::thread(&Engine::BackgroundLoop, engine.get());
  HVD_LOG(INFO) << "Horovod initialized: rank " << engine->config_.rank << " of " << engine->config_.size << ", backend "
                << engine->backend_name_ << (engine->shared_memory_ ? " with shared memory" : "")
                << (engine->hierarchical_ ? " with hierarchical collectives" : "");
  return engine;
}

Engine::Engine(const Config& config) : config_(config) {}

Engine::~Engine() { Shutdown(); }

void Engine::CreateProcessSet(int32_t id, const std::vector<int>& ranks) {
  std::shared_ptr<ProcessSet> global = FindSet(0);
  auto set = std::make_shared<ProcessSet>();
  set->id = id;
  set->ranks = ranks;
  auto it = std::find(ranks.begin(), ranks.end(), config_.rank);
  set->set_rank = it == ranks.end() ? -1 : static_cast<int>(it - ranks.begin());
  BackendOptions options;
  options.store = store_.get();
  options.key_prefix = key_prefix_ + "set" + std::to_string(++sets_created_) + ".";
  options.iface = config_.gloo_iface;
  options.hostname = config_.local_size == config_.size ? "127.0.0.1" : config_.hostname;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(config_.gloo_timeout_seconds * 1000));
  set->backend = global->backend->Split(ranks, options);
  if (set->backend) {
    Timeline* timeline = config_.rank == 0 ? &timeline_ : nullptr;
    set->controller = std::make_unique<Controller>(*set->backend, ranks, config_, timeline);
    TunedParameters parameters = CurrentParameters();
    set->controller->ApplyParameters(parameters.fusion_threshold_bytes, CacheCapacity(parameters));
  }
  std::lock_guard<std::mutex> lock(sets_mu_);
  sets_[id] = std::move(set);
}

std::shared_ptr<ProcessSet> Engine::FindSet(int32_t id) {
  std::lock_guard<std::mutex> lock(sets_mu_);
  auto it = sets_.find(id);
  return it == sets_.end() ? nullptr : it->second;
}

std::map<int32_t, std::vector<int>> Engine::ProcessSetRanks() {
  std::lock_guard<std::mutex> lock(sets_mu_);
  std::map<int32_t, std::vector<int>> out;
  for (const auto& [id, set] : sets_) out[id] = set->ranks;
  return out;
}

namespace {
EngineError UnknownSet(int32_t id) {
  return EngineError(Status::InvalidArgument("Process set " + std::to_string(id) +
                                             " is not known to Horovod: it was never registered, or it was removed."));
}
}  // namespace

int Engine::ProcessSetRank(int32_t id) {
  std::shared_ptr<ProcessSet> set = FindSet(id);
  if (!set) throw UnknownSet(id);
  if (set->set_rank < 0) {
    throw EngineError(Status::InvalidArgument("Rank " + std::to_string(config_.rank) +
                                              " is not a member of process set " + std::to_string(id) + " (ranks " +
                                              ShapeString(std::vector<int64_t>(set->ranks.begin(), set->ranks.end())) +
                                              ")."));
  }
  return set->set_rank;
}

int Engine::ProcessSetSize(int32_t id) {
  std::shared_ptr<ProcessSet> set = FindSet(id);
  if (!set) throw UnknownSet(id);
  return static_cast<int>(set->ranks.size());
}

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
  std::shared_ptr<ProcessSet> global = FindSet(0);
  return global && global->backend && global->backend->threads_supported();
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
  if (!hierarchical_) return stats;
  stats.available = true;
  stats.allreduce = hierarchical_->allreduce;
  stats.allgather = hierarchical_->allgather;
  stats.local_shared_memory = hierarchical_->local_shared_memory;
  stats.allreduces = hierarchical_->allreduces;
  stats.allgathers = hierarchical_->allgathers;
  return stats;
}

size_t Engine::CacheCapacity(const TunedParameters& parameters) const {
  return parameters.cache_enabled ? static_cast<size_t>(std::max<int64_t>(config_.cache_capacity, 0)) : 0;
}

void Engine::ApplyParameters(const TunedParameters& parameters) {
  {
    std::lock_guard<std::mutex> lock(parameters_mu_);
    parameters_ = parameters;
  }
  cycle_time_us_ = std::llround(parameters.cycle_time_ms * 1000);
  std::vector<std::shared_ptr<ProcessSet>> sets;
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    for (auto& [id, set] : sets_) {
      if (set->controller) sets.push_back(set);
    }
  }
  for (auto& set : sets) set->controller->ApplyParameters(parameters.fusion_threshold_bytes, CacheCapacity(parameters));
  if (hierarchical_) {
    hierarchical_->allreduce = parameters.hierarchical_allreduce;
    hierarchical_->allgather = parameters.hierarchical_allgather;
  }
  if (parameter_manager_) parameter_manager_->Applied(std::chrono::steady_clock::now());
}

void Engine::Enqueue(int32_t process_set_id, int64_t handle, std::vector<Request> requests,
                     std::vector<TensorTableEntry> entries) {
  std::shared_ptr<ProcessSet> set = FindSet(process_set_id);
  if (!set) throw UnknownSet(process_set_id);
  auto ranks_text = [&set] { return ShapeString(std::vector<int64_t>(set->ranks.begin(), set->ranks.end())); };
  if (set->set_rank < 0) {
    throw EngineError(Status::InvalidArgument("Rank " + std::to_string(config_.rank) +
                                              " is not a member of process set " + std::to_string(process_set_id) +
                                              " (ranks " + ranks_text() + ") and cannot submit operations on it."));
  }
  const int64_t size = static_cast<int64_t>(set->ranks.size());
  for (const Request& r : requests) {
    if (r.type == RequestType::BROADCAST &&
        !std::binary_search(set->ranks.begin(), set->ranks.end(), r.root_rank)) {
      throw EngineError(Status::InvalidArgument("Broadcast root rank " + std::to_string(r.root_rank) +
                                                " is not a member of process set " + std::to_string(process_set_id) +
                                                " (ranks " + ranks_text() + "); root_rank is a global rank."));
    }
    if (r.type == RequestType::ALLTOALL) {
      const int64_t dim0 = r.shape.empty() ? 0 : r.shape[0];
      if (r.splits.empty()) {
        if (dim0 % size != 0) {
          throw EngineError(Status::InvalidArgument(
              "alltoall: splits were not given and the first dimension (" + std::to_string(dim0) +
              ") is not divisible by the number of workers in the process set (" + std::to_string(size) + ")."));
        }
      } else {
        if (static_cast<int64_t>(r.splits.size()) != size) {
          throw EngineError(Status::InvalidArgument(
              "alltoall: splits must have one entry per member of the process set: expected " + std::to_string(size) +
              " entries, got " + std::to_string(r.splits.size()) + "."));
        }
        int64_t total = 0;
        for (int64_t s : r.splits) {
          if (s < 0) throw EngineError(Status::InvalidArgument("alltoall: splits must not be negative."));
          total += s;
        }
        if (total > dim0) {
          throw EngineError(Status::InvalidArgument("alltoall: the splits add up to " + std::to_string(total) +
                                                    ", more than the first dimension of the tensor (" +
                                                    std::to_string(dim0) + ")."));
        }
      }
    }
    if ((r.type == RequestType::JOIN || r.type == RequestType::ADD_PROCESS_SET ||
         r.type == RequestType::REMOVE_PROCESS_SET) && process_set_id != 0) {
      throw EngineError(Status::InvalidArgument(std::string(RequestTypeName(r.type)) +
                                                " runs on the global process set only."));
    }
  }
  auto state = std::make_shared<HandleState>(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    entries[i].handle = state;
    entries[i].index = i;
  }
  {
    std::lock_guard<std::mutex> lock(handles_mu_);
    handles_[handle] = state;
  }
  try {
    set->queue.Add(std::move(requests), std::move(entries));
  } catch (...) {
    ReleaseHandle(handle);
    throw;
  }
  submissions_.fetch_add(1, std::memory_order_seq_cst);
  if (coalescing_.load(std::memory_order_seq_cst)) return;  // the background thread counts instead
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    wake_ = true;
  }
  wake_cv_.notify_one();
}

void Engine::NotifyWaiting() {
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    waiting_ = true;
    wake_ = true;
  }
  wake_cv_.notify_one();
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
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    wake_ = true;
  }
  wake_cv_.notify_one();
}

void Engine::Shutdown() {
  RequestShutdown("");
  if (thread_.joinable()) thread_.join();
  timeline_.Stop();
}

std::string Engine::DescribeLostRanks() {
  // A killed peer's sockets close while it exits; give it a moment to become a zombie.
  const std::string& my_host = peers_[config_.rank].first;
  std::vector<int> gone;
  for (int attempt = 0; attempt < 40 && gone.empty(); ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
      if (r != config_.rank && peers_[r].first == my_host && ProcessGone(peers_[r].second)) gone.push_back(r);
    }
  }
  if (gone.empty()) return "another rank, which probably exited or was killed";
  std::ostringstream out;
  out << (gone.size() > 1 ? "ranks " : "rank ");
  for (size_t i = 0; i < gone.size(); ++i) {
    out << (i ? ", " : "") << gone[i] << " (pid " << peers_[gone[i]].second << " on " << peers_[gone[i]].first << ")";
  }
  out << (gone.size() > 1 ? ", whose processes have" : ", whose process has") << " exited";
  return out.str();
}

void Engine::BackgroundLoop() {
  Status status;
  bool again = false;
  int idle = 0;  // consecutive cycles that had nothing to do on this rank
  try {
    while (true) {
      // Read every cycle: autotune changes it (ApplyParameters).
      const auto cycle = std::chrono::microseconds(cycle_time_us_.load());
      {
        // An idle rank cycles less and less often (up to 16 cycle times apart): it has nothing to
        // batch, and its own submissions wake it at once. Its cycles only let the others notice a
        // shutdown or a stall, which takes a few milliseconds longer instead of costing a tenth of
        // a core per process while idle.
        const auto wait = cycle * (1 << std::min(idle, 4));
        std::unique_lock<std::mutex> lock(wake_mu_);
        if (!again && wake_cv_.wait_for(lock, wait, [this] { return wake_; }) && !waiting_) {
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
      const auto start = std::chrono::steady_clock::now();
      progress_ = false;
      if (!RunCycle()) break;
      // The cycle time bounds how long submitted work waits; it is not a sleep every operation
      // pays. While this rank has operations waiting for the other ranks, the next cycle starts
      // at once: its negotiation blocks until another rank's cycle meets it (when that rank submits
      // them, or its cycle time expires), so the operations run as soon as the last rank submits.
      // A quick cycle that ran nothing means every rank is waiting on the others (a stall, or
      // ranks that submitted in incompatible orders): then the cycle time applies again, instead
      // of spinning.
      again = false;
      bool waiting = false;
      {
        std::lock_guard<std::mutex> lock(sets_mu_);
        for (auto& [id, set] : sets_) waiting = waiting || (set->controller && !set->queue.Empty());
      }
      if (progress_ || std::chrono::steady_clock::now() - start >= cycle / 4) again = waiting;
      idle = (progress_ || waiting) ? 0 : idle + 1;
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
    status = Status::UnknownError("Horovod lost its connection to " + DescribeLostRanks() +
                                  "; every pending and later collective operation fails. Cause: " + e.what());
    HVD_LOG(ERROR) << status.reason();
  }
  std::vector<std::shared_ptr<ProcessSet>> sets;
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    for (auto& [id, set] : sets_) sets.push_back(set);
  }
  for (auto& set : sets) {
    for (TensorTableEntry& entry : set->queue.Close(status)) entry.handle->Complete(entry.index, status);
  }
  if (status.reason() != kShutdownMessage && !exit_reason_.empty()) HVD_LOG(ERROR) << status.reason();
  // Close every connection now, so that peers blocked on this rank fail at once instead of
  // waiting for their timeout.
  for (auto& set : sets) {
    set->gpu_communicator.reset();
    set->controller.reset();
    set->backend.reset();
  }
  // CUDA resources go on this thread, before the interpreter exits (spec: shutdown runs at exit).
  if (gpu_ != nullptr) gpu_->Release();
}

bool Engine::RunCycle() {
  timeline_.MarkCycleStart();
  std::shared_ptr<ProcessSet> global = FindSet(0);
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(reason_mu_);
    reason = shutdown_reason_;
  }
  ResponseList list =
      global->controller->ComputeResponseList(global->queue.PopRequests(), shutdown_requested_, reason);
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

  std::vector<std::shared_ptr<ProcessSet>> others;
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    for (auto& [id, set] : sets_) {
      if (id != 0 && set->controller) others.push_back(set);
    }
  }
  for (auto& set : others) {
    ResponseList set_list = set->controller->ComputeResponseList(set->queue.PopRequests(), false, "");
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
  if (!list.responses.empty()) progress_ = true;
  for (const Response& response : list.responses) Perform(set, response);
}

std::string Engine::Activity(const char* op) const {
  std::string name = backend_name_;
  for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name + "_" + op;
}

void Engine::Perform(ProcessSet& set, const Response& response) {
  // This rank's entries; a rank that has joined has none for the others' allreduces.
  std::vector<TensorTableEntry> owned(response.names.size());
  std::vector<TensorTableEntry*> entries(response.names.size(), nullptr);
  for (size_t i = 0; i < response.names.size(); ++i) {
    if (set.queue.TryTake(response.names[i], &owned[i])) entries[i] = &owned[i];
  }
  auto complete_all = [&](const Status& status) {
    for (auto* e : entries) {
      if (e) e->handle->Complete(e->index, status);
    }
  };

  const bool record = timeline_.recording();
  if (record) {
    for (const auto& name : response.names) timeline_.ActivityEnd(name);  // QUEUE
  }
  if (response.type == ResponseType::ERROR) {
    if (record) {
      for (const auto& name : response.names) timeline_.End(name);
    }
    complete_all(Status::PreconditionError(response.error_message));
    return;
  }
  const bool joined = set.controller->joined();
  for (size_t i = 0; i < entries.size(); ++i) {
    bool zero_ok = (response.type == ResponseType::ALLREDUCE || response.type == ResponseType::ADASUM) && joined;
    if (!entries[i] && !zero_ok && response.type != ResponseType::JOIN) {
      throw std::logic_error("negotiated tensor '" + response.names[i] + "' is not in this rank's table");
    }
  }
  // Engine-allocated outputs, per entry (empty where the caller gave the output).
  std::vector<std::vector<std::shared_ptr<OutputBuffer>>> outputs(entries.size());
  int64_t value = 0;
  bool has_value = false;
  try {
    // Only tensor operations carry a GPU device (control requests are made with kCpuDevice).
    if (response.device != kCpuDevice) {
      PerformGpu(set, response, entries, outputs);
    } else {
      switch (response.type) {
        case ResponseType::ALLREDUCE:
        case ResponseType::ADASUM: PerformAllreduce(set, response, entries); break;
        case ResponseType::ALLGATHER: PerformAllgather(set, response, entries, outputs); break;
        case ResponseType::BROADCAST: PerformBroadcast(set, response, entries); break;
        case ResponseType::ALLTOALL: PerformAlltoall(set, response, entries, outputs); break;
        case ResponseType::REDUCESCATTER: PerformReducescatter(set, response, entries, outputs); break;
        case ResponseType::BARRIER:
          if (record) timeline_.ActivityStart(response.names[0], Activity("BARRIER").c_str());
          set.backend->Barrier();
          if (record) timeline_.ActivityEnd(response.names[0]);
          break;
        case ResponseType::JOIN:
          value = response.tensor_sizes[0];
          has_value = true;
          break;
        case ResponseType::ADD_PROCESS_SET:
          value = PerformAddProcessSet(response);
          has_value = true;
          break;
        case ResponseType::REMOVE_PROCESS_SET:
          value = PerformRemoveProcessSet(response);
          has_value = true;
          break;
        default:
          throw std::logic_error(std::string("no executor for ") + ResponseTypeName(response.type));
      }
    }
  } catch (const std::exception& e) {
    // The failure ends the engine (BackgroundLoop); these entries are no longer in the queue, so
    // they are failed here.
    if (record) {
      for (const auto& name : response.names) timeline_.End(name);
    }
    complete_all(Status::UnknownError(std::string("Horovod ") + ResponseTypeName(response.type) +
                                      " failed: " + e.what()));
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
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!entries[i]) continue;
    if (has_value) {
      entries[i]->handle->CompleteWithValue(entries[i]->index, value);
    } else {
      entries[i]->handle->Complete(entries[i]->index, Status::OK(), std::move(outputs[i]));
    }
  }
}

void Engine::PerformAllreduce(ProcessSet& set, const Response& response, std::vector<TensorTableEntry*>& entries) {
  const DataType dtype = response.dtype;
  const size_t element_size = DataTypeSize(dtype);
  double postscale = response.postscale_factor;
  ReduceOp op = response.reduce_op;
  if (op == ReduceOp::AVERAGE) {
    postscale /= set.backend->size();
    op = ReduceOp::SUM;
  }
  const bool record = timeline_.recording();
  auto activity_start = [&](const char* activity) {
    if (record) {
      for (const auto& name : response.names) timeline_.ActivityStart(name, activity);
    }
  };
  auto activity_end = [&] {
    if (record) {
      for (const auto& name : response.names) timeline_.ActivityEnd(name);
    }
  };

  int64_t count = 0;
  for (int64_t n : response.tensor_sizes) count += n;
  // Straight from the tensors' own memory, without the fusion buffer, where the backend can (the
  // shared-memory transport's single-copy path) and this rank has every tensor.
  if (response.type != ResponseType::ADASUM && response.prescale_factor == 1.0 &&
      std::none_of(entries.begin(), entries.end(), [](TensorTableEntry* e) { return e == nullptr; }) &&
      set.backend->SupportsPieces(count * static_cast<int64_t>(element_size), entries.size())) {
    std::vector<Piece> pieces;
    pieces.reserve(entries.size());
    for (size_t i = 0; i < entries.size(); ++i) {
      pieces.push_back({entries[i]->input.data, entries[i]->output.data, response.tensor_sizes[i]});
    }
    activity_start(allreduce_activity_.c_str());
    set.backend->AllreducePieces({std::move(pieces), dtype, op, postscale});
    activity_end();
    return;
  }
  // A single tensor of this rank is reduced in its output buffer; several (or a joined rank's
  // zeros) go through the fusion buffer.
  void* buffer;
  const bool direct = entries.size() == 1 && entries[0] != nullptr;
  if (direct) {
    TensorTableEntry& e = *entries[0];
    if (e.output.data != e.input.data) std::memcpy(e.output.data, e.input.data, e.input.num_bytes());
    buffer = e.output.data;
  } else {
    activity_start("MEMCPY_IN_FUSION_BUFFER");
    buffer = fusion_buffer_.Get(count * element_size);
    char* cursor = static_cast<char*>(buffer);
    for (size_t i = 0; i < entries.size(); ++i) {
      const size_t bytes = static_cast<size_t>(response.tensor_sizes[i]) * element_size;
      if (entries[i]) {
        std::memcpy(cursor, entries[i]->input.data, bytes);
      } else {
        std::memset(cursor, 0, bytes);
      }
      cursor += bytes;
    }
    activity_end();
  }
  if (response.prescale_factor != 1.0) Scale(buffer, count, dtype, response.prescale_factor);
  if (response.type == ResponseType::ADASUM) {
    activity_start("ADASUM_ALLREDUCE");
    AdasumAllreduce(*set.backend, buffer, count, dtype);
  } else {
    // The global set's hierarchical path shows as its own activity in the timeline.
    const bool hierarchical = set.id == 0 && hierarchical_ && hierarchical_->allreduce.load(std::memory_order_relaxed);
    activity_start(hierarchical ? "HIERARCHICAL_ALLREDUCE" : allreduce_activity_.c_str());
    set.backend->Allreduce({buffer, count, dtype, op});
  }
  activity_end();
  if (postscale != 1.0) Scale(buffer, count, dtype, postscale);
  if (!direct) {
    activity_start("MEMCPY_OUT_FUSION_BUFFER");
    const char* cursor = static_cast<const char*>(buffer);
    for (size_t i = 0; i < entries.size(); ++i) {
      const size_t bytes = static_cast<size_t>(response.tensor_sizes[i]) * element_size;
      if (entries[i]) std::memcpy(entries[i]->output.data, cursor, bytes);
      cursor += bytes;
    }
    activity_end();
  }
}

void Engine::PerformAllgather(ProcessSet& set, const Response& response, std::vector<TensorTableEntry*>& entries,
                              std::vector<std::vector<std::shared_ptr<OutputBuffer>>>& outputs) {
  const int size = set.backend->size();
  const bool record = timeline_.recording();
  for (size_t t = 0; t < entries.size(); ++t) {
    TensorTableEntry& e = *entries[t];
    const AllgatherLayout layout = MakeAllgatherLayout(response, t, e.input, size);
    auto output = std::make_shared<OutputBuffer>(e.input.dtype, layout.shape);
    if (record) {
      const bool hierarchical = set.id == 0 && hierarchical_ && hierarchical_->allgather.load(std::memory_order_relaxed);
      timeline_.ActivityStart(e.name, hierarchical ? "HIERARCHICAL_ALLGATHER" : Activity("ALLGATHER").c_str());
    }
    set.backend->Allgather({e.input.data, output->data(), layout.bytes_per_rank});
    if (record) timeline_.ActivityEnd(e.name);
    outputs[t].push_back(std::move(output));
  }
}

void Engine::PerformBroadcast(ProcessSet& set, const Response& response, std::vector<TensorTableEntry*>& entries) {
  // root_rank is global; the communicator counts in set ranks.
  auto root_it = std::lower_bound(set.ranks.begin(), set.ranks.end(), response.root_rank);
  const int root = static_cast<int>(root_it - set.ranks.begin());
  const bool record = timeline_.recording();
  for (auto* e : entries) {
    if (e->output.data != e->input.data && set.set_rank == root) {
      std::memcpy(e->output.data, e->input.data, e->input.num_bytes());
    }
    if (record) timeline_.ActivityStart(e->name, Activity("BCAST").c_str());
    set.backend->Broadcast({e->output.data, static_cast<int64_t>(e->output.num_bytes()), root});
    if (record) timeline_.ActivityEnd(e->name);
  }
}

void Engine::PerformAlltoall(ProcessSet& set, const Response& response, std::vector<TensorTableEntry*>& entries,
                             std::vector<std::vector<std::shared_ptr<OutputBuffer>>>& outputs) {
  const int size = set.backend->size();
  const int me = set.set_rank;
  TensorTableEntry& e = *entries[0];
  AlltoallLayout layout = MakeAlltoallLayout(response, e.input, size, me);
  auto output = std::make_shared<OutputBuffer>(e.input.dtype, layout.shape);
  const bool record = timeline_.recording();
  if (record) timeline_.ActivityStart(e.name, Activity("ALLTOALL").c_str());
  set.backend->Alltoall({e.input.data, layout.send_bytes, output->data(), layout.recv_bytes});
  if (record) timeline_.ActivityEnd(e.name);
  outputs[0].push_back(std::move(output));
  outputs[0].push_back(std::move(layout.received_splits));
}

void Engine::PerformReducescatter(ProcessSet& set, const Response& response, std::vector<TensorTableEntry*>& entries,
                                  std::vector<std::vector<std::shared_ptr<OutputBuffer>>>& outputs) {
  const int size = set.backend->size();
  const int me = set.set_rank;
  double postscale = response.postscale_factor;
  ReduceOp op = response.reduce_op;
  if (op == ReduceOp::AVERAGE) {
    postscale /= size;
    op = ReduceOp::SUM;
  }
  const bool record = timeline_.recording();
  for (size_t t = 0; t < entries.size(); ++t) {
    TensorTableEntry& e = *entries[t];
    const DataType dtype = e.input.dtype;
    const size_t element_size = DataTypeSize(dtype);
    const ReducescatterLayout layout = MakeReducescatterLayout(e.input, size, me);
    const std::vector<int64_t>& counts = layout.counts;
    const int64_t count = e.input.num_elements();
    if (record) timeline_.ActivityStart(e.name, "MEMCPY_IN_FUSION_BUFFER");
    void* buffer = fusion_buffer_.Get(static_cast<size_t>(count) * element_size);
    std::memcpy(buffer, e.input.data, static_cast<size_t>(count) * element_size);
    if (record) timeline_.ActivityEnd(e.name);
    if (response.prescale_factor != 1.0) Scale(buffer, count, dtype, response.prescale_factor);
    if (record) timeline_.ActivityStart(e.name, Activity("REDUCESCATTER").c_str());
    set.backend->Reducescatter({buffer, count, counts, dtype, op});
    if (record) timeline_.ActivityEnd(e.name);
    char* mine = static_cast<char*>(buffer) + layout.offset * element_size;
    if (postscale != 1.0) Scale(mine, counts[me], dtype, postscale);
    auto output = std::make_shared<OutputBuffer>(dtype, layout.shape);
    if (record) timeline_.ActivityStart(e.name, "MEMCPY_OUT_FUSION_BUFFER");
    std::memcpy(output->data(), mine, static_cast<size_t>(counts[me]) * element_size);
    if (record) timeline_.ActivityEnd(e.name);
    outputs[t].push_back(std::move(output));
  }
}

int64_t Engine::PerformAddProcessSet(const Response& response) {
  std::vector<int> ranks(response.tensor_sizes.begin(), response.tensor_sizes.end());
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    for (const auto& [id, set] : sets_) {
      if (set->ranks == ranks) return -1;
    }
  }
  int32_t id;
  if (!free_ids_.empty()) {
    id = free_ids_.front();
    free_ids_.pop_front();
  } else {
    id = next_id_++;
  }
  CreateProcessSet(id, ranks);
  return id;
}

int64_t Engine::PerformRemoveProcessSet(const Response& response) {
  const int32_t id = static_cast<int32_t>(response.tensor_sizes[0]);
  std::shared_ptr<ProcessSet> set;
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    auto it = sets_.find(id);
    if (id == 0 || it == sets_.end()) return -1;
    set = it->second;
    sets_.erase(it);
  }
  Status removed = Status::PreconditionError("Process set " + std::to_string(id) +
                                             " was removed while this operation was pending on it.");
  for (TensorTableEntry& entry : set->queue.Close(removed)) entry.handle->Complete(entry.index, removed);
  free_ids_.push_back(id);
  return id;
}

}  // namespace horovod
