// RMSNorm over the last dim (Llama).  x: (N, C), w: (C)
//   rrms = 1 / sqrt(sum_c x^2 / C + eps),  y = x * rrms * w
// eps is the model's (ModelConfig::norm_eps: 1e-5 for Llama, 1e-6 for Qwen 2); the backward needs
// only rrms.
// Backward (per row, g = dy * w):  dx += rrms * (g - x * rrms^2 * mean_c(g * x)),  dw += sum_n dy * x * rrms
#pragma once
#include <cstddef>

#include "engine/tensor.h"
#if ULYSSES_HAVE_CUDA
#include "engine/cuda_runtime.h"
#endif

namespace ul {

constexpr double kRMSNormEps = 1e-5;  // Llama's, the default

namespace cpu {
// eps in double here: the float64 references use it exactly; T(eps) rounds it for T = float.
template <class T> void rmsnorm_forward(T* y, T* rrms, const T* x, const T* w, int N, int C, double eps = kRMSNormEps);
template <class T> void rmsnorm_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rrms, int N, int C);
}  // namespace cpu

#if ULYSSES_HAVE_CUDA
namespace cuda {
// T is float or __nv_bfloat16; rrms and all accumulation are float. Pointers are device memory.
template <class T>
void rmsnorm_forward(T* y, float* rrms, const T* x, const T* w, int N, int C, cudaStream_t s,
                     float eps = float(kRMSNormEps));
// Adds into dx (T) and dw (float: parameter gradients are f32). scratch: rmsnorm_backward_scratch_bytes(N, C)
// bytes of device memory for per-chunk partial sums of dw, reduced in a fixed order (deterministic).
template <class T>
void rmsnorm_backward(T* dx, float* dw, const T* dy, const T* x, const T* w, const float* rrms, float* scratch, int N,
                      int C, cudaStream_t s);
size_t rmsnorm_backward_scratch_bytes(int N, int C);
}  // namespace cuda
#endif

// x: (..., C) -> (..., C)
Tensor rmsnorm(const Tensor& x, const Tensor& w, float eps = float(kRMSNormEps));

}  // namespace ul
