// LayerNorm on CUDA (the math is in layernorm.h; the CPU loop it must match is in layernorm.cpp).
// T is float or __nv_bfloat16; mean, rstd, every sum and the parameter gradients dw, db are float.
//
// forward      one warp per row: three passes over the row (mean, then variance of x - mean,
//              then y), warp_sum for the two reductions. Each lane takes packs of V columns,
//              (lane + 32 k) V ..., V = 8 bf16 or 4 floats (16-byte loads) when C % V == 0 and
//              the buffers are 16-byte aligned, else V = 1. The second and third passes re-read
//              the row, which is in L1 by then.
// backward dx  the same layout: per row, mean_c(g) and mean_c(g * xhat), then dx += ...
// backward dw, db   the column sums of dy * xhat and dy, in one pass and deterministic
//              (layers/column_sums.cuh). This reads x and dy a second time; what it buys is
//              bitwise-reproducible gradients.
#include "engine/cuda_launch.h"
#include "layers/column_sums.cuh"
#include "layers/elementwise.cuh"
#include "layers/scratch_sizes.h"
#include "layers/layernorm.h"

namespace ul {
namespace cuda {
namespace {

constexpr int kWarps = 8;           // rows per block in the row kernels (8 warps, 256 threads)

// y, x: (N, C); w, b: (C); mean, rstd: (N)
template <class T, int V>
__global__ void layernorm_forward_kernel(T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd,
                                         const T* __restrict__ x, const T* __restrict__ w,
                                         const T* __restrict__ b, int N, int C) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarps + threadIdx.x / 32;
  if (row >= N) return;  // whole warps leave together, so no lane is missing from a shuffle below
  const T* xr = x + size_t(row) * C;
  T* yr = y + size_t(row) * C;
  float xv[V];

  // The mean of x - x[0], then x[0] added back: a float sum of the row itself is off by ulps of its
  // offset times C, and every output by that error times rstd (rows near 1000 with spread 0.1: 1e-3,
  // where the CPU's double sums give 3e-4); shifted, the sum's error is the spread's.
  float first[1];
  load_floats<1>(xr, first);
  const float x0 = first[0];
  float sum = 0.f;
  for (int c = lane * V; c < C; c += 32 * V) {
    load_floats<V>(xr + c, xv);
    for (int k = 0; k < V; k++) sum += xv[k] - x0;
  }
  const float shifted = warp_sum(sum);  // every lane's: the branch below is the warp's
  float m = x0 + shifted / C;
  // Spreads past ~3e38 / C overflow that float sum (a row of +-1e36: the mean -inf, the row NaN
  // where the CPU's double sums normalise it; lanes overflowing to both signs add up to NaN):
  // summed again in double there, as the variance is (a row holding NaN or inf stays so).
  if (!isfinite(shifted)) {
    double wide = 0;
    for (int c = lane * V; c < C; c += 32 * V) {
      load_floats<V>(xr + c, xv);
      for (int k = 0; k < V; k++) wide += double(xv[k]) - double(x0);
    }
    m = float(double(x0) + warp_sum(wide) / C);
  }
  float var = 0.f;
  for (int c = lane * V; c < C; c += 32 * V) {
    load_floats<V>(xr + c, xv);
    for (int k = 0; k < V; k++) var += (xv[k] - m) * (xv[k] - m);
  }
  var = warp_sum(var);  // every lane's: the branch below is the warp's
  float s = rsqrtf(var / C + float(kLayerNormEps));
  // A row spread past ~1.8e19 / sqrt(C) overflows the float sum: s would be 0, the row's output
  // its bias and its gradients 0 (a run blowing up would go on). Summed again in double there, as
  // the CPU op sums (the usual rows keep their bits; NaN stays NaN).
  if (isinf(var)) {
    double wide = 0;
    for (int c = lane * V; c < C; c += 32 * V) {
      load_floats<V>(xr + c, xv);
      for (int k = 0; k < V; k++) wide += (double(xv[k]) - m) * (double(xv[k]) - m);
    }
    s = float(1.0 / sqrt(warp_sum(wide) / C + kLayerNormEps));
  }
  for (int c = lane * V; c < C; c += 32 * V) {
    float wv[V], bv[V], yv[V];
    load_floats<V>(xr + c, xv);
    load_floats<V>(w + c, wv);
    load_floats<V>(b + c, bv);
    for (int k = 0; k < V; k++) yv[k] = (xv[k] - m) * s * wv[k] + bv[k];
    store_floats<V>(yr + c, yv);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// dx += rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)),  g = dy * w.  dx, dy, x: (N, C)
template <class T, int V>
__global__ void layernorm_backward_dx_kernel(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ x,
                                             const T* __restrict__ w, const float* __restrict__ mean,
                                             const float* __restrict__ rstd, int N, int C) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarps + threadIdx.x / 32;
  if (row >= N) return;
  const size_t off = size_t(row) * C;
  const float m = mean[row], s = rstd[row];
  float dyv[V], xv[V], wv[V];

  float g_sum = 0.f, gx_sum = 0.f;
  for (int c = lane * V; c < C; c += 32 * V) {
    load_floats<V>(dy + off + c, dyv);
    load_floats<V>(x + off + c, xv);
    load_floats<V>(w + c, wv);
    for (int k = 0; k < V; k++) {
      const float g = dyv[k] * wv[k];
      g_sum += g;
      gx_sum += g * (xv[k] - m) * s;
    }
  }
  const float g_mean = warp_sum(g_sum) / C, gx_mean = warp_sum(gx_sum) / C;
  for (int c = lane * V; c < C; c += 32 * V) {
    float dxv[V];
    load_floats<V>(dy + off + c, dyv);
    load_floats<V>(x + off + c, xv);
    load_floats<V>(w + c, wv);
    load_floats<V>(dx + off + c, dxv);
    for (int k = 0; k < V; k++) {
      const float g = dyv[k] * wv[k];
      const float xhat = (xv[k] - m) * s;
      dxv[k] += s * (g - g_mean - xhat * gx_mean);
    }
    store_floats<V>(dx + off + c, dxv);
  }
}

// One row's contributions to dw and db: dy * xhat and dy (a colsum Term, column_sums.cuh).
template <class T>
struct WeightBiasTerm {
  using Elem = T;
  const T *dy, *x;
  const float *mean, *rstd;
  int C;
  bool aligned() const { return pack_aligned({dy, x}); }
  template <int V>
  __device__ void operator()(int n, int c, float (&acc)[2][V]) const {
    float g[V], xv[V];
    load_floats<V>(dy + size_t(n) * C + c, g);
    load_floats<V>(x + size_t(n) * C + c, xv);
    const float m = mean[n], s = rstd[n];
    for (int v = 0; v < V; v++) {
      acc[0][v] += g[v] * (xv[v] - m) * s;
      acc[1][v] += g[v];
    }
  }
};

}  // namespace

size_t layernorm_backward_scratch_bytes(int N, int C) { return scratch::layernorm_backward(N, C); }

template <class T>
void layernorm_forward(T* y, float* mean, float* rstd, const T* x, const T* w, const T* b, int N, int C,
                       cudaStream_t s) {
  if (N == 0 || C == 0) return;  // a grid of no blocks is an invalid launch
  const dim3 grid(ceil_div(N, kWarps)), block(32 * kWarps);
  if (packs_fit<T>(C, {y, x, w, b}))
    launch("layernorm_forward", layernorm_forward_kernel<T, kPackElems<T>>, grid, block, 0, s, y, mean, rstd, x, w, b,
           N, C);
  else
    launch("layernorm_forward", layernorm_forward_kernel<T, 1>, grid, block, 0, s, y, mean, rstd, x, w, b, N, C);
}

template <class T>
void layernorm_backward(T* dx, float* dw, float* db, const T* dy, const T* x, const T* w, const float* mean,
                        const float* rstd, float* scratch, int N, int C, cudaStream_t s) {
  if (N == 0 || C == 0) return;
  const dim3 grid(ceil_div(N, kWarps)), block(32 * kWarps);
  if (packs_fit<T>(C, {dx, dy, x, w}))
    launch("layernorm_backward_dx", layernorm_backward_dx_kernel<T, kPackElems<T>>, grid, block, 0, s, dx, dy, x, w,
           mean, rstd, N, C);
  else
    launch("layernorm_backward_dx", layernorm_backward_dx_kernel<T, 1>, grid, block, 0, s, dx, dy, x, w, mean, rstd,
           N, C);
  colsum::add<2>("layernorm_backward_dw_db", colsum::Outs<2>{{dw, db}}, WeightBiasTerm<T>{dy, x, mean, rstd, C},
                 scratch, N, C, s);
}

template void layernorm_forward<float>(float*, float*, float*, const float*, const float*, const float*, int, int,
                                       cudaStream_t);
template void layernorm_forward<__nv_bfloat16>(__nv_bfloat16*, float*, float*, const __nv_bfloat16*,
                                               const __nv_bfloat16*, const __nv_bfloat16*, int, int, cudaStream_t);
template void layernorm_backward<float>(float*, float*, float*, const float*, const float*, const float*,
                                        const float*, const float*, float*, int, int, cudaStream_t);
template void layernorm_backward<__nv_bfloat16>(__nv_bfloat16*, float*, float*, const __nv_bfloat16*,
                                                const __nv_bfloat16*, const __nv_bfloat16*, const float*, const float*,
                                                float*, int, int, cudaStream_t);

}  // namespace cuda
}  // namespace ul
