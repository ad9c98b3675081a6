#include "tensor_queue.h"

#include <cstdlib>
#include <new>
#include <stdexcept>

namespace horovod {

namespace {
constexpr size_t kAlignment = 64;  // TensorFlow requires 64-byte aligned buffers
}

OutputBuffer::OutputBuffer(DataType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  size_t bytes = num_bytes();
  size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  data_ = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
  if (data_ == nullptr) throw std::bad_alloc();
}

OutputBuffer::OutputBuffer(DataType dtype, std::vector<int64_t> shape, int32_t device, std::shared_ptr<void> memory)
    : data_(memory.get()), dtype_(dtype), shape_(std::move(shape)), device_(device), device_memory_(std::move(memory)) {}

OutputBuffer::~OutputBuffer() {
  if (!device_memory_) std::free(data_);
}

void HandleState::Complete(size_t index, const Status& status, std::vector<std::shared_ptr<OutputBuffer>> outputs) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!status.ok() && status_.ok()) status_ = status;
    outputs_[index] = std::move(outputs);
    --remaining_;
  }
  cv_.notify_all();
}

void HandleState::CompleteWithValue(size_t index, int64_t value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    has_value_ = true;
    value_ = value;
  }
  Complete(index, Status::OK());
}

bool HandleState::has_value() {
  std::lock_guard<std::mutex> lock(mu_);
  return has_value_;
}

int64_t HandleState::value() {
  std::lock_guard<std::mutex> lock(mu_);
  return value_;
}

bool HandleState::done() {
  std::lock_guard<std::mutex> lock(mu_);
  return remaining_ == 0;
}

bool HandleState::WaitFor(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [this] { return remaining_ == 0; });
}

Status HandleState::status() {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

std::vector<std::vector<std::shared_ptr<OutputBuffer>>> HandleState::outputs() {
  std::lock_guard<std::mutex> lock(mu_);
  return outputs_;
}

void TensorQueue::Add(std::vector<Request> requests, std::vector<TensorTableEntry> entries) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) throw EngineError(close_status_);
  for (size_t i = 0; i < entries.size(); ++i) {
    bool duplicate = table_.count(entries[i].name) > 0;
    for (size_t j = 0; j < i && !duplicate; ++j) duplicate = entries[j].name == entries[i].name;
    if (duplicate) {
      throw EngineError(Status::InvalidArgument(
          "A tensor named '" + entries[i].name +
          "' is already being processed by Horovod on this rank. Tensor names must be unique among the "
          "operations in flight: give each concurrent operation its own name."));
    }
  }
  for (auto& entry : entries) {
    std::string name = entry.name;
    table_.emplace(std::move(name), std::move(entry));
  }
  for (auto& request : requests) pending_.push_back(std::move(request));
}

std::vector<Request> TensorQueue::PopRequests() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Request> out;
  out.swap(pending_);
  return out;
}

bool TensorQueue::Peek(const std::string& name, const void** input, void** output) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = table_.find(name);
  if (it == table_.end()) return false;
  *input = it->second.input.data;
  *output = it->second.output.data;
  return true;
}

bool TensorQueue::TryTake(const std::string& name, TensorTableEntry* entry) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = table_.find(name);
  if (it == table_.end()) return false;
  *entry = std::move(it->second);
  table_.erase(it);
  return true;
}

bool TensorQueue::Empty() {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.empty();
}

std::vector<TensorTableEntry> TensorQueue::Close(const Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!closed_) {
    closed_ = true;
    close_status_ = status;
  }
  std::vector<TensorTableEntry> out;
  out.reserve(table_.size());
  for (auto& [name, entry] : table_) out.push_back(std::move(entry));
  table_.clear();
  pending_.clear();
  return out;
}

}  // namespace horovod
