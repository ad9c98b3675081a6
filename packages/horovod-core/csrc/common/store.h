// The key-value store backends rendezvous through. The Python binding supplies one backed by the
// launcher's authenticated rendezvous service; single-process jobs use MemoryStore.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace horovod {

class Store {
 public:
  virtual ~Store() = default;
  virtual void Set(const std::string& key, const std::vector<char>& value) = 0;
  // Blocks until `key` exists; throws std::runtime_error when the store's timeout passes first.
  virtual std::vector<char> Get(const std::string& key) = 0;
};

class MemoryStore : public Store {
 public:
  void Set(const std::string& key, const std::vector<char>& value) override;
  std::vector<char> Get(const std::string& key) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<char>> values_;
};

}  // namespace horovod
