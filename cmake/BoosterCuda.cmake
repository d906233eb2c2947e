# BOOSTER_WITH_CUDA: whether the CUDA kernels (kernels/cuda) are built.
#   AUTO  when a working nvcc is found (else a status message, and nothing CUDA is built)
#   ON    required: configure fails when no working nvcc is found
#   OFF   never; nothing CUDA is looked for
# The compiler: CMAKE_CUDA_COMPILER or the CUDACXX environment variable if given, else the first nvcc
# in $CUDA_PATH/bin, PATH, the system prefixes (/usr/local/bin, ...) and /usr/local/cuda/bin (the
# toolkit's default install directory, not on PATH by default). It must compile a trial project.
# Sets BOOSTER_CUDA_ENABLED (ON/OFF). When ON, the CUDA language is enabled and CUDA::cudart exists.
# Architectures: BOOSTER_CUDA_ARCHITECTURES if given (or $CUDAARCHS), else 80: sm_80 machine code plus
# compute_80 PTX, which the driver compiles for newer GPUs; -DBOOSTER_CUDA_ARCHITECTURES=90 for Hopper.
# (Not CMAKE_CUDA_ARCHITECTURES: LibTorch's package config, found first, overrides that variable and
# enables CUDA with nvcc's default architecture.)
set(BOOSTER_CUDA_ENABLED OFF)
string(TOUPPER "${BOOSTER_WITH_CUDA}" _booster_cuda_mode)
if(NOT _booster_cuda_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "BOOSTER_WITH_CUDA is \"${BOOSTER_WITH_CUDA}\": use AUTO, ON or OFF")
endif()

if(NOT _booster_cuda_mode STREQUAL "OFF")
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND "$ENV{CUDACXX}" STREQUAL "")
    find_program(BOOSTER_NVCC nvcc HINTS ENV CUDA_PATH PATH_SUFFIXES bin PATHS /usr/local/cuda/bin)
    mark_as_advanced(BOOSTER_NVCC)
    if(BOOSTER_NVCC)
      set(ENV{CUDACXX} "${BOOSTER_NVCC}")   # what check_language and enable_language use
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)   # a trial project: a broken nvcc or host compiler counts as not found
  if(CMAKE_CUDA_COMPILER)
    if("$ENV{CUDAARCHS}" STREQUAL "")
      set(BOOSTER_CUDA_ARCHITECTURES 80 CACHE STRING "CUDA architectures of the CUDA kernels")
    else()
      set(BOOSTER_CUDA_ARCHITECTURES "$ENV{CUDAARCHS}" CACHE STRING "CUDA architectures of the CUDA kernels")
    endif()
    set(CMAKE_CUDA_ARCHITECTURES ${BOOSTER_CUDA_ARCHITECTURES})
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    if(CCACHE_PROGRAM)
      set(CMAKE_CUDA_COMPILER_LAUNCHER "${CCACHE_PROGRAM}")
    endif()
    set(BOOSTER_CUDA_ENABLED ON)
    message(STATUS "CUDA kernels: on (nvcc ${CMAKE_CUDA_COMPILER_VERSION} at ${CMAKE_CUDA_COMPILER}, "
                   "architectures ${CMAKE_CUDA_ARCHITECTURES})")
  elseif(_booster_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "BOOSTER_WITH_CUDA=ON but no working CUDA compiler was found (looked at "
      "CMAKE_CUDA_COMPILER, CUDACXX, PATH, $CUDA_PATH/bin and /usr/local/cuda/bin). Pass "
      "-DCMAKE_CUDA_COMPILER=/path/to/nvcc, or -DBOOSTER_WITH_CUDA=AUTO or OFF to build without "
      "the CUDA kernels.")
  else()
    message(STATUS "CUDA kernels: off (BOOSTER_WITH_CUDA=AUTO and no working nvcc was found)")
  endif()
else()
  message(STATUS "CUDA kernels: off (BOOSTER_WITH_CUDA=OFF)")
endif()
unset(_booster_cuda_mode)
