#include "test_support.h"

#include <gtest/gtest.h>

#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <unistd.h>

#include "backends/shm/shared_memory.h"
#include "common/config.h"

namespace horovod::testing {

void RunRanks(int size, const std::function<void(int rank)>& fn) {
  std::vector<std::string> failures(size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        fn(rank);
      } catch (const std::exception& e) {
        failures[rank] = e.what();
      } catch (...) {
        failures[rank] = "unknown exception";
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < size; ++rank) {
    if (!failures[rank].empty()) ADD_FAILURE() << "rank " << rank << " of " << size << ": " << failures[rank];
  }
}

BackendOptions LoopbackOptions(int rank, int size, Store* store, const std::string& key_prefix) {
  BackendOptions options;
  options.rank = rank;
  options.size = size;
  options.store = store;
  options.key_prefix = key_prefix;
  options.gloo.hostname = "127.0.0.1";
  options.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(kRankTimeout);
  return options;
}

void RunBackends(int size, bool shared_memory, const std::function<void(int rank, Communicator& backend)>& fn) {
  auto store = std::make_shared<MemoryStore>();
  RunRanks(size, [&](int rank) {
    BackendOptions options = LoopbackOptions(rank, size, store.get(), "test/");
    std::unique_ptr<Communicator> backend = BackendRegistry::Create("gloo", options);
    if (shared_memory) {
      // Every rank is a thread of this process: one pid for all.
      std::vector<int64_t> pids(size, static_cast<int64_t>(::getpid()));
      bool single_copy = true;
      std::string why;
      std::unique_ptr<Communicator> shared = MakeSharedMemoryBackend(backend, pids, options, &single_copy, &why);
      if (!shared) throw std::runtime_error("shared memory transport not created: " + why);
      backend = std::move(shared);
    }
    fn(rank, *backend);
    // No rank closes its connections while others may still use the mesh (or its device, which
    // communicators split from it share): a peer that goes away is an error to Gloo.
    backend->Barrier();
  });
}

EngineGroup::EngineGroup(int size, const std::map<std::string, std::string>& env) : engines_(size) {
  auto store = std::make_shared<MemoryStore>();
  RunRanks(size, [&](int rank) {
    std::map<std::string, std::string> vars = env;
    vars["HOROVOD_RANK"] = vars["HOROVOD_LOCAL_RANK"] = std::to_string(rank);
    vars["HOROVOD_SIZE"] = vars["HOROVOD_LOCAL_SIZE"] = std::to_string(size);
    vars.emplace("HOROVOD_GLOO_TIMEOUT_SECONDS", std::to_string(kRankTimeout.count()));
    engines_[rank] = Engine::Start(ParseConfig(vars), std::make_unique<SharedStore>(store), "test/", {});
  });
  for (const auto& engine : engines_) {
    if (!engine) throw std::runtime_error("an engine of the group did not start");
  }
}

EngineGroup::~EngineGroup() {
  RunRanks(size(), [&](int rank) {
    if (engines_[rank]) engines_[rank]->Shutdown();
  });
}

void EngineGroup::Run(const std::function<void(int rank, Engine& engine)>& fn) {
  RunRanks(size(), [&](int rank) { fn(rank, *engines_[rank]); });
}

std::shared_ptr<HandleState> SubmitAndWait(Engine& engine, std::vector<Request> requests,
                                           std::vector<TensorTableEntry> entries, int32_t process_set_id) {
  const int64_t handle = engine.Enqueue(process_set_id, std::move(requests), std::move(entries));
  std::shared_ptr<HandleState> state = engine.GetHandle(handle);
  // As the Python binding waits (bindings.cc): Engine::Wait in rounds of 100 ms.
  engine.WaitStarted(process_set_id);
  const auto deadline = std::chrono::steady_clock::now() + kRankTimeout;
  bool done = false;
  while (!done && std::chrono::steady_clock::now() < deadline) done = engine.Wait(*state, std::chrono::milliseconds(100));
  engine.WaitEnded(process_set_id);
  engine.ReleaseHandle(handle);
  if (!done) throw std::runtime_error("handle " + std::to_string(handle) + " did not finish in time");
  return state;
}

Request MakeRequest(OpType type, const std::string& name, DataType dtype, std::vector<int64_t> shape) {
  Request request;
  request.type = type;
  request.name = name;
  request.dtype = dtype;
  request.shape = std::move(shape);
  return request;
}

TensorTableEntry MakeEntry(const std::string& name, void* input, void* output, DataType dtype,
                           std::vector<int64_t> shape) {
  TensorTableEntry entry;
  entry.name = name;
  entry.input.data = input;
  entry.input.dtype = dtype;
  entry.input.shape = shape;
  if (output != nullptr) {
    entry.output.data = output;
    entry.output.dtype = dtype;
    entry.output.shape = std::move(shape);
  }
  return entry;
}

}  // namespace horovod::testing
