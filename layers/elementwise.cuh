// What the elementwise and row kernels share (gelu, swiglu, residual, the embedding gather, the
// norms, the column sums, the Ulysses permutes, attention's row dot): 16-byte packs, so that one
// load or store moves 4 floats or 8 bf16 (the widest access a thread issues), and the grid of a
// grid-stride loop. Included by .cu files only, after engine/cuda_launch.h.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "engine/cuda_launch.h"

namespace ul {
namespace cuda {

// V elements of T, aligned to their whole size so that nvcc loads or stores them as one vector.
template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// Elements per 16-byte pack: 4 floats, 8 bf16.
template <class T>
constexpr int kPackElems = int(16 / sizeof(T));

// p must be aligned to sizeof(T) * V bytes: a GPU faults on a misaligned vector access ("misaligned
// address"), and the emulator, where any address would do, throws instead, naming the kernel.
template <int V, class T>
__device__ __forceinline__ void check_pack_alignment(const T* p) {
#if ULYSSES_CUDA_EMULATED
  if (reinterpret_cast<uintptr_t>(p) % sizeof(Pack<T, V>) != 0)
    throw std::runtime_error("misaligned " + std::to_string(sizeof(Pack<T, V>)) + "-byte vector access");
#endif
}
template <int V, class T>
__device__ __forceinline__ Pack<T, V> load_pack(const T* p) {
  check_pack_alignment<V>(p);
  return *reinterpret_cast<const Pack<T, V>*>(p);
}
template <int V, class T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, V>& x) {
  check_pack_alignment<V>(p);
  *reinterpret_cast<Pack<T, V>*>(p) = x;
}

// V elements at p (16-byte aligned when V > 1) as floats, and floats rounded back into V elements:
// how the row kernels work on packs of a row.
template <int V, class T>
__device__ __forceinline__ void load_floats(const T* p, float (&out)[V]) {
  const Pack<T, V> pk = load_pack<V>(p);
  for (int k = 0; k < V; k++) out[k] = to_float(pk.v[k]);
}
template <int V, class T>
__device__ __forceinline__ void store_floats(T* p, const float (&in)[V]) {
  Pack<T, V> pk;
  for (int k = 0; k < V; k++) pk.v[k] = from_float<T>(in[k]);
  store_pack<V>(p, pk);
}

// True when every pointer sits on a 16-byte boundary, so that packs can be used on all of them.
inline bool pack_aligned(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// The row kernels' condition for their 16-byte path: rows of `inner` elements of T split into whole
// packs, and every buffer is 16-byte aligned (otherwise they take one element at a time).
template <class T>
inline bool packs_fit(int64_t inner, std::initializer_list<const void*> ptrs) {
  return inner % kPackElems<T> == 0 && pack_aligned(ptrs);
}

constexpr int kElementwiseThreads = 256;
// Blocks for a grid-stride loop over `work` items (work >= 1): one item per thread up to a few
// waves of an H100/H200 (132 SMs x 8 blocks of 256 threads, x4); past that each thread loops.
inline unsigned elementwise_blocks(int64_t work) {
  const int64_t blocks = (work + kElementwiseThreads - 1) / kElementwiseThreads;
  return unsigned(blocks < 4224 ? (blocks > 0 ? blocks : 1) : 4224);
}

// This thread's first item and the stride of a grid-stride loop.
__device__ __forceinline__ int64_t grid_first() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t grid_stride() { return int64_t(gridDim.x) * blockDim.x; }

}  // namespace cuda
}  // namespace ul
