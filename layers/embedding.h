// Token + learned position embedding.  idx, pos: (N) int32,  wte: (V, C),  wpe: (maxT, C) or none
//   y[n] = wte[idx[n]] + wpe[pos[n]]
// Positions are explicit so that a sequence-parallel slice uses global positions and a packed
// document can restart them. Backward: dwte[idx[n]] += dy[n], dwpe[pos[n]] += dy[n]; the CPU
// backward is deterministic (rows are summed in order of n for each vocabulary row).
// Token ids are checked against V: an id out of range is an error naming the id and V.
#pragma once
#include <cstdint>

#include "engine/tensor.h"
#if ULYSSES_HAVE_CUDA
#include "engine/cuda_runtime.h"
#endif

namespace ul {
namespace cpu {
template <class T>
void embedding_forward(T* y, const int32_t* idx, const int32_t* pos, const T* wte, const T* wpe, int N, int C);
template <class T>
void embedding_backward(T* dwte, T* dwpe, const T* dy, const int32_t* idx, const int32_t* pos, int N, int C);
}  // namespace cpu

#if ULYSSES_HAVE_CUDA
namespace cuda {
// T is float or __nv_bfloat16 (y, wte, wpe, dy); the table gradients are float (parameter
// gradients are f32). Pointers are device memory; wpe / dwpe nullptr: no position table.
template <class T>
void embedding_forward(T* y, const int32_t* idx, const int32_t* pos, const T* wte, const T* wpe, int N, int C,
                       cudaStream_t s);
// Adds into dwte and dwpe, deterministically and without atomics: rows n are sorted by table row
// (then n) and each table row sums its dy rows in order of n, as the CPU loop does.
// scratch: embedding_backward_scratch_bytes(N) bytes of device memory for the sort keys.
template <class T>
void embedding_backward(float* dwte, float* dwpe, const T* dy, const int32_t* idx, const int32_t* pos, void* scratch,
                        int N, int C, cudaStream_t s);
size_t embedding_backward_scratch_bytes(int N);
// The backward's first step, on its own for its test: keys[n] = (ids[n] << 32) | n for n < N,
// sorted ascending (by table row, then n). keys: embedding_backward_scratch_bytes(N) bytes; the
// first N hold the result, the rest are padding.
void embedding_sort_keys(uint64_t* keys, const int32_t* ids, int N, cudaStream_t s);
// The smallest n with v[n] outside [0, limit), or -1 when every value is in range. scratch: one
// int of device memory. Waits for the stream (the answer is read back to the host).
int embedding_first_out_of_range(const int32_t* v, int N, int64_t limit, int* scratch, cudaStream_t s);
}  // namespace cuda
#endif

// idx, pos: i32 (B, T);  wte: (V, C);  wpe: (maxT, C) or an undefined Tensor (Llama: no wpe)
// -> (B, T, C)
Tensor embedding(const Tensor& idx, const Tensor& pos, const Tensor& wte, const Tensor& wpe);

}  // namespace ul
