#include "backend.h"

#include <map>

namespace horovod {

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
