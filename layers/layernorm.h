// LayerNorm over the last dim.  x: (N, C), w, b: (C)
//   mean = sum_c x / C,  rstd = 1 / sqrt(sum_c (x - mean)^2 / C + eps)
//   xhat = (x - mean) * rstd,  y = xhat * w + b
// Backward (per row, with g = dy * w):
//   dx += rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)),  dw += sum_n dy * xhat,  db += sum_n dy
#pragma once
#include "engine/tensor.h"

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

// x: (..., C) -> (..., C)
Tensor layernorm(const Tensor& x, const Tensor& w, const Tensor& b);

}  // namespace ul
