// The MPI backend as a plugin (_mpi_backend.so beside the core, mpi_backend.cc), loaded with the
// libmpi it was built against the first time MPI is asked for, so that the core never needs an MPI
// library at import time. It registers with the backend registry as the plugin "mpi". What the
// build recorded about its MPI comes in as HOROVOD_MPI_* definitions (CMakeLists.txt,
// cmake/HorovodFindMPI.cmake); an Open MPI from a wheel is told its prefix (OPAL_PREFIX) here.
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/plugin_loader.h"
#include "backends/registry.h"

namespace horovod {
namespace {

// The plugin's entry points (mpi_backend.cc).
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

const bool kRegistered = BackendRegistry::RegisterPlugin(
    "mpi", BackendPlugin{
               [] { return LoadMpiPlugin().error; },
               [](const BackendOptions& options) {
                 std::string error;
                 Communicator* communicator = LoadMpiPlugin().create(&options, &error);
                 if (communicator == nullptr) throw std::runtime_error("MPI backend: " + error);
                 return std::unique_ptr<Communicator>(communicator);
               },
               [] {
                 MpiPlugin& plugin = Plugin();
                 if (plugin.finalize != nullptr) plugin.finalize();
               },
               "MPI was requested (HOROVOD_CONTROLLER / HOROVOD_CPU_OPERATIONS or an mpirun launch)"});

}  // namespace
}  // namespace horovod
