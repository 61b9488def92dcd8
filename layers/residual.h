// Residual add.  y = a + b (same shape).  Backward: da += dy, db += dy.
#pragma once
#include <cstdint>

#include "engine/tensor.h"
#if ULYSSES_HAVE_CUDA
#include "engine/cuda_runtime.h"
#endif

namespace ul {
namespace cpu {
template <class T> void residual_forward(T* y, const T* a, const T* b, int64_t n);
template <class T> void residual_backward(T* da, T* db, const T* dy, int64_t n);
}  // namespace cpu

#if ULYSSES_HAVE_CUDA
namespace cuda {
// T is float or __nv_bfloat16, sums in float. Pointers are device memory. Backward adds dy into
// da and db, which may be the same buffer (y = x + x: it gets 2 dy); acc_a / acc_b false: that
// gradient's first writer stores 0 + dy without reading it (Tape::grad_to_overwrite; one buffer: acc_b).
template <class T> void residual_forward(T* y, const T* a, const T* b, int64_t n, cudaStream_t s);
template <class T>
void residual_backward(T* da, T* db, const T* dy, int64_t n, cudaStream_t s, bool acc_a = true, bool acc_b = true);
}  // namespace cuda
#endif

Tensor add(const Tensor& a, const Tensor& b);

}  // namespace ul
