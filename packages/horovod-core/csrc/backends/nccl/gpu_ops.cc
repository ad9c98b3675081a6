#include "backends/nccl/gpu_ops.h"

#include <mutex>

#include "backends/plugin_loader.h"

namespace horovod {

// What the build recorded (CMakeLists.txt, cmake/HorovodFindNCCL.cmake). Only this file reads it.
#ifndef HOROVOD_NCCL_VERSION_CODE
#define HOROVOD_NCCL_VERSION_CODE 0
#endif
#ifndef HOROVOD_NCCL_NOT_BUILT
#define HOROVOD_NCCL_NOT_BUILT "it was built without NCCL"
#endif
#ifndef HOROVOD_NCCL_LIBRARY
#define HOROVOD_NCCL_LIBRARY ""
#endif

int NcclVersionBuilt() { return HOROVOD_NCCL_VERSION_CODE; }

bool CudaBuilt() { return HOROVOD_NCCL_VERSION_CODE != 0; }

namespace {

using CreateGpuOps = GpuOps* (*)(std::string*);

struct GpuPlugin {
  std::once_flag once;
  GpuOps* ops = nullptr;
  std::string error;
};

// Loads _nccl_ops.so from the folder of the core module (plugin_loader.h) and creates its GpuOps.
// RTLD_LOCAL: nothing else in the process should bind to the CUDA runtime linked into it.
void Load(GpuPlugin& plugin) {
  if (HOROVOD_NCCL_VERSION_CODE == 0) {
    plugin.error = std::string("this build of Horovod has no NCCL support (") + HOROVOD_NCCL_NOT_BUILT +
                   "); reinstall it with HOROVOD_GPU_OPERATIONS=NCCL to use GPU tensors";
    return;
  }
  PluginOpen opened = OpenPlugin("_nccl_ops.so", /*global=*/false);
  if (opened.handle == nullptr) {
    if (opened.path.empty()) {  // the core module itself could not be located
      plugin.error = opened.error;
      return;
    }
    plugin.error = "the NCCL plugin of this build of Horovod cannot be loaded (" + opened.error +
                   "); it needs libnccl.so.2 (built against " + HOROVOD_NCCL_LIBRARY +
                   "; `pip install nvidia-nccl-cu13` provides it) and a CUDA driver (libcuda.so.1)";
    return;
  }
  auto create = PluginFunction<CreateGpuOps>(opened.handle, "horovod_nccl_create_ops");
  if (create == nullptr) {
    plugin.error = opened.path + " lacks the Horovod NCCL entry point";
    return;
  }
  plugin.ops = create(&plugin.error);
}

}  // namespace

GpuOps* LoadGpuOps(std::string* error) {
  static GpuPlugin plugin;
  std::call_once(plugin.once, [] { Load(plugin); });
  if (plugin.ops == nullptr && error != nullptr) *error = plugin.error;
  return plugin.ops;
}

}  // namespace horovod
