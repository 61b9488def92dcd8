// GELU on CUDA (the math is in gelu.h; the CPU loop it must match is in gelu.cpp).
// T is float or __nv_bfloat16; every value is computed in float and rounded to T once.
//
// forward, backward   grid-stride loops over 16-byte packs (V = 4 floats or 8 bf16 per access)
//                     when every pointer is 16-byte aligned, then a scalar loop over the last
//                     n % V elements; unaligned pointers take the scalar path (V = 1) throughout.
#include "engine/cuda_launch.h"
#include "layers/elementwise.cuh"
#include "layers/gelu.h"

namespace ul {
namespace cuda {
namespace {

constexpr float kScale = float(kGeluScale), kCubic = float(kGeluCubic);  // gelu.h

// 0.5 (1 + tanh(u)) = sigmoid(2 u), u = k (x + a x^3), as the CPU kernels compute it (gelu.cpp):
// one exp, and no cancellation in 1 + tanh(u) where tanh(u) is near -1 (x below about -4). For
// u < -44 __expf overflows to inf and the sigmoid is 0, its limit.
__device__ __forceinline__ float gelu_sigmoid(float x) {
  return 1.f / (1.f + __expf(-2.f * kScale * (x + kCubic * x * x * x)));
}

__device__ __forceinline__ float gelu(float x) { return x * gelu_sigmoid(x); }

// d gelu / dx with s = sigmoid(2 u) = 0.5 (1 + tanh(u)), so 1 - tanh(u)^2 = 4 s (1 - s):
//   0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 a x^2) = s + 2 x s (1 - s) k (1 + 3 a x^2)
__device__ __forceinline__ float gelu_grad(float x) {
  const float s = gelu_sigmoid(x);
  return s + 2.f * x * s * (1.f - s) * kScale * (1.f + 3.f * kCubic * x * x);
}

// y, x: (n)
template <class T, int V>
__global__ void gelu_forward_kernel(T* __restrict__ y, const T* __restrict__ x, int64_t n) {
  const int64_t packs = n / V;
  for (int64_t p = grid_first(); p < packs; p += grid_stride()) {
    const Pack<T, V> xv = load_pack<V>(x + p * V);
    Pack<T, V> yv;
    for (int k = 0; k < V; k++) yv.v[k] = from_float<T>(gelu(to_float(xv.v[k])));
    store_pack<V>(y + p * V, yv);
  }
  for (int64_t i = packs * V + grid_first(); i < n; i += grid_stride()) y[i] = from_float<T>(gelu(to_float(x[i])));
}

// dx += dy * gelu'(x), or with accumulate false dx = 0 + dy * gelu'(x) (what adding to a zeroed
// dx gives, -0 included) without reading dx.  dx, dy, x: (n)
template <class T, int V>
__global__ void gelu_backward_kernel(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ x, int64_t n,
                                     bool accumulate) {
  const int64_t packs = n / V;
  for (int64_t p = grid_first(); p < packs; p += grid_stride()) {
    const Pack<T, V> xv = load_pack<V>(x + p * V), dyv = load_pack<V>(dy + p * V);
    Pack<T, V> dxv;
    if (accumulate) dxv = load_pack<V>(dx + p * V);
    for (int k = 0; k < V; k++)
      dxv.v[k] = from_float<T>((accumulate ? to_float(dxv.v[k]) : 0.f) +
                               to_float(dyv.v[k]) * gelu_grad(to_float(xv.v[k])));
    store_pack<V>(dx + p * V, dxv);
  }
  for (int64_t i = packs * V + grid_first(); i < n; i += grid_stride())
    dx[i] = from_float<T>((accumulate ? to_float(dx[i]) : 0.f) + to_float(dy[i]) * gelu_grad(to_float(x[i])));
}

}  // namespace

template <class T>
void gelu_forward(T* y, const T* x, int64_t n, cudaStream_t s) {
  if (n == 0) return;  // a grid of no blocks is an invalid launch
  constexpr int V = kPackElems<T>;
  if (pack_aligned({y, x}))
    launch("gelu_forward", gelu_forward_kernel<T, V>, dim3(elementwise_blocks(n / V)), dim3(kElementwiseThreads), 0,
           s, y, x, n);
  else
    launch("gelu_forward", gelu_forward_kernel<T, 1>, dim3(elementwise_blocks(n)), dim3(kElementwiseThreads), 0, s,
           y, x, n);
}

template <class T>
void gelu_backward(T* dx, const T* dy, const T* x, int64_t n, cudaStream_t s, bool accumulate) {
  if (n == 0) return;
  constexpr int V = kPackElems<T>;
  if (pack_aligned({dx, dy, x}))
    launch("gelu_backward", gelu_backward_kernel<T, V>, dim3(elementwise_blocks(n / V)), dim3(kElementwiseThreads), 0,
           s, dx, dy, x, n, accumulate);
  else
    launch("gelu_backward", gelu_backward_kernel<T, 1>, dim3(elementwise_blocks(n)), dim3(kElementwiseThreads), 0, s,
           dx, dy, x, n, accumulate);
}

template void gelu_forward<float>(float*, const float*, int64_t, cudaStream_t);
template void gelu_forward<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, int64_t, cudaStream_t);
template void gelu_backward<float>(float*, const float*, const float*, int64_t, cudaStream_t, bool);
template void gelu_backward<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, int64_t,
                                           cudaStream_t, bool);

}  // namespace cuda
}  // namespace ul
