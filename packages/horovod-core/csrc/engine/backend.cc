#include "backend.h"

#include <dlfcn.h>

#include <cstring>
#include <map>
#include <mutex>

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

namespace {

using MpiCreate = Backend* (*)(const BackendOptions*, std::string*);
using MpiFinalize = void (*)();

struct MpiPlugin {
  std::once_flag once;
  MpiCreate create = nullptr;
  MpiFinalize finalize = nullptr;
  std::string error;
};

MpiPlugin& Plugin() {
  static MpiPlugin plugin;
  return plugin;
}

// Loads _mpi_backend.so from the folder of this module. RTLD_GLOBAL: Open MPI's own components
// look up libmpi's symbols globally.
MpiPlugin& LoadMpiPlugin() {
  MpiPlugin& plugin = Plugin();
  std::call_once(plugin.once, [&plugin] {
    Dl_info info;
    if (dladdr(reinterpret_cast<void*>(&LoadMpiPlugin), &info) == 0 || info.dli_fname == nullptr) {
      plugin.error = "cannot locate the Horovod core module";
      return;
    }
    std::string dir(info.dli_fname);
    dir = dir.substr(0, dir.rfind('/') + 1);
    std::string path = dir + "_mpi_backend.so";
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      plugin.error = std::string("this build of Horovod has no usable MPI backend (") + (why ? why : path) + ")";
      return;
    }
    plugin.create = reinterpret_cast<MpiCreate>(dlsym(handle, "horovod_mpi_create_backend"));
    plugin.finalize = reinterpret_cast<MpiFinalize>(dlsym(handle, "horovod_mpi_finalize"));
    if (plugin.create == nullptr || plugin.finalize == nullptr) {
      plugin.error = path + " lacks the Horovod MPI entry points";
      plugin.create = nullptr;
    }
  });
  return plugin;
}

}  // namespace

std::string BackendRegistry::PluginError(const std::string& name) {
  if (name != "mpi") return "no plugin named " + name;
  return LoadMpiPlugin().error;
}

void BackendRegistry::FinalizeMpi() {
  MpiPlugin& plugin = Plugin();
  if (plugin.finalize != nullptr) plugin.finalize();
}

bool BackendRegistry::Register(const std::string& name, BackendFactory factory) {
  Factories()[name] = std::move(factory);
  return true;
}

bool BackendRegistry::Built(const std::string& name) {
  if (name == "mpi") return LoadMpiPlugin().create != nullptr;
  return Factories().count(name) > 0;
}

std::vector<std::string> BackendRegistry::Names() {
  std::vector<std::string> names;
  for (const auto& [name, factory] : Factories()) names.push_back(name);
  if (Built("mpi")) names.push_back("mpi");
  return names;
}

std::unique_ptr<Backend> BackendRegistry::Create(const std::string& name, const BackendOptions& options) {
  if (name == "mpi") {
    MpiPlugin& plugin = LoadMpiPlugin();
    if (plugin.create == nullptr) {
      throw EngineError(Status::PreconditionError("MPI was requested (HOROVOD_CONTROLLER / HOROVOD_CPU_OPERATIONS or "
                                                  "an mpirun launch) but " + plugin.error + "."));
    }
    std::string error;
    Backend* backend = plugin.create(&options, &error);
    if (backend == nullptr) throw std::runtime_error("MPI backend: " + error);
    return std::unique_ptr<Backend>(backend);
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
