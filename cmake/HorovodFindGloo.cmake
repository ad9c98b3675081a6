# Finds Gloo as installed by the system (Debian's libgloo-dev ships GlooConfig.cmake and an imported
# target `gloo`). Sets HOROVOD_GLOO_FOUND. HOROVOD_WITH_GLOO makes it mandatory; HOROVOD_WITHOUT_GLOO
# skips it. Gloo is never vendored into this repository.
set(HOROVOD_GLOO_FOUND OFF)
if(NOT HOROVOD_WITHOUT_GLOO)
  find_package(Gloo CONFIG QUIET)
  if(Gloo_FOUND AND TARGET gloo)
    set(HOROVOD_GLOO_FOUND ON)
    message(STATUS "horovod-core: Gloo ${GLOO_VERSION} found")
  elseif(HOROVOD_WITH_GLOO)
    message(FATAL_ERROR "horovod-core: HOROVOD_WITH_GLOO is set but Gloo was not found "
                        "(Debian: apt-get install libgloo-dev)")
  else()
    message(STATUS "horovod-core: Gloo not found; the Gloo backend is not built")
  endif()
endif()
