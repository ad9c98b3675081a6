#include "backend.h"

#include <cstring>
#include <map>

namespace horovod {

void Backend::AllreduceBitsAnd(std::vector<uint64_t>& words) {
  if (size_ == 1) return;
  std::vector<char> mine(words.size() * sizeof(uint64_t));
  std::memcpy(mine.data(), words.data(), mine.size());
  std::vector<std::vector<char>> all = Gatherv(mine, 0);
  std::vector<char> result;
  if (rank_ == 0) {
    for (const auto& theirs : all) {
      if (theirs.size() != mine.size()) throw std::runtime_error("control plane: bit vectors of different lengths");
      for (size_t i = 0; i < words.size(); ++i) {
        uint64_t w;
        std::memcpy(&w, theirs.data() + i * sizeof(uint64_t), sizeof(uint64_t));
        words[i] &= w;
      }
    }
    result.resize(mine.size());
    std::memcpy(result.data(), words.data(), result.size());
  }
  Broadcast(result, 0);
  std::memcpy(words.data(), result.data(), result.size());
}

void Backend::Reducescatter(void* buffer, int64_t count, const std::vector<int64_t>&, DataType dtype, ReduceOp op) {
  Allreduce(buffer, count, dtype, op);
}

namespace {
std::map<std::string, BackendFactory>& Factories() {
  static std::map<std::string, BackendFactory> factories;
  return factories;
}
}  // namespace

bool BackendRegistry::Register(const std::string& name, BackendFactory factory) {
  Factories()[name] = std::move(factory);
  return true;
}

bool BackendRegistry::Built(const std::string& name) { return Factories().count(name) > 0; }

std::vector<std::string> BackendRegistry::Names() {
  std::vector<std::string> names;
  for (const auto& [name, factory] : Factories()) names.push_back(name);
  return names;
}

std::unique_ptr<Backend> BackendRegistry::Create(const std::string& name, const BackendOptions& options) {
  auto it = Factories().find(name);
  if (it == Factories().end()) {
    std::string built;
    for (const auto& n : Names()) built += (built.empty() ? "" : ", ") + n;
    throw EngineError(Status::PreconditionError("Horovod was not built with the " + name +
                                                " backend (built backends: " + (built.empty() ? "none" : built) +
                                                ")."));
  }
  return it->second(options);
}

}  // namespace horovod
