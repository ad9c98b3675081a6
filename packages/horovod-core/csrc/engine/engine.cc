#include "engine.h"

#include <cstring>
#include <stdexcept>

#include "logging.h"
#include "reduction.h"

namespace horovod {

const char* const kShutdownMessage =
    "Horovod has been shut down. This was caused by an exception on one of the ranks or an attempt to "
    "run a collective operation after one of the ranks finished execution. If the shutdown was caused "
    "by an exception, you should see the exception in the log before the first shutdown message.";

namespace {

std::string CpuBackendName(const Config& config) {
  if (!config.cpu_operations.empty()) return config.cpu_operations;
  if (!config.controller.empty()) return config.controller;
  return "gloo";
}

// Exchanges each rank's local size to learn whether every host runs the same number of ranks.
bool ComputeHomogeneous(Backend& backend, int local_size) {
  std::vector<char> mine(sizeof(int));
  std::memcpy(mine.data(), &local_size, sizeof(int));
  std::vector<std::vector<char>> all = backend.Gatherv(mine, 0);
  std::vector<char> verdict(1, 1);
  if (backend.rank() == 0) {
    for (const auto& bytes : all) {
      int theirs;
      std::memcpy(&theirs, bytes.data(), sizeof(int));
      if (theirs != local_size) verdict[0] = 0;
    }
  }
  backend.Broadcast(verdict, 0);
  return verdict[0] != 0;
}

}  // namespace

std::unique_ptr<Engine> Engine::Start(const Config& config, Store* store, const std::string& key_prefix) {
  SetLogLevel(config.log_level, config.log_hide_time);
  BackendOptions options;
  options.rank = config.rank;
  options.size = config.size;
  options.store = store;
  options.key_prefix = key_prefix;
  options.iface = config.gloo_iface;
  options.hostname = config.local_size == config.size ? "127.0.0.1" : config.hostname;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(config.gloo_timeout_seconds * 1000));
  std::unique_ptr<Backend> backend = BackendRegistry::Create(CpuBackendName(config), options);
  std::unique_ptr<Engine> engine(new Engine(config, std::move(backend)));
  engine->homogeneous_ = ComputeHomogeneous(*engine->backend_, config.local_size);
  engine->thread_ = std::thread(&Engine::BackgroundLoop, engine.get());
  HVD_LOG(INFO) << "Horovod initialized: rank " << config.rank << " of " << config.size << ", backend "
                << engine->backend_->name();
  return engine;
}

Engine::Engine(const Config& config, std::unique_ptr<Backend> backend)
    : config_(config), backend_(std::move(backend)), controller_(new Controller(*backend_, config_)) {}

Engine::~Engine() { Shutdown(); }

void Engine::Enqueue(int64_t handle, std::vector<Request> requests, std::vector<TensorTableEntry> entries) {
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
    queue_.Add(std::move(requests), std::move(entries));
  } catch (...) {
    ReleaseHandle(handle);
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
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

void Engine::Shutdown() {
  shutdown_requested_ = true;
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    wake_ = true;
  }
  wake_cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void Engine::BackgroundLoop() {
  Status status = Status::UnknownError(kShutdownMessage);
  const auto cycle = std::chrono::microseconds(static_cast<int64_t>(config_.cycle_time_ms * 1000));
  try {
    while (true) {
      {
        std::unique_lock<std::mutex> lock(wake_mu_);
        wake_cv_.wait_for(lock, cycle, [this] { return wake_; });
        wake_ = false;
      }
      if (!RunCycle()) break;
    }
  } catch (const std::exception& e) {
    status = Status::UnknownError(
        std::string("Horovod lost its connection to another rank, which probably exited or was killed; "
                    "every pending and later collective operation fails. Cause: ") +
        e.what());
    HVD_LOG(ERROR) << status.reason();
  }
  for (TensorTableEntry& entry : queue_.Close(status)) entry.handle->Complete(entry.index, status);
}

bool Engine::RunCycle() {
  ResponseList list = controller_->ComputeResponseList(queue_.PopRequests(), shutdown_requested_);
  for (const Response& response : list.responses) Perform(response);
  return !list.shutdown;
}

void Engine::Perform(const Response& response) {
  std::vector<TensorTableEntry> entries;
  entries.reserve(response.names.size());
  for (const auto& name : response.names) entries.push_back(queue_.Take(name));

  if (response.type == ResponseType::ERROR) {
    for (auto& e : entries) e.handle->Complete(e.index, Status::PreconditionError(response.error_message));
    return;
  }
  // Engine-allocated outputs, one per entry (null where the caller gave the output).
  std::vector<std::shared_ptr<OutputBuffer>> outputs(entries.size());
  try {
    switch (response.type) {
      case ResponseType::ALLREDUCE: PerformAllreduce(response, entries); break;
      case ResponseType::ALLGATHER: PerformAllgather(response, entries, outputs); break;
      case ResponseType::BROADCAST: PerformBroadcast(response, entries); break;
      default:
        // The binding enqueues nothing else; reaching this is a bug, which ends the engine.
        throw std::logic_error(std::string("no executor for ") + ResponseTypeName(response.type));
    }
  } catch (const std::exception& e) {
    // The failure ends the engine (BackgroundLoop); these entries are no longer in the queue, so
    // they are failed here.
    Status status = Status::UnknownError(std::string("Horovod ") + ResponseTypeName(response.type) +
                                         " failed: " + e.what());
    for (auto& entry : entries) entry.handle->Complete(entry.index, status);
    throw;
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    entries[i].handle->Complete(entries[i].index, Status::OK(), std::move(outputs[i]));
  }
}

void Engine::PerformAllreduce(const Response& response, std::vector<TensorTableEntry>& entries) {
  const DataType dtype = response.dtype;
  const size_t element_size = DataTypeSize(dtype);
  double postscale = response.postscale_factor;
  ReduceOp op = response.reduce_op;
  if (op == ReduceOp::AVERAGE) {
    postscale /= backend_->size();
    op = ReduceOp::SUM;
  }

  // A single tensor is reduced in its output buffer; several go through the fusion buffer.
  void* buffer;
  int64_t count = 0;
  for (const auto& e : entries) count += e.input.num_elements();
  if (entries.size() == 1) {
    TensorTableEntry& e = entries[0];
    if (e.output.data != e.input.data) std::memcpy(e.output.data, e.input.data, e.input.num_bytes());
    buffer = e.output.data;
  } else {
    buffer = fusion_buffer_.Get(count * element_size);
    char* cursor = static_cast<char*>(buffer);
    for (const auto& e : entries) {
      std::memcpy(cursor, e.input.data, e.input.num_bytes());
      cursor += e.input.num_bytes();
    }
  }
  if (response.prescale_factor != 1.0) Scale(buffer, count, dtype, response.prescale_factor);
  backend_->Allreduce(buffer, count, dtype, op);
  if (postscale != 1.0) Scale(buffer, count, dtype, postscale);
  if (entries.size() > 1) {
    const char* cursor = static_cast<const char*>(buffer);
    for (const auto& e : entries) {
      std::memcpy(e.output.data, cursor, e.output.num_bytes());
      cursor += e.output.num_bytes();
    }
  }
}

void Engine::PerformAllgather(const Response& response, std::vector<TensorTableEntry>& entries,
                              std::vector<std::shared_ptr<OutputBuffer>>& outputs) {
  const int size = backend_->size();
  for (size_t t = 0; t < entries.size(); ++t) {
    TensorTableEntry& e = entries[t];
    std::vector<int64_t> row_shape(e.input.shape.begin() + 1, e.input.shape.end());
    const int64_t row_bytes = NumElements(row_shape) * static_cast<int64_t>(DataTypeSize(e.input.dtype));
    std::vector<int64_t> bytes_per_rank(size);
    int64_t rows = 0;
    for (int r = 0; r < size; ++r) {
      int64_t dim0 = response.tensor_sizes[t * size + r];
      bytes_per_rank[r] = dim0 * row_bytes;
      rows += dim0;
    }
    std::vector<int64_t> out_shape = e.input.shape;
    out_shape[0] = rows;
    outputs[t] = std::make_shared<OutputBuffer>(e.input.dtype, out_shape);
    backend_->Allgatherv(e.input.data, outputs[t]->data(), bytes_per_rank);
  }
}

void Engine::PerformBroadcast(const Response& response, std::vector<TensorTableEntry>& entries) {
  for (auto& e : entries) {
    if (e.output.data != e.input.data && backend_->rank() == response.root_rank) {
      std::memcpy(e.output.data, e.input.data, e.input.num_bytes());
    }
    backend_->Broadcast(e.output.data, static_cast<int64_t>(e.output.num_bytes()), response.root_rank);
  }
}

}  // namespace horovod
