// Rotary position embedding on packed q/k/v heads, "rotate half" convention (as in Hugging Face
// Llama): for head dim D and i < D/2, with angle a = pos * theta^(-2i/D):
//   y[i]       = x[i] cos a - x[i + D/2] sin a
//   y[i + D/2] = x[i + D/2] cos a + x[i] sin a
// applied to the Hq query heads and Hkv key heads; the Hkv value heads pass through unchanged.
// Backward is the inverse rotation (angle -a) of dy. Positions are explicit (global positions
// under sequence parallelism; restarted per document when packing).
#pragma once
#include <cstdint>

#include "engine/tensor.h"
#if ULYSSES_HAVE_CUDA
#include "engine/cuda_runtime.h"
#endif

namespace ul {
namespace cpu {
// qkv, y: (N, Hq + 2*Hkv, D); pos: (N)
template <class T>
void rope_forward(T* y, const T* qkv, const int32_t* pos, int N, int Hq, int Hkv, int D, float theta);
template <class T>
void rope_backward(T* dqkv, const T* dy, const int32_t* pos, int N, int Hq, int Hkv, int D, float theta);
}  // namespace cpu

#if ULYSSES_HAVE_CUDA
namespace cuda {
// T is float or __nv_bfloat16; pointers are device memory. Angles are computed in double (exact
// enough at positions in the millions), their cos and sin rounded to float, the rotation in float.
// Forward writes y (which may alias qkv); backward adds into dqkv.
template <class T>
void rope_forward(T* y, const T* qkv, const int32_t* pos, int N, int Hq, int Hkv, int D, float theta, cudaStream_t s);
template <class T>
void rope_backward(T* dqkv, const T* dy, const int32_t* pos, int N, int Hq, int Hkv, int D, float theta,
                   cudaStream_t s);
}  // namespace cuda
#endif

// qkv: (B, T, Hq + 2*Hkv, D), pos: i32 (B, T) -> same shape as qkv
Tensor rope(const Tensor& qkv, const Tensor& pos, int Hq, int Hkv, float theta);

}  // namespace ul
