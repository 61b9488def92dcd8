// RMSNorm on CUDA (the math is in rmsnorm.h; the CPU loop it must match is in rmsnorm.cpp).
// T is float or __nv_bfloat16; rrms, every sum and the parameter gradient dw are float.
//
// forward      one warp per row: sum of squares (warp_sum), then y. Each lane takes packs of V
//              columns, (lane + 32 k) V ..., V = 8 bf16 or 4 floats (16-byte loads) when
//              C % V == 0 and the buffers are 16-byte aligned, else V = 1.
// backward dx  the same layout: per row, mean_c(dy * w * x), then dx += ...
// backward dw  the column sums of dy * x * rrms, deterministic (layers/column_sums.cuh).
#include <cfloat>

#include "engine/cuda_launch.h"
#include "layers/column_sums.cuh"
#include "layers/elementwise.cuh"
#include "layers/scratch_sizes.h"
#include "layers/rmsnorm.h"

namespace ul {
namespace cuda {
namespace {

constexpr int kWarps = 8;           // rows per block in the row kernels (8 warps, 256 threads)

// y, x: (N, C); w: (C); rrms: (N)
template <class T, int V>
__global__ void rmsnorm_forward_kernel(T* __restrict__ y, float* __restrict__ rrms, const T* __restrict__ x,
                                       const T* __restrict__ w, int N, int C, float eps) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarps + threadIdx.x / 32;
  if (row >= N) return;  // whole warps leave together, so no lane is missing from a shuffle below
  const T* xr = x + size_t(row) * C;
  T* yr = y + size_t(row) * C;
  float xv[V];

  float ss = 0.f;
  for (int c = lane * V; c < C; c += 32 * V) {
    load_floats<V>(xr + c, xv);
    for (int k = 0; k < V; k++) ss += xv[k] * xv[k];
  }
  ss = warp_sum(ss);  // every lane's: the branch below is the warp's
  float r = rsqrtf(ss / C + eps);
  if (isinf(ss)) {  // a row past ~1.8e19 / sqrt(C): r would be 0, the row silently 0 (as the CPU op)
    double wide = 0;
    for (int c = lane * V; c < C; c += 32 * V) {
      load_floats<V>(xr + c, xv);
      for (int k = 0; k < V; k++) wide += double(xv[k]) * double(xv[k]);
    }
    r = float(1.0 / sqrt(warp_sum(wide) / C + double(eps)));
  }
  for (int c = lane * V; c < C; c += 32 * V) {
    float wv[V], yv[V];
    load_floats<V>(xr + c, xv);
    load_floats<V>(w + c, wv);
    for (int k = 0; k < V; k++) yv[k] = xv[k] * r * wv[k];
    store_floats<V>(yr + c, yv);
  }
  if (lane == 0) rrms[row] = r;
}

// dx += rrms * (g - x * rrms^2 * mean_c(g * x)),  g = dy * w.  dx, dy, x: (N, C)
template <class T, int V>
__global__ void rmsnorm_backward_dx_kernel(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ x,
                                           const T* __restrict__ w, const float* __restrict__ rrms, int N, int C) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarps + threadIdx.x / 32;
  if (row >= N) return;
  const size_t off = size_t(row) * C;
  const float r = rrms[row];
  float dyv[V], xv[V], wv[V];

  float gx_sum = 0.f;
  for (int c = lane * V; c < C; c += 32 * V) {
    load_floats<V>(dy + off + c, dyv);
    load_floats<V>(x + off + c, xv);
    load_floats<V>(w + c, wv);
    for (int k = 0; k < V; k++) gx_sum += dyv[k] * wv[k] * xv[k];
  }
  const float g_mean = warp_sum(gx_sum) / C;
  // r^2 below the smallest normal float (a row past ~1e19): r times the mean first, as the CPU op
  // does there (the usual rows keep their bits).
  const float kk = r != 0.f && r * r < FLT_MIN ? (r * g_mean) * r : r * r * g_mean;
  for (int c = lane * V; c < C; c += 32 * V) {
    float dxv[V];
    load_floats<V>(dy + off + c, dyv);
    load_floats<V>(x + off + c, xv);
    load_floats<V>(w + c, wv);
    load_floats<V>(dx + off + c, dxv);
    for (int k = 0; k < V; k++) dxv[k] += r * (dyv[k] * wv[k] - xv[k] * kk);
    store_floats<V>(dx + off + c, dxv);
  }
}

// One row's contribution to dw: dy * x * rrms (a colsum Term, column_sums.cuh).
template <class T>
struct WeightTerm {
  using Elem = T;
  const T *dy, *x;
  const float* rrms;
  int C;
  bool aligned() const { return pack_aligned({dy, x}); }
  template <int V>
  __device__ void operator()(int n, int c, float (&acc)[1][V]) const {
    float g[V], xv[V];
    load_floats<V>(dy + size_t(n) * C + c, g);
    load_floats<V>(x + size_t(n) * C + c, xv);
    const float r = rrms[n];
    for (int v = 0; v < V; v++) acc[0][v] += g[v] * xv[v] * r;
  }
};

}  // namespace

size_t rmsnorm_backward_scratch_bytes(int N, int C) { return scratch::rmsnorm_backward(N, C); }

template <class T>
void rmsnorm_forward(T* y, float* rrms, const T* x, const T* w, int N, int C, cudaStream_t s, float eps) {
  if (N == 0 || C == 0) return;  // a grid of no blocks is an invalid launch
  const dim3 grid(ceil_div(N, kWarps)), block(32 * kWarps);
  if (packs_fit<T>(C, {y, x, w}))
    launch("rmsnorm_forward", rmsnorm_forward_kernel<T, kPackElems<T>>, grid, block, 0, s, y, rrms, x, w, N, C, eps);
  else
    launch("rmsnorm_forward", rmsnorm_forward_kernel<T, 1>, grid, block, 0, s, y, rrms, x, w, N, C, eps);
}

template <class T>
void rmsnorm_backward(T* dx, float* dw, const T* dy, const T* x, const T* w, const float* rrms, float* scratch, int N,
                      int C, cudaStream_t s) {
  if (N == 0 || C == 0) return;
  const dim3 grid(ceil_div(N, kWarps)), block(32 * kWarps);
  if (packs_fit<T>(C, {dx, dy, x, w}))
    launch("rmsnorm_backward_dx", rmsnorm_backward_dx_kernel<T, kPackElems<T>>, grid, block, 0, s, dx, dy, x, w, rrms,
           N, C);
  else
    launch("rmsnorm_backward_dx", rmsnorm_backward_dx_kernel<T, 1>, grid, block, 0, s, dx, dy, x, w, rrms, N, C);
  colsum::add<1>("rmsnorm_backward_dw", colsum::Outs<1>{{dw}}, WeightTerm<T>{dy, x, rrms, C}, scratch, N, C, s);
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, int, int, cudaStream_t, float);
template void rmsnorm_forward<__nv_bfloat16>(__nv_bfloat16*, float*, const __nv_bfloat16*, const __nv_bfloat16*, int,
                                             int, cudaStream_t, float);
template void rmsnorm_backward<float>(float*, float*, const float*, const float*, const float*, const float*, float*,
                                      int, int, cudaStream_t);
template void rmsnorm_backward<__nv_bfloat16>(__nv_bfloat16*, float*, const __nv_bfloat16*, const __nv_bfloat16*,
                                              const __nv_bfloat16*, const float*, float*, int, int, cudaStream_t);

}  // namespace cuda
}  // namespace ul
