// SwiGLU (Llama MLP gate).  x: (N, 2F) holding [gate | up] per row  ->  y: (N, F)
//   y = silu(gate) * up,  silu(g) = g * sigmoid(g)
// Backward: dgate += dy * up * sigmoid(g) * (1 + g (1 - sigmoid(g))),  dup += dy * silu(g)
#pragma once
#include "engine/tensor.h"
#if ULYSSES_HAVE_CUDA
#include "engine/cuda_runtime.h"
#endif

namespace ul {
namespace cpu {
template <class T> void swiglu_forward(T* y, const T* x, int N, int F);
template <class T> void swiglu_backward(T* dx, const T* dy, const T* x, int N, int F);
}  // namespace cpu

#if ULYSSES_HAVE_CUDA
namespace cuda {
// T is float or __nv_bfloat16, math in float. Pointers are device memory; backward adds into dx.
template <class T> void swiglu_forward(T* y, const T* x, int N, int F, cudaStream_t s);
// accumulate false: dx's first writer stores 0 + the gradient, never reading dx (Tape::grad_to_overwrite).
template <class T>
void swiglu_backward(T* dx, const T* dy, const T* x, int N, int F, cudaStream_t s, bool accumulate = true);
}  // namespace cuda
#endif

Tensor swiglu(const Tensor& x);  // (..., 2F) -> (..., F)

}  // namespace ul
