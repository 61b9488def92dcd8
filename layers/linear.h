// Linear layer (PyTorch/llm.c weight layout).  x: (N, C),  w: (OC, C),  b: (OC) or none
//   y = x w^T + b                                   (N, OC)
// Backward:  dx += dy w  (N, C),   dw += dy^T x  (OC, C),   db += sum_n dy  (OC)
// The CPU backend maps the buffers as row-major Eigen matrices: Eigen's GEMM on blocks fixed by
// the shape, shared out to OpenMP threads (layers/gemm_blocks.h), so any --threads gives the same bits.
#pragma once
#include <cstddef>

#include "engine/tensor.h"
#if ULYSSES_HAVE_CUDA
#include "engine/cuda_runtime.h"
#endif

namespace ul {
namespace cpu {
template <class T> void linear_forward(T* y, const T* x, const T* w, const T* b, int N, int C, int OC);
// b may be null (no bias): then db is ignored. dx, dw or db may be null: that gradient (and its
// GEMM) is skipped.
template <class T>
void linear_backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, int N, int C, int OC);
}  // namespace cpu

#if ULYSSES_HAVE_CUDA
namespace cuda {
// T is float or __nv_bfloat16; pointers are device memory. The GEMMs are engine/gemm.h's.
// y = x w^T (+ b): b may be null.
template <class T>
void linear_forward(T* y, const T* x, const T* w, const T* b, int N, int C, int OC, cudaStream_t s);
// Adds into dx (T), dw and db (fp32 parameter gradients, whatever T is); with accumulate_dx false
// it stores dx instead, never reading it (a gradient's first writer: Tape::grad_to_overwrite). Any
// of dx, dw, db may be null: that gradient (and its GEMM) is skipped. scratch:
// linear_backward_scratch_bytes(N, OC) bytes of device memory for db's per-chunk partial sums,
// reduced in a fixed order (deterministic).
template <class T>
void linear_backward(T* dx, float* dw, float* db, const T* dy, const T* x, const T* w, float* scratch, int N, int C,
                     int OC, cudaStream_t s, bool accumulate_dx = true);
size_t linear_backward_scratch_bytes(int N, int OC);
// db (OC) += sum_n dy (N, OC), the column sums behind linear_backward's db; scratch as above.
template <class T>
void column_sums_add(float* db, const T* dy, float* scratch, int N, int OC, cudaStream_t s);
}  // namespace cuda
#endif

// x: (..., C) -> (..., OC); b may be an undefined Tensor.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b);

}  // namespace ul
