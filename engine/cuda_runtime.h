// The CUDA runtime as the engine sees it, on both CUDA paths: the runtime API and __nv_bfloat16
// (the toolkit's headers under nvcc/ULYSSES_CUDA, the emulator's under ULYSSES_CUDA_EMULATION),
// and the switch that turns the CUDA backend on. Light enough for any .cpp: no kernel-side names.
#pragma once
#if !ULYSSES_HAVE_CUDA
#error "engine/cuda_runtime.h needs a CUDA build (-DULYSSES_CUDA=ON or -DULYSSES_CUDA_EMULATION=ON)"
#endif

#if ULYSSES_CUDA_EMULATED
#include "engine/cuda_emu/runtime.h"
#else
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#endif

#include <cstddef>
#include <cstdint>
#include <string>

namespace ul {

// Registers the DeviceOps of Device::cuda (cudaMalloc, cudaFree, cudaMemset, cudaMemcpy,
// cudaDeviceSynchronize; every call checked). Call it once before the first Context(Device::cuda);
// later calls do nothing, and it is safe from several threads. Throws when no device is visible.
// It is an explicit call rather than a static initialiser on purpose: the engine is a static
// library, and the linker drops an object file that nothing references, initialiser and all.
// It also checks the current device for this build (cuda_device_problem) the first time it sees it.
void init_cuda_backend();
// The number of devices this process sees, or a refusal naming `flag` and the cause (no device; a
// driver older than this build's CUDA, with the way on; another CUDA error's text).
int visible_cuda_devices(const std::string& flag);

// What stops this build from running on the current device, or "" when nothing does: a GPU older
// than sm_80 (the kernels use bf16 tensor cores and cp.async), or a build with no kernels for it
// (CMAKE_CUDA_ARCHITECTURES for another GPU), each said with its GPU and the fix.
std::string cuda_device_problem();

// The current device as this process first checked it (init_cuda_backend: before the engine
// allocates anything there; under --comm nccl, after NCCL's communicator took its buffers): its
// name, compute capability and memory, free and total, in bytes.
struct GpuInfo {
  int device = 0;
  std::string name;
  int major = 0, minor = 0;
  uint32_t id = 0;  // a hash of its UUID, never 0: which physical GPU (numbers repeat across
                    // processes that each see only their own; the emulator: one GPU a process)
  size_t free = 0, total = 0;
  std::string describe() const;  // "GPU 0 (NAME, compute capability 9.0, 79.1 of 79.6 GiB free)"
};
GpuInfo cuda_gpu_at_start();
// Measures the current device's free memory again as its start-up figure: after NCCL made the
// buffers it allocates only at a communicator's first collectives (the trainer's warm-up), which
// no plan holds, before this process allocates its own.
void cuda_remeasure_free_memory();

// The dynamic shared memory a block may opt in to on the current device, in bytes (99 KiB on
// sm_86, sm_89 and sm_120; 163 KiB on sm_80; 227 KiB on sm_90 and sm_100).
size_t cuda_smem_optin();

}  // namespace ul
