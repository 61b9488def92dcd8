// RMSNorm over the last dim (Llama).  x: (N, C), w: (C)
//   rrms = 1 / sqrt(sum_c x^2 / C + eps),  y = x * rrms * w
// Backward (per row, g = dy * w):  dx += rrms * (g - x * rrms^2 * mean_c(g * x)),  dw += sum_n dy * x * rrms
#pragma once
#include "engine/tensor.h"

namespace ul {

constexpr double kRMSNormEps = 1e-5;

namespace cpu {
template <class T> void rmsnorm_forward(T* y, T* rrms, const T* x, const T* w, int N, int C);
template <class T> void rmsnorm_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rrms, int N, int C);
}  // namespace cpu

// x: (..., C) -> (..., C)
Tensor rmsnorm(const Tensor& x, const Tensor& w);

}  // namespace ul
