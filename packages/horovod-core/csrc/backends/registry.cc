#include "backends/registry.h"

#include <map>

namespace horovod {
namespace {

std::map<std::string, BackendFactory>& Factories() {
  static std::map<std::string, BackendFactory> factories;
  return factories;
}

std::map<std::string, BackendPlugin>& Plugins() {
  static std::map<std::string, BackendPlugin> plugins;
  return plugins;
}

// Plugin `name`, or null when none of that name is registered.
const BackendPlugin* FindPlugin(const std::string& name) {
  auto it = Plugins().find(name);
  return it == Plugins().end() ? nullptr : &it->second;
}

}  // namespace

bool BackendRegistry::Register(const std::string& name, BackendFactory factory) {
  Factories()[name] = std::move(factory);
  return true;
}

bool BackendRegistry::RegisterPlugin(const std::string& name, BackendPlugin plugin) {
  Plugins()[name] = std::move(plugin);
  return true;
}

std::string BackendRegistry::PluginError(const std::string& name) {
  const BackendPlugin* plugin = FindPlugin(name);
  return plugin == nullptr ? "no plugin named " + name : plugin->load();
}

void BackendRegistry::FinalizePlugin(const std::string& name) {
  const BackendPlugin* plugin = FindPlugin(name);
  if (plugin != nullptr && plugin->finalize) plugin->finalize();
}

bool BackendRegistry::Built(const std::string& name) {
  if (const BackendPlugin* plugin = FindPlugin(name)) return plugin->load().empty();
  return Factories().count(name) > 0;
}

std::vector<std::string> BackendRegistry::Names() {
  std::vector<std::string> names;
  for (const auto& [name, factory] : Factories()) names.push_back(name);
  for (const auto& [name, plugin] : Plugins()) {
    if (plugin.load().empty()) names.push_back(name);
  }
  return names;
}

std::unique_ptr<Communicator> BackendRegistry::Create(const std::string& name, const BackendOptions& options) {
  if (const BackendPlugin* plugin = FindPlugin(name)) {
    const std::string error = plugin->load();
    if (!error.empty()) throw EngineError(Status::PreconditionError(plugin->requested_by + " but " + error + "."));
    return plugin->create(options);
  }
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
