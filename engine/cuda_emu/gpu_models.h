// Which GPU the emulator pretends to be, and which GPUs the "binary" has kernels for: enough of a
// real device's properties for the engine's start-up check (engine/cuda_runtime.cu) and its
// choice of kernel variants, so a test on the CPU sees what a user of an A100, an L40S or a V100
// would see. Chosen by two environment variables, read at each query:
//   ULYSSES_EMU_GPU            h100 (the default), h200, b200, a100, a10, rtx3090, l40s, rtx4090,
//                              rtx5090, v100, t4
//   ULYSSES_EMU_KERNEL_ARCHS   the build's CMAKE_CUDA_ARCHITECTURES, e.g. "90" or "80;90-real"
//                              (unset: an image for every GPU, as an emulated kernel runs anywhere)
#pragma once
#include <cstddef>
#include <string>

namespace ul_emu {

struct GpuModel {
  const char* key;    // ULYSSES_EMU_GPU's value
  const char* name;   // as cudaDeviceProp::name says it
  int major, minor;   // compute capability
  size_t smem_optin;  // dynamic shared memory a block may opt in to (cudaDevAttrMaxSharedMemoryPerBlockOptin)
  int sms;
  size_t memory;      // bytes
};

// The model ULYSSES_EMU_GPU names; an unknown name throws std::runtime_error listing the known.
const GpuModel& emulated_gpu();

// ULYSSES_EMU_KERNEL_ARCHS, or "" when unset.
std::string kernel_archs();

// Whether a build for `archs` (CMake's list: "NN" is SASS and PTX for sm_NN, "NN-real" SASS only,
// "NN-virtual" PTX only) runs on compute capability major.minor, by CUDA's rules: SASS for sm_XY
// runs on X.Z for Z >= Y (same major); PTX for compute_XY is compiled by the driver for any
// capability >= X.Y. The arch-specific "NNa" (sm_90a, sm_100a: SASS and PTX) runs on X.Y alone,
// the family-specific "NNf" (sm_100f) on X.Z for Z >= Y. "" means every GPU. A malformed list
// (or CMake's "native", "all", which only CMake resolves) throws std::runtime_error.
bool has_kernel_image(const std::string& archs, int major, int minor);

}  // namespace ul_emu
