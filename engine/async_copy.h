// Asynchronous global -> shared copies (cp.async, sm_80 and later): a thread issues copies, groups
// them with cp_async_commit(), and goes on computing; cp_async_wait<N>() blocks until at most its N
// newest groups are still in flight. That is how a kernel loads the next tile while the tensor
// cores work on this one (double buffering):
//
//   issue(tile 0); commit
//   for each tile i:  issue(tile i + 1) into the other buffer; commit; wait<1>   (tile i has landed)
//                     __syncthreads()   (every thread's copies of tile i have landed)
//                     compute on tile i
//                     __syncthreads()   (nobody reads tile i's buffer any more: i + 2 may fill it)
//
// A copy moves `kBytes` (4, 8 or 16; both addresses aligned to it) of which the first src_bytes are
// read from global memory and the rest zero-filled: src_bytes = 0 writes zeros and reads nothing
// (src must still be a valid address). Under the emulator the destination is NaN from the issue
// until the wait that retires its group (engine/cuda_emu/cuda_emu.h), so a missing wait or barrier
// reads NaN instead of passing by luck.
#pragma once
#include "engine/cuda_launch.h"

// Device code for an older GPU would fail in ptxas with "Feature ... requires sm_80": say it plainly.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "ulysses' kernels need sm_80 or newer (bf16 mma.sync, cp.async): set CMAKE_CUDA_ARCHITECTURES to 80 or above"
#endif

#if defined(__CUDACC__) || ULYSSES_CUDA_EMULATED

namespace ul {
namespace cuda {

template <int kBytes>
__device__ __forceinline__ void cp_async(void* smem, const void* gmem, int src_bytes) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async moves 4, 8 or 16 bytes");
#if ULYSSES_CUDA_EMULATED
  ul_emu::cp_async(smem, gmem, kBytes, src_bytes);
#elif defined(__CUDA_ARCH__)
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (kBytes == 16)  // .cg: 16-byte copies may bypass L1 (the tile is read once per block)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(gmem), "n"(kBytes),
                 "r"(src_bytes)
                 : "memory");
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if ULYSSES_CUDA_EMULATED
  ul_emu::cp_async_commit();
#elif defined(__CUDA_ARCH__)
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if ULYSSES_CUDA_EMULATED
  ul_emu::cp_async_wait(kPending);
#elif defined(__CUDA_ARCH__)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

}  // namespace cuda
}  // namespace ul

#endif  // __CUDACC__ || ULYSSES_CUDA_EMULATED
