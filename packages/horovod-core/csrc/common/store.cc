#include "store.h"

#include <chrono>
#include <stdexcept>

namespace horovod {

void MemoryStore::Set(const std::string& key, const std::vector<char>& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = value;
  }
  cv_.notify_all();
}

std::vector<char> MemoryStore::Get(const std::string& key) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, std::chrono::seconds(30), [&] { return values_.count(key) > 0; })) {
    throw std::runtime_error("in-memory store: timed out waiting for key '" + key + "'");
  }
  return values_.at(key);
}

}  // namespace horovod
