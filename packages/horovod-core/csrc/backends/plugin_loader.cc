#include "backends/plugin_loader.h"

#include <dlfcn.h>

namespace horovod {

bool CoreModuleFolder(std::string* folder, std::string* error) {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&CoreModuleFolder), &info) == 0 || info.dli_fname == nullptr) {
    *error = "cannot locate the Horovod core module";
    return false;
  }
  std::string path(info.dli_fname);
  const size_t slash = path.rfind('/');
  // A module opened by a bare name lies in the current folder.
  *folder = slash == std::string::npos ? std::string(".") : slash == 0 ? std::string("/") : path.substr(0, slash);
  return true;
}

void* OpenLibrary(const std::string& path, bool global, std::string* error) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | (global ? RTLD_GLOBAL : RTLD_LOCAL));
  if (handle == nullptr) {
    const char* why = dlerror();
    *error = why != nullptr ? std::string(why) : path + ": cannot be loaded";
  }
  return handle;
}

PluginOpen OpenPlugin(const std::string& file_name, bool global) {
  PluginOpen result;
  std::string folder;
  if (!CoreModuleFolder(&folder, &result.error)) return result;
  result.path = folder + (folder == "/" ? "" : "/") + file_name;
  result.handle = OpenLibrary(result.path, global, &result.error);
  return result;
}

void* PluginSymbol(void* handle, const char* symbol) { return dlsym(handle, symbol); }

}  // namespace horovod
