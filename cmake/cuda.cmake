# The CUDA backend: the *.cu files in engine/, layers/ and parallel/, built one of two ways.
#   ULYSSES_CUDA            nvcc for sm_90 (Hopper), linked with cudart and cuBLASLt.
#   ULYSSES_CUDA_EMULATION  the same files compiled as C++ with engine/cuda_emu/cuda_emu.h
#                           force-included; their kernels run on the CPU, so CI executes them.
# Both define ULYSSES_HAVE_CUDA=1 for everything that links the engine; the emulation also defines
# ULYSSES_CUDA_EMULATED=1. Neither is on by default: the default build is the CPU engine alone.
option(ULYSSES_CUDA "Build the CUDA backend with nvcc (sm_90)" OFF)
option(ULYSSES_CUDA_EMULATION "Build the CUDA backend as C++ and run its kernels on the CPU" OFF)

if(ULYSSES_CUDA AND ULYSSES_CUDA_EMULATION)
  message(FATAL_ERROR "ULYSSES_CUDA and ULYSSES_CUDA_EMULATION are mutually exclusive: "
                      "choose nvcc for a GPU, or the emulator for the CPU")
endif()
if(NOT ULYSSES_CUDA AND NOT ULYSSES_CUDA_EMULATION)
  return()
endif()

file(GLOB ULYSSES_CUDA_SOURCES CONFIGURE_DEPENDS
  ${PROJECT_SOURCE_DIR}/engine/*.cu ${PROJECT_SOURCE_DIR}/layers/*.cu ${PROJECT_SOURCE_DIR}/parallel/*.cu)

if(ULYSSES_CUDA_EMULATION)
  file(GLOB ULYSSES_EMU_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/engine/cuda_emu/*.cpp)
  # LANGUAGE CXX makes CMake (policy CMP0119) compile them with -x c++.
  # A kernel's registers start as garbage on a GPU, zero (or the last value) here as often as not:
  # locals the compiler can fill with a non-zero pattern make a read before the write show.
  include(CheckCXXCompilerFlag)
  check_cxx_compiler_flag(-ftrivial-auto-var-init=pattern ULYSSES_HAVE_AUTO_VAR_INIT)
  set(emu_kernel_options "-include;${PROJECT_SOURCE_DIR}/engine/cuda_emu/cuda_emu.h")
  if(ULYSSES_HAVE_AUTO_VAR_INIT)
    list(APPEND emu_kernel_options -ftrivial-auto-var-init=pattern)
  endif()
  set_source_files_properties(${ULYSSES_CUDA_SOURCES} PROPERTIES
    LANGUAGE CXX
    COMPILE_OPTIONS "${emu_kernel_options}")
  # The NCCL communicator too, on the emulated NCCL (engine/cuda_emu/nccl.h).
  target_sources(ulysses PRIVATE ${ULYSSES_CUDA_SOURCES} ${ULYSSES_EMU_SOURCES} ${PROJECT_SOURCE_DIR}/parallel/comm_nccl.cpp)
  target_compile_definitions(ulysses PUBLIC ULYSSES_HAVE_CUDA=1 ULYSSES_CUDA_EMULATED=1 ULYSSES_HAVE_NCCL=1)
  message(STATUS "ulysses: CUDA backend emulated on the CPU (${CMAKE_CXX_COMPILER_ID})")
  return()
endif()

# ---- real CUDA ----------------------------------------------------------------------------------
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90)
endif()
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
# The library was made before CUDA was enabled, so it did not pick up the CUDA defaults: set them.
set_target_properties(ulysses PROPERTIES
  CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}" CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)

# The directory-wide flags (-Wall, -march=native, sanitizers) are g++ flags that nvcc rejects: keep
# a target's inherited options on its C++ sources only.
function(ulysses_cxx_only_options target)
  get_target_property(options ${target} COMPILE_OPTIONS)
  if(options)
    set(wrapped "")
    foreach(opt IN LISTS options)
      list(APPEND wrapped "$<$<COMPILE_LANGUAGE:CXX>:${opt}>")
    endforeach()
    set_property(TARGET ${target} PROPERTY COMPILE_OPTIONS ${wrapped})
  endif()
endfunction()
ulysses_cxx_only_options(ulysses)

target_sources(ulysses PRIVATE ${ULYSSES_CUDA_SOURCES})
# Every nvcc warning in the project's kernels is an error; -lineinfo lets profilers map to source.
target_compile_options(ulysses PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--Werror=all-warnings -lineinfo>)
target_link_libraries(ulysses PUBLIC CUDA::cudart CUDA::cublasLt)

# NCCL (shipped with the CUDA toolkit here, or a separate package): the GPU communicator.
find_library(ULYSSES_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
find_path(ULYSSES_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
if(ULYSSES_NCCL_LIBRARY AND ULYSSES_NCCL_INCLUDE)
  target_sources(ulysses PRIVATE ${PROJECT_SOURCE_DIR}/parallel/comm_nccl.cpp)
  target_include_directories(ulysses PUBLIC ${ULYSSES_NCCL_INCLUDE})
  target_link_libraries(ulysses PUBLIC ${ULYSSES_NCCL_LIBRARY})
  target_compile_definitions(ulysses PUBLIC ULYSSES_HAVE_NCCL=1)
  message(STATUS "ulysses: NCCL communicator (${ULYSSES_NCCL_LIBRARY})")
else()
  message(STATUS "ulysses: NCCL not found: no nccl communicator")
endif()
target_compile_definitions(ulysses PUBLIC ULYSSES_HAVE_CUDA=1)
# What the start-up check names when the GPU is not among them (engine/cuda_runtime.cu); commas,
# as a ';' would split the definition.
string(REPLACE ";" "," ULYSSES_CUDA_ARCH_LIST "${CMAKE_CUDA_ARCHITECTURES}")
set_property(SOURCE ${PROJECT_SOURCE_DIR}/engine/cuda_runtime.cu APPEND PROPERTY
  COMPILE_DEFINITIONS "ULYSSES_CUDA_ARCHS=\"${ULYSSES_CUDA_ARCH_LIST}\"")
message(STATUS "ulysses: CUDA backend for CMAKE_CUDA_ARCHITECTURES=${CMAKE_CUDA_ARCHITECTURES} "
               "(nvcc ${CMAKE_CUDA_COMPILER_VERSION})")
