// The engine: one object per initialised Horovod, owning the backend, the tensor queue, the
// controller, the fusion buffer and the background thread.
//
// Threading contract.
// - Caller threads (any Python thread): Start (rendezvous and backend creation run here),
//   NewHandle, Enqueue, GetHandle/ReleaseHandle, Shutdown and the read-only getters. Enqueue only
//   takes the queue's mutex and wakes the background thread; it never blocks on the network.
// - The background thread runs cycles: it waits at most HOROVOD_CYCLE_TIME ms (less when work is
//   enqueued), negotiates the requests queued since the last cycle, executes the agreed responses
//   through the backend, and completes their handles. It is the only thread that touches the
//   backend, the controller and the fusion buffer after Start returns.
// - The cycle ends for good when any rank asked for shutdown (the flag travels with negotiation, so
//   every rank stops in the same cycle) or when the backend fails (a peer was lost). Then the queue
//   is closed: pending and later operations fail with an error saying why.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "backend.h"
#include "config.h"
#include "controller.h"
#include "fusion.h"
#include "store.h"
#include "tensor_queue.h"

namespace horovod {

class Engine {
 public:
  // Creates the backend named by the config (rendezvous through `store`, which is only used during
  // this call) and starts the background thread. Throws EngineError or std::exception on failure.
  static std::unique_ptr<Engine> Start(const Config& config, Store* store, const std::string& key_prefix);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Handles come from one counter per engine: 1, 2, 3, ...
  int64_t NewHandle() { return ++last_handle_; }
  // Registers `handle` for `entries` and queues their requests. Throws EngineError: INVALID_ARGUMENT
  // for caller mistakes, or the shutdown/failure status once the engine has stopped.
  void Enqueue(int64_t handle, std::vector<Request> requests, std::vector<TensorTableEntry> entries);
  // Returns the state of a handle, or nullptr when the handle is unknown.
  std::shared_ptr<HandleState> GetHandle(int64_t handle);
  void ReleaseHandle(int64_t handle);

  // Asks every rank to stop (through negotiation), waits for the background thread, and fails
  // whatever is still pending. Safe to call more than once.
  void Shutdown();

  const Config& config() const { return config_; }
  bool is_homogeneous() const { return homogeneous_; }
  const char* backend_name() const { return backend_->name(); }

 private:
  Engine(const Config& config, std::unique_ptr<Backend> backend);
  void BackgroundLoop();
  bool RunCycle();
  void Perform(const Response& response);
  void PerformAllreduce(const Response& response, std::vector<TensorTableEntry>& entries);
  void PerformAllgather(const Response& response, std::vector<TensorTableEntry>& entries,
                        std::vector<std::shared_ptr<OutputBuffer>>& outputs);
  void PerformBroadcast(const Response& response, std::vector<TensorTableEntry>& entries);

  Config config_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Controller> controller_;
  TensorQueue queue_;
  FusionBuffer fusion_buffer_;
  bool homogeneous_ = true;

  std::atomic<int64_t> last_handle_{0};
  std::mutex handles_mu_;
  std::unordered_map<int64_t, std::shared_ptr<HandleState>> handles_;

  std::mutex wake_mu_;
  std::condition_variable wake_cv_;
  bool wake_ = false;
  std::atomic<bool> shutdown_requested_{false};
  std::thread thread_;
};

// Text of the error every pending and later operation gets after a shutdown.
extern const char* const kShutdownMessage;

}  // namespace horovod
