// The engine's rendezvous Store (blocking Get) seen through Gloo's store interface, under a prefix.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/store.h"

namespace horovod::gloo_backend {

class StoreAdapter : public gloo::rendezvous::Store {
 public:
  StoreAdapter(horovod::Store& store, std::string prefix) : store_(store), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::vector<char>& data) override { store_.Set(prefix_ + key, data); }
  std::vector<char> get(const std::string& key) override { return store_.Get(prefix_ + key); }
  void wait(const std::vector<std::string>& keys) override {
    for (const auto& key : keys) store_.Get(prefix_ + key);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override { wait(keys); }

 private:
  horovod::Store& store_;
  std::string prefix_;
};

}  // namespace horovod::gloo_backend
