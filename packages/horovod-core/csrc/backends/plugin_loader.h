// Loading a plugin of the core: a shared library installed beside the core module (horovod/common/
// _mpi_backend.so, _nccl_ops.so), opened with dlopen only when its backend is asked for, so that the
// core itself never depends on MPI, CUDA or NCCL being installed.
#pragma once

#include <string>

namespace horovod {

// The folder holding the module this code is linked into (the core, _core*.so, or a test binary),
// without a trailing slash. Returns false with *error set when the dynamic loader cannot say.
bool CoreModuleFolder(std::string* folder, std::string* error);

struct PluginOpen {
  void* handle = nullptr;  // dlopen's handle; null when the plugin did not load
  std::string path;        // where it was looked for ("" when the core module could not be located)
  std::string error;       // why it did not load: the dynamic loader's message (naming the path)
};

// dlopen(RTLD_NOW) of `file_name` in the core module's folder: RTLD_GLOBAL when `global` (its
// symbols serve libraries loaded later, as Open MPI's components need), else RTLD_LOCAL. The
// plugin is never unloaded.
PluginOpen OpenPlugin(const std::string& file_name, bool global);

// dlopen(RTLD_NOW) of a library the plugin needs (libmpi): `path` is a path, or a bare soname for
// the loader's own search. RTLD_GLOBAL when `global`. Null with *error = the loader's message.
void* OpenLibrary(const std::string& path, bool global, std::string* error);

// dlsym of `symbol` in an opened plugin, as a function pointer of type F (null when absent).
void* PluginSymbol(void* handle, const char* symbol);
template <typename F>
F PluginFunction(void* handle, const char* symbol) {
  return reinterpret_cast<F>(PluginSymbol(handle, symbol));
}

}  // namespace horovod
