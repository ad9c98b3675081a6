// Helpers of the engine's unit tests: ranks as threads of one process. A group of N ranks is N
// threads that each own a communicator (or a whole Engine), rendezvousing through one in-memory
// store, with Gloo's TCP transport over loopback.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/communicator.h"
#include "backends/registry.h"
#include "common/common.h"
#include "engine/engine.h"
#include "common/message.h"
#include "common/store.h"

namespace horovod::testing {

// How long a rank waits for its peers before the test fails instead of hanging.
constexpr std::chrono::seconds kRankTimeout{60};

// A Store that forwards to one MemoryStore shared by the ranks of a group (Engine::Start takes
// ownership of its store, so each rank gets its own forwarder).
class SharedStore : public Store {
 public:
  explicit SharedStore(std::shared_ptr<MemoryStore> store) : store_(std::move(store)) {}
  void Set(const std::string& key, const std::vector<char>& value) override { store_->Set(key, value); }
  std::vector<char> Get(const std::string& key) override { return store_->Get(key); }

 private:
  std::shared_ptr<MemoryStore> store_;
};

// Runs fn(rank) for every rank of `size` on its own thread, all at once, and joins them. An
// exception on a rank becomes a test failure naming the rank.
void RunRanks(int size, const std::function<void(int rank)>& fn);

// Options of a Gloo communicator of rank `rank` of `size` over loopback, rendezvousing through
// `store` under `key_prefix`, with kRankTimeout.
BackendOptions LoopbackOptions(int rank, int size, Store* store, const std::string& key_prefix);

// Creates, on every rank's thread, a Gloo communicator of `size` ranks over loopback (and, with
// `shared_memory`, the shared-memory transport wrapping it), then runs fn(rank, backend), then
// a barrier (so that every rank keeps its communicator until all are done).
void RunBackends(int size, bool shared_memory, const std::function<void(int rank, Communicator& backend)>& fn);

// N engines started by N threads (Engine::Start is collective), configured from `env` (HOROVOD_*
// variables through the knob table, as a launched process would be) plus the topology of one
// host. The destructor shuts them down, again concurrently.
class EngineGroup {
 public:
  EngineGroup(int size, const std::map<std::string, std::string>& env);
  ~EngineGroup();
  EngineGroup(const EngineGroup&) = delete;
  EngineGroup& operator=(const EngineGroup&) = delete;
  int size() const { return static_cast<int>(engines_.size()); }
  Engine& engine(int rank) { return *engines_[rank]; }
  // Runs fn(rank, engine) on one thread per rank (see RunRanks).
  void Run(const std::function<void(int rank, Engine& engine)>& fn);

 private:
  std::vector<std::unique_ptr<Engine>> engines_;
};

// Enqueues `requests` with their table entries as one handle on `engine` and waits for it (at
// most kRankTimeout). Returns the handle's state; throws std::runtime_error when it does not
// finish in time.
std::shared_ptr<HandleState> SubmitAndWait(Engine& engine, std::vector<Request> requests,
                                           std::vector<TensorTableEntry> entries, int32_t process_set_id = 0);

Request MakeRequest(OpType type, const std::string& name, DataType dtype, std::vector<int64_t> shape);
TensorTableEntry MakeEntry(const std::string& name, void* input, void* output, DataType dtype,
                           std::vector<int64_t> shape);

}  // namespace horovod::testing
