// The communicator's defaults (every operation unsupported unless the transport says otherwise),
// the forwarding base class, and the backend registry with the loading of the MPI plugin.
#include "backends/communicator.h"

#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>

#include "backends/plugin_loader.h"

namespace horovod {

// ---- Communicator ----

std::string Communicator::Activity(const char* op) const {
  std::string activity = name();
  for (char& c : activity) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return activity + "_" + op;
}

void Communicator::Unsupported(const char* what) const {
  throw UnsupportedError(std::string("backend ") + name() + " does not support " + what);
}

std::vector<std::vector<char>> Communicator::Gatherv(const std::vector<char>&, int) { Unsupported("gatherv"); }

void Communicator::BroadcastBytes(std::vector<char>&, int) { Unsupported("broadcast of control messages"); }

void Communicator::AllreduceBitsAnd(std::vector<uint64_t>& words) {
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
  BroadcastBytes(result, 0);
  std::memcpy(words.data(), result.data(), result.size());
}

std::unique_ptr<Communicator> Communicator::Split(const std::vector<int>&, const BackendOptions&) {
  Unsupported("split");
}

void Communicator::Allreduce(const AllreduceOptions&) { Unsupported("allreduce"); }

void Communicator::AllreducePieces(const AllreducePiecesOptions&) {
  Unsupported("allreduce of separate tensors");
}

void Communicator::Allgather(const AllgatherOptions&) { Unsupported("allgather"); }

void Communicator::Broadcast(const BroadcastOptions&) { Unsupported("broadcast"); }

void Communicator::Alltoall(const AlltoallOptions&) { Unsupported("alltoall"); }

void Communicator::Reducescatter(const ReducescatterOptions&) { Unsupported("reducescatter"); }

void Communicator::Barrier() { Unsupported("barrier"); }

void Communicator::SendRecv(const SendRecvOptions&) { Unsupported("send/receive"); }

// ---- ForwardingCommunicator ----

ForwardingCommunicator::ForwardingCommunicator(std::unique_ptr<Communicator> inner)
    : Communicator(inner->rank(), inner->size()), inner_(std::move(inner)) {}

// ---- BackendRegistry ----

namespace {

std::map<std::string, BackendFactory>& Factories() {
  static std::map<std::string, BackendFactory> factories;
  return factories;
}

using MpiCreate = Communicator* (*)(const BackendOptions*, std::string*);
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

// What the build recorded about its MPI (CMakeLists.txt, cmake/HorovodFindMPI.cmake).
#ifndef HOROVOD_MPI_ORIGIN
#define HOROVOD_MPI_ORIGIN ""
#endif
#ifndef HOROVOD_MPI_DESCRIPTION
#define HOROVOD_MPI_DESCRIPTION ""
#endif
#ifndef HOROVOD_MPI_LIBRARY
#define HOROVOD_MPI_LIBRARY ""
#endif
#ifndef HOROVOD_MPI_SONAME
#define HOROVOD_MPI_SONAME ""
#endif
#ifndef HOROVOD_MPI_IS_OPEN_MPI
#define HOROVOD_MPI_IS_OPEN_MPI 0
#endif
#ifndef HOROVOD_MPI_NOT_BUILT
#define HOROVOD_MPI_NOT_BUILT ""
#endif

bool FileExists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

std::string Parent(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos || slash == 0 ? std::string("/") : path.substr(0, slash);
}

// Loads libmpi (RTLD_GLOBAL) before the plugin, which is not linked with it (CMakeLists.txt): the
// plugin's MPI symbols resolve to this library. A system MPI is loaded by its soname
// (libmpi.so.40), through the loader's own search as for any system library, so that a wheel
// built on one machine uses the MPI of the machine it runs on. An MPI from a PyPI wheel or
// HOROVOD_MPI_HOME is loaded by path, never another libmpi of the same name (a system Open MPI has
// the same soname): first in the environment this core is installed in
// (<prefix>/lib/pythonX.Y/site-packages/horovod/common -> <prefix>/lib), then where the build found
// it. Returns false with `error` set when none loads.
bool PreloadMpiLibrary(const std::string& core_dir, std::string* error) {
  const std::string origin = HOROVOD_MPI_ORIGIN;
  const std::string built = HOROVOD_MPI_LIBRARY;
  const std::string soname = HOROVOD_MPI_SONAME;
  if (built.empty()) return true;
  std::string name = built.substr(built.rfind('/') + 1);
  std::vector<std::string> candidates;
  if (origin == "system" && !soname.empty()) candidates.push_back(soname);
  if (origin == "wheel") {
    std::string env_lib = Parent(Parent(Parent(Parent(core_dir))));
    candidates.push_back(env_lib + "/" + name);
  }
  if (candidates.empty() || candidates.back() != built) candidates.push_back(built);
  std::string tried;
  for (const auto& path : candidates) {
    // A bare soname is for the loader to look up; a path that does not exist is skipped.
    if (path.find('/') != std::string::npos && !FileExists(path)) {
      tried += (tried.empty() ? "" : "; ") + path + ": no such file";
      continue;
    }
    if (HOROVOD_MPI_IS_OPEN_MPI && origin != "system") {
      // A relocated Open MPI finds its own files through OPAL_PREFIX; its mpirun sets it for the
      // ranks, a process started otherwise needs it too. <prefix>/lib/libmpi.so -> <prefix>.
      setenv("OPAL_PREFIX", Parent(Parent(path)).c_str(), /*overwrite=*/0);
    }
    std::string why;
    if (OpenLibrary(path, /*global=*/true, &why) != nullptr) return true;
    tried += (tried.empty() ? "" : "; ") + why;
  }
  *error = std::string("its MPI backend was built against ") + HOROVOD_MPI_DESCRIPTION + ", whose libmpi could not "
           "be loaded (tried " + tried + ")";
  return false;
}

// Loads _mpi_backend.so from the folder of the core module (plugin_loader.h), after its libmpi.
// RTLD_GLOBAL: Open MPI's own components look up libmpi's symbols globally.
MpiPlugin& LoadMpiPlugin() {
  MpiPlugin& plugin = Plugin();
  std::call_once(plugin.once, [&plugin] {
    if (std::string(HOROVOD_MPI_NOT_BUILT).size() > 0) {
      plugin.error = std::string("this build of Horovod was built without MPI (") + HOROVOD_MPI_NOT_BUILT + ")";
      return;
    }
    std::string core_dir;
    if (!CoreModuleFolder(&core_dir, &plugin.error)) return;
    if (!PreloadMpiLibrary(core_dir, &plugin.error)) return;
    PluginOpen opened = OpenPlugin("_mpi_backend.so", /*global=*/true);
    if (opened.handle == nullptr) {
      plugin.error = "this build of Horovod has no usable MPI backend (" + opened.error + ")";
      if (std::string(HOROVOD_MPI_DESCRIPTION).size() > 0) {
        plugin.error += std::string("; it was built against ") + HOROVOD_MPI_DESCRIPTION;
      }
      return;
    }
    plugin.create = PluginFunction<MpiCreate>(opened.handle, "horovod_mpi_create_backend");
    plugin.finalize = PluginFunction<MpiFinalize>(opened.handle, "horovod_mpi_finalize");
    if (plugin.create == nullptr || plugin.finalize == nullptr) {
      plugin.error = opened.path + " lacks the Horovod MPI entry points";
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

std::unique_ptr<Communicator> BackendRegistry::Create(const std::string& name, const BackendOptions& options) {
  if (name == "mpi") {
    MpiPlugin& plugin = LoadMpiPlugin();
    if (plugin.create == nullptr) {
      throw EngineError(Status::PreconditionError("MPI was requested (HOROVOD_CONTROLLER / HOROVOD_CPU_OPERATIONS or "
                                                  "an mpirun launch) but " + plugin.error + "."));
    }
    std::string error;
    Communicator* communicator = plugin.create(&options, &error);
    if (communicator == nullptr) throw std::runtime_error("MPI backend: " + error);
    return std::unique_ptr<Communicator>(communicator);
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
