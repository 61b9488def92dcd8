// The linear layer on CUDA (the math is in linear.h; the CPU code it must match is linear.cpp).
// T is float or __nv_bfloat16; dw and db are fp32 (parameter gradients).
//
// forward      one GEMM, y = x w^T, with the bias added in the GEMM's epilogue.
// backward dx  one GEMM, dx += dy w (accumulating in place: beta = 1), or dx = dy w for the
//              gradient's first writer (beta = 0: dx is not read, so it need not be zeroed first).
// backward dw  one GEMM, dw += dy^T x, fp32 output from T inputs.
// backward db  the column sums of dy, deterministic (layers/column_sums.cuh).
#include "engine/cuda_launch.h"
#include "engine/gemm.h"
#include "layers/column_sums.cuh"
#include "layers/scratch_sizes.h"
#include "layers/linear.h"

namespace ul {
namespace cuda {
namespace {

// One row's contribution to the bias gradient: dy itself.
template <class T>
struct BiasTerm {
  using Elem = T;
  const T* dy;
  int OC;
  bool aligned() const { return pack_aligned({dy}); }
  template <int V>
  __device__ void operator()(int n, int c, float (&acc)[1][V]) const {
    float g[V];
    load_floats<V>(dy + size_t(n) * OC + c, g);
    for (int v = 0; v < V; v++) acc[0][v] += g[v];
  }
};

}  // namespace

size_t linear_backward_scratch_bytes(int N, int OC) { return scratch::linear_backward(N, OC); }

template <class T>
void column_sums_add(float* db, const T* dy, float* scratch, int N, int OC, cudaStream_t s) {
  colsum::add<1>("linear_bias_grad", colsum::Outs<1>{{db}}, BiasTerm<T>{dy, OC}, scratch, N, OC, s);
}

template <class T>
void linear_forward(T* y, const T* x, const T* w, const T* b, int N, int C, int OC, cudaStream_t s) {
  // y (N, OC) = x (N, C) · w^T (C, OC) + b
  gemm<T, T>(y, x, w, b, N, OC, C, /*trans_a=*/false, /*trans_b=*/true, /*accumulate=*/false, "linear forward", s);
}

template <class T>
void linear_backward(T* dx, float* dw, float* db, const T* dy, const T* x, const T* w, float* scratch, int N, int C,
                     int OC, cudaStream_t s, bool accumulate_dx) {
  // dx (N, C) += dy (N, OC) · w (OC, C)   (or = for the first writer)
  if (dx) gemm<T, T>(dx, dy, w, nullptr, N, C, OC, false, false, accumulate_dx, "linear backward dx", s);
  // dw (OC, C) += dy^T (OC, N) · x (N, C), in fp32
  if (dw) gemm<T, float>(dw, dy, x, nullptr, OC, C, N, true, false, true, "linear backward dw", s);
  if (db) column_sums_add<T>(db, dy, scratch, N, OC, s);
}

template void linear_forward<float>(float*, const float*, const float*, const float*, int, int, int, cudaStream_t);
template void linear_forward<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                                            const __nv_bfloat16*, int, int, int, cudaStream_t);
template void linear_backward<float>(float*, float*, float*, const float*, const float*, const float*, float*, int,
                                     int, int, cudaStream_t, bool);
template void linear_backward<__nv_bfloat16>(__nv_bfloat16*, float*, float*, const __nv_bfloat16*,
                                             const __nv_bfloat16*, const __nv_bfloat16*, float*, int, int, int,
                                             cudaStream_t, bool);
template void column_sums_add<float>(float*, const float*, float*, int, int, cudaStream_t);
template void column_sums_add<__nv_bfloat16>(float*, const __nv_bfloat16*, float*, int, int, cudaStream_t);

}  // namespace cuda
}  // namespace ul
