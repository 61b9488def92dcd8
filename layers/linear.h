// Linear layer (PyTorch/llm.c weight layout).  x: (N, C),  w: (OC, C),  b: (OC) or none
//   y = x w^T + b                                   (N, OC)
// Backward:  dx += dy w  (N, C),   dw += dy^T x  (OC, C),   db += sum_n dy  (OC)
// The CPU backend maps the buffers as row-major Eigen matrices: Eigen's GEMM, multi-threaded
// through OpenMP, does the work.
#pragma once
#include "engine/tensor.h"

namespace ul {
namespace cpu {
template <class T> void linear_forward(T* y, const T* x, const T* w, const T* b, int N, int C, int OC);
// b may be null (no bias): then db is ignored. dx, dw or db may be null: that gradient (and its
// GEMM) is skipped.
template <class T>
void linear_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, int N, int C, int OC);
}  // namespace cpu

// x: (..., C) -> (..., OC); b may be an undefined Tensor.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b);

}  // namespace ul
