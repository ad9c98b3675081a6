# Finds the CUDA toolkit and NCCL for the GPU plugin (_nccl_ops.so, csrc/backends/nccl/).
#
# Whether to build it:
#   HOROVOD_GPU_OPERATIONS (CMake variable, or the environment variable of the same name, as in
#   upstream's `HOROVOD_GPU_OPERATIONS=NCCL pip install horovod-core`): NCCL requires CUDA and
#   NCCL and fails the configure step when either is missing. HOROVOD_GPU_ALLREDUCE,
#   HOROVOD_GPU_ALLGATHER, HOROVOD_GPU_BROADCAST, HOROVOD_GPU_ALLTOALL and
#   HOROVOD_GPU_REDUCESCATTER set to NCCL do the same. Any other value (MPI, DDL, ...) is refused:
#   this project implements GPU collectives with NCCL only.
#   HOROVOD_WITHOUT_NCCL=ON (or the environment variable set to 1) skips the plugin.
#   Otherwise the plugin is built when both are found, and the output says why when not.
#
# Where:
#   CUDA: the nvcc named by CMAKE_CUDA_COMPILER / CUDACXX, else /usr/local/cuda/bin/nvcc, else
#   nvcc on PATH. Architectures: CMAKE_CUDA_ARCHITECTURES, or the CUDAARCHS environment variable
#   (default "80;90": A100 and H100; the kernels are small, every architecture adds compile time).
#   NCCL: HOROVOD_NCCL_HOME or NCCL_HOME (variable or environment: a folder with include/nccl.h
#   and lib/libnccl.so*), else the nvidia-nccl-cu13 wheel in the site-packages of the Python the
#   build runs with, else the system. The wheel ships lib/libnccl.so.2 without an unversioned
#   symlink, so the library is linked by its full path.
#
# Sets: HOROVOD_NCCL_FOUND, HOROVOD_NCCL_INCLUDE_DIR, HOROVOD_NCCL_LIBRARY,
# HOROVOD_NCCL_VERSION_CODE, HOROVOD_NCCL_FROM_WHEEL, HOROVOD_NCCL_NOT_BUILT (why not, for the
# core's error message).

set(HOROVOD_NCCL_FOUND OFF)
set(HOROVOD_NCCL_NOT_BUILT "")

function(_horovod_env_or_var name out)
  if(DEFINED ${name} AND NOT "${${name}}" STREQUAL "")
    set(${out} "${${name}}" PARENT_SCOPE)
  elseif(DEFINED ENV{${name}})
    set(${out} "$ENV{${name}}" PARENT_SCOPE)
  else()
    set(${out} "" PARENT_SCOPE)
  endif()
endfunction()

# Which GPU operations were asked for.
set(_hvd_gpu_required OFF)
foreach(_var HOROVOD_GPU_OPERATIONS HOROVOD_GPU_ALLREDUCE HOROVOD_GPU_ALLGATHER HOROVOD_GPU_BROADCAST
             HOROVOD_GPU_ALLTOALL HOROVOD_GPU_REDUCESCATTER)
  _horovod_env_or_var(${_var} _value)
  string(TOUPPER "${_value}" _value)
  if(_value STREQUAL "NCCL")
    set(_hvd_gpu_required ON)
  elseif(NOT _value STREQUAL "")
    message(FATAL_ERROR "horovod-core: ${_var}=${_value} is not supported: this build implements GPU "
                        "operations with NCCL only (set ${_var}=NCCL, or unset it).")
  endif()
endforeach()
_horovod_env_or_var(HOROVOD_WITHOUT_NCCL _without)
if(_without AND NOT _without STREQUAL "0" AND NOT _without STREQUAL "OFF")
  if(_hvd_gpu_required)
    message(FATAL_ERROR "horovod-core: HOROVOD_WITHOUT_NCCL and HOROVOD_GPU_OPERATIONS=NCCL contradict each other.")
  endif()
  set(HOROVOD_NCCL_NOT_BUILT "HOROVOD_WITHOUT_NCCL was set")
  message(STATUS "horovod-core: not building NCCL support (HOROVOD_WITHOUT_NCCL)")
  return()
endif()

# The reason may come in several string arguments; they are joined.
function(_horovod_nccl_missing)
  string(JOIN "" why ${ARGN})
  if(_hvd_gpu_required)
    message(FATAL_ERROR "horovod-core: HOROVOD_GPU_OPERATIONS=NCCL was asked for, but ${why}. "
                        "Install the CUDA toolkit (nvcc) and NCCL (`pip install nvidia-nccl-cu13`), or point "
                        "CUDACXX at nvcc and HOROVOD_NCCL_HOME at NCCL.")
  endif()
  message(STATUS "horovod-core: not building NCCL support: ${why} (set HOROVOD_GPU_OPERATIONS=NCCL to require it)")
  set(HOROVOD_NCCL_NOT_BUILT "${why}" PARENT_SCOPE)
endfunction()

# NCCL first: it is quick to look for, and without it CUDA is not needed.
_horovod_env_or_var(HOROVOD_NCCL_HOME _nccl_home)
if(_nccl_home STREQUAL "")
  _horovod_env_or_var(NCCL_HOME _nccl_home)
endif()
set(_nccl_hints "")
if(NOT _nccl_home STREQUAL "")
  list(APPEND _nccl_hints "${_nccl_home}")
endif()
if(Python_EXECUTABLE)
  execute_process(COMMAND "${Python_EXECUTABLE}" -c
                          "import sysconfig; print(sysconfig.get_paths()['purelib']); print(sysconfig.get_paths()['platlib'])"
                  OUTPUT_VARIABLE _site OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  string(REPLACE "\n" ";" _site "${_site}")
  foreach(_dir ${_site})
    list(APPEND _nccl_hints "${_dir}/nvidia/nccl")
  endforeach()
endif()
find_path(HOROVOD_NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include
          NO_CACHE)
if(NOT HOROVOD_NCCL_INCLUDE_DIR)
  _horovod_nccl_missing("nccl.h was not found (looked in HOROVOD_NCCL_HOME, the nvidia-nccl-cu13 wheel of "
                        "${Python_EXECUTABLE} and the system)")
  return()
endif()
get_filename_component(_nccl_root "${HOROVOD_NCCL_INCLUDE_DIR}" DIRECTORY)
find_file(HOROVOD_NCCL_LIBRARY NAMES libnccl.so.2 libnccl.so
          HINTS "${_nccl_root}/lib" "${_nccl_root}/lib64"
          PATHS /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib NO_CACHE)
if(NOT HOROVOD_NCCL_LIBRARY)
  _horovod_nccl_missing("nccl.h was found in ${HOROVOD_NCCL_INCLUDE_DIR} but not libnccl.so.2 beside it")
  return()
endif()
file(STRINGS "${HOROVOD_NCCL_INCLUDE_DIR}/nccl.h" _code REGEX "^#define NCCL_VERSION_CODE [0-9]+")
string(REGEX MATCH "[0-9]+$" HOROVOD_NCCL_VERSION_CODE "${_code}")
if(NOT HOROVOD_NCCL_VERSION_CODE)
  _horovod_nccl_missing("${HOROVOD_NCCL_INCLUDE_DIR}/nccl.h has no NCCL_VERSION_CODE")
  return()
endif()
# CUDA. check_language runs nvcc on a test project and leaves CMAKE_CUDA_COMPILER empty when it
# cannot; enable_language itself would stop the configure step.
if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc CACHE FILEPATH "CUDA compiler")
endif()
if((NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "") AND NOT DEFINED ENV{CUDAARCHS})
  set(CMAKE_CUDA_ARCHITECTURES "80;90" CACHE STRING "GPU architectures to compile the CUDA kernels for")
endif()
include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  _horovod_nccl_missing("no CUDA compiler (nvcc) was found")
  return()
endif()
enable_language(CUDA)
find_package(CUDAToolkit)
if(NOT CUDAToolkit_FOUND OR NOT TARGET CUDA::cudart_static)
  _horovod_nccl_missing("the CUDA toolkit's runtime (cudart) was not found beside ${CMAKE_CUDA_COMPILER}")
  return()
endif()

string(FIND "${HOROVOD_NCCL_INCLUDE_DIR}" "/nvidia/nccl/" _wheel_pos)
if(_wheel_pos GREATER -1)
  set(HOROVOD_NCCL_FROM_WHEEL ON)
else()
  set(HOROVOD_NCCL_FROM_WHEEL OFF)
endif()
set(HOROVOD_NCCL_FOUND ON)
message(STATUS "horovod-core: building NCCL support: CUDA ${CUDAToolkit_VERSION} (${CMAKE_CUDA_COMPILER}, "
               "architectures ${CMAKE_CUDA_ARCHITECTURES}), NCCL ${HOROVOD_NCCL_VERSION_CODE} (${HOROVOD_NCCL_LIBRARY})")
