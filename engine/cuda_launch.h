// What every .cu file includes: the one kernel-launch helper, the runtime-call check, dynamic
// shared memory spelled the same on both paths, and the element helpers the kernels share.
//
//   ul::launch("layernorm_forward", layernorm_forward_kernel<T>, grid, block, smem_bytes, stream, args...);
//
// is kernel<<<grid, block, smem_bytes, stream>>>(args...) plus a checked cudaGetLastError() under
// nvcc, and the SIMT emulator (engine/cuda_emu) under ULYSSES_CUDA_EMULATION. Either way a bad
// launch throws std::runtime_error naming the kernel. The name is passed explicitly because
// neither path can recover a readable name from a function pointer.
#pragma once
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>

#include "engine/cuda_runtime.h"
#include "engine/gpu_profile.h"
#if ULYSSES_CUDA_EMULATED
#include "engine/cuda_emu/cuda_emu.h"
#endif

// Throws std::runtime_error naming the call, where it was made, and the runtime's message.
#define UL_CUDA_CHECK(call) ::ul::cuda_check((call), #call, __FILE__, __LINE__)

namespace ul {

// The errors a kernel's fault leaves. They are sticky (every later call returns them), and a GPU
// reports one at the first call after the fault that waits for the device: a copy, a free, a
// synchronize, or the check after a later kernel's launch, none of which can name the kernel.
inline bool kernel_fault(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure: return true;
    default: return false;
  }
}
// What to do to find the kernel that faulted.
inline const char* kernel_fault_hint() {
  return " (a kernel launched before this point faulted: rerun with CUDA_LAUNCH_BLOCKING=1, where each launch's "
         "own check reports its fault and names its kernel, or under compute-sanitizer)";
}

// The runtime's message for e, and for a kernel's fault how to find the kernel.
inline std::string cuda_error_text(cudaError_t e) {
  return std::string(cudaGetErrorString(e)) + (kernel_fault(e) ? kernel_fault_hint() : "");
}

inline void cuda_check(cudaError_t e, const char* call, const char* file, int line) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("CUDA error: ") + call + " at " + file + ":" + std::to_string(line) +
                             ": " + cuda_error_text(e));
}

// The message of a launch whose check found error e. Under CUDA_LAUNCH_BLOCKING=1 each kernel
// has ended when its launch returns, so a fault there is this kernel's; otherwise it may be an
// earlier kernel's (sticky), and blaming this one would send the user to the wrong kernel.
inline std::string launch_error(const char* name, dim3 grid, dim3 block, size_t smem_bytes, cudaError_t e,
                                bool launch_blocking) {
  const std::string where = "kernel '" + std::string(name) + "' (grid " + std::to_string(grid.x) + "x" +
                            std::to_string(grid.y) + "x" + std::to_string(grid.z) + ", block " +
                            std::to_string(block.x) + "x" + std::to_string(block.y) + "x" +
                            std::to_string(block.z) + ", " + std::to_string(smem_bytes) + " bytes shared)";
  if (kernel_fault(e) && launch_blocking) return where + " faulted: " + cudaGetErrorString(e);
  return "launching " + where + ": " + cuda_error_text(e);
}

// Blocks to cover a elements b at a time. More than a grid's x dimension holds (2^31 - 1) is an
// error, not a count cut to 32 bits (a launch over the first few elements only).
inline unsigned ceil_div(long long a, long long b) {
  const long long n = (a + b - 1) / b;
  if (n > 0x7fffffffLL)
    throw std::runtime_error("a launch of " + std::to_string(n) + " blocks: more than a grid's 2^31 - 1");
  return unsigned(n);
}
// For a grid-stride loop: blocks to cover a elements b at a time, at most cap (any a).
inline unsigned capped_blocks(long long a, long long b, long long cap) {
  const long long n = (a + b - 1) / b;
  return unsigned(n < cap ? n : cap);
}

}  // namespace ul

// The kernel side exists only where kernels are compiled: nvcc, or C++ under the emulator.
#if defined(__CUDACC__) || ULYSSES_CUDA_EMULATED

// Loops over per-thread arrays (fragments, accumulators, rows, loads in flight) are unrolled so
// that the arrays can live in registers; the emulator runs them as written.
#if defined(__CUDACC__)
#define UL_UNROLL _Pragma("unroll")
#else
#define UL_UNROLL
#endif

#ifndef UL_STATIC_SMEM
// Static shared memory: `UL_STATIC_SMEM(float, s, [32]);` (the emulator fills it with NaN bytes at
// each block's start, engine/cuda_emu/cuda_emu.h).
#define UL_STATIC_SMEM(T, name, dims) __shared__ T name dims
#endif

#ifndef UL_DYNAMIC_SMEM
// One byte array viewed as T: declaring `extern __shared__ T name[]` with a different T in each
// template instance would be a conflicting redeclaration.
#define UL_DYNAMIC_SMEM(T, name)                                  \
  extern __shared__ __align__(16) unsigned char ul_dynamic_smem_[]; \
  T* name = reinterpret_cast<T*>(ul_dynamic_smem_)
#endif

namespace ul {

template <class... P, class... A>
void launch(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem_bytes,
            cudaStream_t stream, A&&... args) {
  gpu_profile::Span span;  // times the kernel under --profile (engine/gpu_profile.h)
  if (gpu_profile::enabled()) span.begin(name, stream);
#if ULYSSES_CUDA_EMULATED
  // An earlier kernel's fault is sticky: the launch fails as <<<>>>'s check below would.
  if (const cudaError_t e = ul_emu::device_fault())
    throw std::runtime_error(launch_error(name, grid, block, smem_bytes, e, false));
  ul_emu::launch(name, kernel, grid, block, smem_bytes, stream, std::forward<A>(args)...);
  // As <<<>>>'s check below: an error some earlier call left pending (a poll's "not ready" left
  // behind) fails this launch, here as on a GPU.
  if (const cudaError_t e = cudaGetLastError())
    throw std::runtime_error(launch_error(name, grid, block, smem_bytes, e, false));
#else
  kernel<<<grid, block, smem_bytes, stream>>>(std::forward<A>(args)...);
  cudaError_t e = cudaGetLastError();
  // Under CUDA_LAUNCH_BLOCKING=1 the launch returns once the kernel has run, but its fault may
  // reach only the next call: this synchronize makes it this launch's.
  static const bool blocking = [] {
    const char* v = std::getenv("CUDA_LAUNCH_BLOCKING");
    return v && std::string(v) == "1";
  }();
  if (e == cudaSuccess && blocking) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) throw std::runtime_error(launch_error(name, grid, block, smem_bytes, e, blocking));
#endif
}

namespace cuda {

// Kernels load and store T (float or __nv_bfloat16) and compute in float.
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16(v); }

// Sum over the 32 lanes of a full warp; every lane gets the total (butterfly: same order on every
// lane, so every lane gets the same bits).
template <class F>
__device__ __forceinline__ F warp_sum(F v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

}  // namespace cuda
}  // namespace ul

#endif  // __CUDACC__ || ULYSSES_CUDA_EMULATED
