// GELU, tanh approximation (GPT-2):  y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// Backward: dx += g * gelu'(x), g the output's gradient, the derivative computed from x (nothing
// else is kept).
// Both backends compute it as y = x sigmoid(2 u), u = sqrt(2/pi) (x + 0.044715 x^3): the same
// function with one exp (on the CPU one that vectorizes, layers/cpu_exp.h) and no cancellation in
// 1 + tanh(u) where tanh(u) is near -1.
#pragma once
#include <cstdint>

#include "engine/tensor.h"
#if ULYSSES_HAVE_CUDA
#include "engine/cuda_runtime.h"
#endif

namespace ul {
constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluCubic = 0.044715;

namespace cpu {
template <class T> void gelu_forward(T* y, const T* x, int64_t n);
template <class T> void gelu_backward(T* dx, const T* dy, const T* x, int64_t n);
}  // namespace cpu

#if ULYSSES_HAVE_CUDA
namespace cuda {
// T is float or __nv_bfloat16, math in float. Pointers are device memory; backward adds into dx,
// or with accumulate false stores 0 + dy gelu'(x) there without reading it (the first writer).
template <class T> void gelu_forward(T* y, const T* x, int64_t n, cudaStream_t s);
template <class T>
void gelu_backward(T* dx, const T* dy, const T* x, int64_t n, cudaStream_t s, bool accumulate = true);
}  // namespace cuda
#endif

Tensor gelu(const Tensor& x);  // any shape

}  // namespace ul
