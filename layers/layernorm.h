// LayerNorm over the last dim.  x: (N, C), w, b: (C)
//   mean = sum_c x / C,  rstd = 1 / sqrt(sum_c (x - mean)^2 / C + eps)
//   xhat = (x - mean) * rstd,  y = xhat * w + b
// Backward (per row, with g = dy * w):
//   dx += rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)),  dw += sum_n dy * xhat,  db += sum_n dy
#pragma once
#include <cstddef>

#include "engine/tensor.h"
#if ULYSSES_HAVE_CUDA
#include "engine/cuda_runtime.h"
#endif

namespace ul {

constexpr double kLayerNormEps = 1e-5;

namespace cpu {
// T is float (the backend) or double (the gradient checks).
template <class T>
void layernorm_forward(T* y, T* mean, T* rstd, const T* x, const T* w, const T* b, int N, int C);
template <class T>
void layernorm_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, const T* mean,
                        const T* rstd, int N, int C);
}  // namespace cpu

#if ULYSSES_HAVE_CUDA
namespace cuda {
// T is float or __nv_bfloat16; mean, rstd and all accumulation are float. Pointers are device memory.
template <class T>
void layernorm_forward(T* y, float* mean, float* rstd, const T* x, const T* w, const T* b, int N, int C,
                       cudaStream_t s);
// Adds into dx (T), dw and db (float: parameter gradients are f32 whatever T is).
// scratch: layernorm_backward_scratch_bytes(N, C) bytes of device memory for the per-chunk partial
// sums of dw and db, which are reduced in a fixed order (deterministic).
template <class T>
void layernorm_backward(T* dx, float* dw, float* db, const T* dy, const T* x, const T* w, const float* mean,
                        const float* rstd, float* scratch, int N, int C, cudaStream_t s);
size_t layernorm_backward_scratch_bytes(int N, int C);
}  // namespace cuda
#endif

// x: (..., C) -> (..., C)
Tensor layernorm(const Tensor& x, const Tensor& w, const Tensor& b);

}  // namespace ul
