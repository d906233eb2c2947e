# LibTorch 2.11 (the one supported version) and booster_torch_cpu, the target everything links.
#
# Where LibTorch comes from, in CMake's search order:
#   -DTorch_DIR=<dir with TorchConfig.cmake> or -DCMAKE_PREFIX_PATH=<libtorch or site-packages/torch>
#   (a libtorch zip, a conda environment, any pip install of torch 2.11), else
#   the virtual environment scripts/install_deps.sh makes: $BOOSTER_VENV, default ~/.cache/booster/venv.
# BOOSTER_PYTHON: the Python peer of the tests and benchmarks (torch 2.11 importable); defaults to that
# environment's python3, else the python3 beside the LibTorch found.
#
# booster_torch_cpu links libtorch_cpu and libc10 only: the CPU path loads no CUDA library of
# LibTorch's own (libtorch_cuda, cuBLAS, cuDNN); code that needs CUDA links torch_cuda itself.
# (libtorch_cpu.so of the CUDA wheel still needs libcudart and libcupti, from the wheel's nvidia/ dir.)
set(BOOSTER_TORCH_VERSION 2.11)

set(_booster_venv "$ENV{BOOSTER_VENV}")
if(_booster_venv STREQUAL "")
  set(_booster_venv "$ENV{HOME}/.cache/booster/venv")
endif()
file(GLOB _booster_venv_torch "${_booster_venv}/lib/python3*/site-packages/torch/share/cmake/Torch")
# LibTorch's package config (Caffe2/public/cuda.cmake) appends its own nvcc flags (a -gencode for every
# architecture PyTorch ships, compute_50 among them, which nvcc 13 refuses) to CMAKE_CUDA_FLAGS and
# overrides CMAKE_CUDA_ARCHITECTURES. Our CUDA code does not build with PyTorch's flags: keep ours.
foreach(_v CMAKE_CUDA_FLAGS CMAKE_CUDA_FLAGS_RELEASE CMAKE_CUDA_FLAGS_DEBUG CMAKE_CUDA_FLAGS_RELWITHDEBINFO)
  set(_booster_saved_${_v} "${${_v}}")
endforeach()
find_package(Torch QUIET HINTS ${_booster_venv_torch})
foreach(_v CMAKE_CUDA_FLAGS CMAKE_CUDA_FLAGS_RELEASE CMAKE_CUDA_FLAGS_DEBUG CMAKE_CUDA_FLAGS_RELWITHDEBINFO)
  set(${_v} "${_booster_saved_${_v}}")
  unset(_booster_saved_${_v})
endforeach()
if(NOT Torch_FOUND)
  message(FATAL_ERROR "LibTorch ${BOOSTER_TORCH_VERSION} was not found. Run `bash scripts/install_deps.sh` "
    "(it installs torch==2.11.0 from PyPI into ${_booster_venv}), or point CMake at your LibTorch "
    "${BOOSTER_TORCH_VERSION} with -DTorch_DIR=<libtorch>/share/cmake/Torch or "
    "-DCMAKE_PREFIX_PATH=<libtorch>.")
endif()
if(NOT Torch_VERSION VERSION_GREATER_EQUAL ${BOOSTER_TORCH_VERSION} OR
   Torch_VERSION VERSION_GREATER_EQUAL 2.12)
  message(FATAL_ERROR "LibTorch ${Torch_VERSION} at ${Torch_DIR}: Booster C++ supports LibTorch "
    "${BOOSTER_TORCH_VERSION} only. Run `bash scripts/install_deps.sh` or pass "
    "-DTorch_DIR=<libtorch ${BOOSTER_TORCH_VERSION}>/share/cmake/Torch.")
endif()
# LibTorch's mkl.cmake gives caffe2::mkl link directories under MKL_ROOT even when no MKL is found
# (/lib/intel64, ...); keep only those that exist, so they stay out of our RUNPATHs.
if(TARGET caffe2::mkl)
  get_target_property(_booster_mkl_dirs caffe2::mkl INTERFACE_LINK_DIRECTORIES)
  set(_booster_kept)
  foreach(_d IN LISTS _booster_mkl_dirs)
    if(IS_DIRECTORY "${_d}")
      list(APPEND _booster_kept "${_d}")
    endif()
  endforeach()
  set_property(TARGET caffe2::mkl PROPERTY INTERFACE_LINK_DIRECTORIES ${_booster_kept})
  unset(_booster_mkl_dirs)
  unset(_booster_kept)
endif()
get_filename_component(BOOSTER_TORCH_PREFIX "${Torch_DIR}/../../.." ABSOLUTE)
message(STATUS "LibTorch ${Torch_VERSION} at ${BOOSTER_TORCH_PREFIX}")

if(NOT DEFINED BOOSTER_PYTHON)
  if(EXISTS "${_booster_venv}/bin/python3")
    set(_booster_python "${_booster_venv}/bin/python3")
  else()
    # <venv>/lib/pythonX.Y/site-packages/torch -> <venv>/bin/python3
    get_filename_component(_booster_python "${BOOSTER_TORCH_PREFIX}/../../../../bin/python3" ABSOLUTE)
  endif()
  set(BOOSTER_PYTHON "${_booster_python}" CACHE FILEPATH "Python with torch ${BOOSTER_TORCH_VERSION}: the tests' and benchmarks' peer")
endif()
if(NOT EXISTS "${BOOSTER_PYTHON}")
  message(WARNING "BOOSTER_PYTHON (${BOOSTER_PYTHON}) does not exist: the tests against Python torch "
    "will fail. Run `bash scripts/install_deps.sh` or pass -DBOOSTER_PYTHON=<python with torch ${BOOSTER_TORCH_VERSION}>.")
endif()

add_library(booster_torch_cpu INTERFACE)
target_link_libraries(booster_torch_cpu INTERFACE torch_cpu_library c10)
target_include_directories(booster_torch_cpu SYSTEM INTERFACE
  $<TARGET_PROPERTY:torch,INTERFACE_INCLUDE_DIRECTORIES>)
target_compile_options(booster_torch_cpu INTERFACE $<TARGET_PROPERTY:torch,INTERFACE_COMPILE_OPTIONS>)
install(TARGETS booster_torch_cpu EXPORT BoosterTargets)
unset(_booster_venv)
unset(_booster_venv_torch)
unset(_booster_python)
