// The registry through which the engine creates the CPU backends by name. A backend compiled into
// the core registers a factory from a static initialiser in its own folder (gloo/gloo_backend.cc);
// a backend in a plugin loaded on first use registers how to load it (mpi/mpi_loader.cc). The
// registry knows no backend by name.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/communicator.h"

namespace horovod {

using BackendFactory = std::function<std::unique_ptr<Communicator>(const BackendOptions&)>;

// A backend in a plugin beside the core, loaded the first time it is asked about.
struct BackendPlugin {
  // Loads the plugin (once; later calls return the first answer): "" when it can create
  // communicators, otherwise why not.
  std::function<std::string()> load;
  // After a successful load: creates a communicator (throws on failure).
  BackendFactory create;
  // At exit, after a successful load (may be empty).
  std::function<void()> finalize;
  // What asked for the backend, for the error when it cannot load ("MPI was requested (...)").
  std::string requested_by;
};

class BackendRegistry {
 public:
  // Called from a static initialiser in each built backend's source file.
  static bool Register(const std::string& name, BackendFactory factory);
  static bool RegisterPlugin(const std::string& name, BackendPlugin plugin);
  // Built backends: those compiled in, plus each plugin that loads (which needs the library it was
  // built against, for MPI its libmpi).
  static bool Built(const std::string& name);
  static std::vector<std::string> Names();
  // Why plugin `name` could not be loaded ("" when it was).
  static std::string PluginError(const std::string& name);
  // Finalizes plugin `name` at exit if it was loaded (MPI: MPI_Finalize if the plugin initialised
  // MPI).
  static void FinalizePlugin(const std::string& name);
  // Throws EngineError(PRECONDITION_ERROR) naming the backend when it was not built.
  static std::unique_ptr<Communicator> Create(const std::string& name, const BackendOptions& options);
};

}  // namespace horovod
