#include "engine/process_sets.h"

#include <algorithm>
#include <sstream>

#include "backends/communicator_stack.h"
#include "common/timeline.h"

namespace horovod {

ProcessSetRegistry::ProcessSetRegistry(const Config& config, Store* store, std::string key_prefix, Timeline* timeline,
                                       std::function<void(Controller&)> configure)
    : config_(config),
      store_(store),
      key_prefix_(std::move(key_prefix)),
      timeline_(timeline),
      configure_(std::move(configure)) {}

void ProcessSetRegistry::CreateGlobal(std::unique_ptr<Communicator> communicator) {
  auto set = std::make_shared<ProcessSet>();
  set->id = 0;
  for (int r = 0; r < communicator->size(); ++r) set->ranks.push_back(r);
  set->set_rank = communicator->rank();
  set->communicator = std::move(communicator);
  set->controller = std::make_unique<Controller>(*set->communicator, set->ranks, config_, timeline_, 0);
  std::lock_guard<std::mutex> lock(mu_);
  sets_[0] = std::move(set);
}

namespace {

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

EngineError UnknownSet(int32_t id) {
  return EngineError(Status::InvalidArgument("Process set " + std::to_string(id) +
                                             " is not known to Horovod: it was never registered, or it was removed."));
}

}  // namespace

void ProcessSetRegistry::CreateStatic(const std::vector<std::vector<int>>& process_sets) {
  Communicator& global = *Find(0)->communicator;
  for (const auto& ranks : process_sets) {
    for (int r : ranks) {
      if (r < 0 || r >= global.size()) {
        throw EngineError(Status::InvalidArgument("Process set rank " + std::to_string(r) +
                                                  " is out of range: expected 0 <= rank < " +
                                                  std::to_string(global.size()) + "."));
      }
    }
  }
  std::vector<char> mine = PackInts(process_sets);
  std::vector<std::vector<char>> everywhere = AllgatherBytes(global, mine);
  for (int r = 0; r < global.size(); ++r) {
    if (everywhere[r] != mine) {
      throw EngineError(Status::InvalidArgument(
          "hvd.init(process_sets=...) must be given the same process sets on every rank; rank " +
          std::to_string(global.rank()) + " has " + std::string(mine.begin(), mine.end()) + " but rank " +
          std::to_string(r) + " has " + std::string(everywhere[r].begin(), everywhere[r].end()) + "."));
    }
  }
  for (const auto& ranks : process_sets) Create(next_id_++, ranks);
}

void ProcessSetRegistry::Create(int32_t id, const std::vector<int>& ranks) {
  std::shared_ptr<ProcessSet> global = Find(0);
  auto set = std::make_shared<ProcessSet>();
  set->id = id;
  set->ranks = ranks;
  auto it = std::find(ranks.begin(), ranks.end(), config_.rank);
  set->set_rank = it == ranks.end() ? -1 : static_cast<int>(it - ranks.begin());
  BackendOptions options =
      CommunicatorOptions(config_, store_, key_prefix_ + "set" + std::to_string(++sets_created_) + ".");
  set->communicator = global->communicator->Split(ranks, options);
  if (set->communicator) {
    set->controller = std::make_unique<Controller>(*set->communicator, ranks, config_, timeline_, id);
    configure_(*set->controller);
  }
  std::lock_guard<std::mutex> lock(mu_);
  sets_[id] = std::move(set);
}

int64_t ProcessSetRegistry::Add(const std::vector<int>& ranks) {
  {
    std::lock_guard<std::mutex> lock(mu_);
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
  Create(id, ranks);
  return id;
}

int64_t ProcessSetRegistry::Remove(int32_t id) {
  std::shared_ptr<ProcessSet> set;
  {
    std::lock_guard<std::mutex> lock(mu_);
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

std::shared_ptr<ProcessSet> ProcessSetRegistry::Find(int32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  return it == sets_.end() ? nullptr : it->second;
}

std::shared_ptr<ProcessSet> ProcessSetRegistry::Require(int32_t id) {
  std::shared_ptr<ProcessSet> set = Find(id);
  if (!set) throw UnknownSet(id);
  return set;
}

std::shared_ptr<ProcessSet> ProcessSetRegistry::RequireMember(int32_t id, const std::string& action) {
  std::shared_ptr<ProcessSet> set = Require(id);
  if (!set->member()) {
    throw EngineError(Status::InvalidArgument(
        "Rank " + std::to_string(config_.rank) + " is not a member of process set " + std::to_string(id) + " (ranks " +
        ShapeString(std::vector<int64_t>(set->ranks.begin(), set->ranks.end())) + ")" + action + "."));
  }
  return set;
}

std::map<int32_t, std::vector<int>> ProcessSetRegistry::Ranks() {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<int32_t, std::vector<int>> out;
  for (const auto& [id, set] : sets_) out[id] = set->ranks;
  return out;
}

std::vector<std::shared_ptr<ProcessSet>> ProcessSetRegistry::All() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<ProcessSet>> out;
  for (const auto& [id, set] : sets_) out.push_back(set);
  return out;
}

std::vector<std::shared_ptr<ProcessSet>> ProcessSetRegistry::Members() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<ProcessSet>> out;
  for (const auto& [id, set] : sets_) {
    if (set->controller) out.push_back(set);
  }
  return out;
}

bool ProcessSetRegistry::AnyWaiting() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, set] : sets_) {
    if (set->controller && !set->queue.Empty()) return true;
  }
  return false;
}

bool ProcessSetRegistry::AnyCallerWaiting() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, set] : sets_) {
    if (set->waiters.load() > 0) return true;
  }
  return false;
}

}  // namespace horovod
