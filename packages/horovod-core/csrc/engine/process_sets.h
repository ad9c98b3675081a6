// The process-set registry: the global set (id 0) and every set registered since, each with its
// communicator, controller and tensor queue.
//
// Thread safety: the map is guarded by a mutex; lookups (Find, the queries) run on any thread.
// Creating and removing sets, and everything a set's members do with their communicator and
// controller, happen on the thread running the engine's cycle (the background thread, or a
// waiting caller: engine.h, "Threading contract"), and on the init thread before the first.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backends/communicator.h"
#include "collectives/collective.h"
#include "common/config.h"
#include "common/store.h"
#include "common/tensor_queue.h"
#include "engine/controller.h"
#include "executors/device_executor.h"

namespace horovod {

class Timeline;

// A registered process set. Members have a communicator and a controller; the id and the
// communicators (CPU, and NCCL once a GPU operation ran) are the part the executors see
// (SetCommunicators, executors/device_executor.h).
struct ProcessSet : SetCommunicators {
  std::vector<int> ranks;  // global ranks, sorted
  int set_rank = -1;       // this process's rank in the set; -1 when not a member
  std::unique_ptr<Controller> controller;
  TensorQueue queue;
  // Callers blocked waiting on the set's operations (bindings' wait; deadlock detection, controller.h).
  std::atomic<int> waiters{0};
  bool member() const { return set_rank >= 0; }
};

// Add and Remove are the control operations' view of it (ProcessSetChanges, collectives/collective.h).
class ProcessSetRegistry : public ProcessSetChanges {
 public:
  // `configure` is applied to every new member's controller (the parameters in force).
  ProcessSetRegistry(const Config& config, Store* store, std::string key_prefix, Timeline* timeline,
                     std::function<void(Controller&)> configure);

  // Registers the global set over `communicator` (id 0).
  void CreateGlobal(std::unique_ptr<Communicator> communicator);
  // Collective over the global set: registers the static sets of hvd.init(process_sets=...), ids
  // 1, 2, ... in order.
  void CreateStatic(const std::vector<std::vector<int>>& process_sets);
  // Collective over the global set, at the same point of every rank's sequence: registers a set of
  // `ranks` (global, sorted) and returns its id (removed ids are reused, oldest first), or -1 when a
  // set of these ranks exists.
  int64_t Add(const std::vector<int>& ranks) override;
  // Removes set `id`, failing its pending operations; returns `id`, or -1 for the global set or an
  // unknown id.
  int64_t Remove(int32_t id) override;

  std::shared_ptr<ProcessSet> Find(int32_t id);
  // Throw EngineError(INVALID_ARGUMENT) for an unknown set (and, Member, a set this rank is not in;
  // `action` ends the message, e.g. " and cannot submit operations on it").
  std::shared_ptr<ProcessSet> Require(int32_t id);
  std::shared_ptr<ProcessSet> RequireMember(int32_t id, const std::string& action = "");
  std::map<int32_t, std::vector<int>> Ranks();
  // Every set, or (members) the sets this rank belongs to, in id order.
  std::vector<std::shared_ptr<ProcessSet>> All();
  std::vector<std::shared_ptr<ProcessSet>> Members();
  // Whether any set this rank belongs to has operations waiting.
  bool AnyWaiting();
  // Whether a caller of this rank is blocked waiting on an operation of any set.
  bool AnyCallerWaiting();

 private:
  void Create(int32_t id, const std::vector<int>& ranks);

  const Config& config_;
  Store* store_;
  std::string key_prefix_;
  Timeline* timeline_;  // global rank 0 only
  std::function<void(Controller&)> configure_;
  std::mutex mu_;  // guards the map (members are used by the thread running the cycle only)
  std::map<int32_t, std::shared_ptr<ProcessSet>> sets_;
  std::deque<int32_t> free_ids_;  // removed ids, reused oldest-freed first
  int32_t next_id_ = 1;
  int64_t sets_created_ = 0;  // names each set's rendezvous keys
};

}  // namespace horovod
